package etcdstore

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/core/traceattr"
)

// tracerName is the instrumentation scope of the store's spans.
const tracerName = "github.com/intentd/intentd/etcdstore"

// newTracer returns the configured tracer, or nil for none.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(tracerName)
}

// untraced is the span of every etcd call when tracing is off: a no-op
// that costs no allocation.
var untraced = trace.SpanFromContext(context.Background())

// clientSpan starts a span as the client of etcd.
var clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// startSpan starts a client span for one etcd call about one intent. The
// key is hashed only when the span records; without a tracer (the
// default) nothing is started at all.
func (s *Store) startSpan(ctx context.Context, name, tenant, key string) (context.Context, trace.Span) {
	if s.tracer == nil {
		return ctx, untraced
	}
	ctx, span := s.tracer.Start(ctx, name, clientSpan...)
	if span.IsRecording() {
		span.SetAttributes(traceattr.KeyHash.String(intent.KeyHash(tenant, key)))
	}
	return ctx, span
}

// endRead ends the span of a read.
func endRead(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, "etcd read failed")
	}
	span.End()
}

// endCommit ends the span of a write of d, labelling its outcome by e,
// its error classed as transition acts on it. Error texts are not
// recorded: they may quote keys.
func endCommit(span trace.Span, attempt int, d *machine.Decision, res outcome, e verdict) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(traceattr.TxnAttempt.Int(attempt))
	switch {
	case e.class == succeeded && res.succeeded:
		span.SetAttributes(traceattr.TxnOutcome.String("committed"))
		if d.Next == nil {
			return // a removal
		}
		span.SetAttributes(traceattr.State.String(d.Next.State.String()))
		if l := d.Next.Lease; l != nil {
			token := l.Token
			if token == 0 { // issued by this write (see machine.Record.Materialize)
				token = machine.TokenAt(res.rev, l.Slot)
			}
			span.SetAttributes(traceattr.Token.Int64(int64(token)))
		}
	case e.class == succeeded:
		span.SetAttributes(traceattr.TxnOutcome.String("conflict"))
	case e.full:
		// Applied or not: transition reads back, and refuses what still
		// needs a write.
		span.SetAttributes(traceattr.TxnOutcome.String("no_space"))
		span.SetStatus(codes.Error, "etcd backend quota exhausted")
	case e.class == readBack:
		span.SetAttributes(traceattr.TxnOutcome.String("ambiguous"))
		span.SetStatus(codes.Error, "etcd write outcome unknown")
	default:
		// Nothing to read back: refused, or turned away unproposed.
		span.SetAttributes(traceattr.TxnOutcome.String("refused"))
		span.SetStatus(codes.Error, "etcd refused the write")
	}
}
