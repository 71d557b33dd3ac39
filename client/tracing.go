package client

import (
	"context"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/traceattr"
)

// tracerName is the instrumentation scope of Run's spans.
const tracerName = "github.com/intentd/intentd/client"

// Tracing returns a dial option that starts a client span per call on the
// connection and sends its W3C trace context (the traceparent header) to
// intentd, so that intentd's spans of the call join the caller's trace.
// Pass it to grpc.NewClient beside the credentials.
//
// tp receives the spans; nil uses OpenTelemetry's global provider, which
// records nothing unless the program installed one. The trace context is
// always sent in W3C form, whatever global propagator is set or not. This
// package installs nothing globally, and without this option the client
// does no tracing at all. Spans carry the method and the status (with a
// failed call's status message, as otelgrpc records it), never a request's
// or a response's content.
func Tracing(tp trace.TracerProvider) grpc.DialOption {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithPropagators(propagation.TraceContext{}),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
	))
}

// startRun starts Run's span when the client has a tracer.
func (c *Client) startRun(ctx context.Context, tenant, key string) (context.Context, trace.Span) {
	if c.opts.tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op
	}
	if tenant == "" {
		tenant = intent.DefaultTenant
	}
	return c.opts.tracer.Start(ctx, "intentd Run", trace.WithAttributes(traceattr.KeyHash.String(intent.KeyHash(tenant, key))))
}

// endRun ends Run's span with what Run answered. Error texts are not
// recorded: the task's own may carry anything.
func endRun(span trace.Span, out *Outcome, err error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, "run failed")
	}
	if out != nil {
		span.SetAttributes(traceattr.Outcome.String(strings.TrimPrefix(out.Outcome.String(), "OUTCOME_")), traceattr.Executed.Bool(out.Executed))
	}
}
