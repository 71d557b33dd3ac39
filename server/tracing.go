package server

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/traceattr"
)

// traceAcquire puts what an Acquire answered on the call's span, when it
// records: a replay from memory has no etcd span under it, so this is the
// only place a trace shows it.
func traceAcquire(ctx context.Context, tenant, key string, a *intent.Acquisition) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(traceattr.KeyHash.String(intent.KeyHash(tenant, key)), traceattr.Outcome.String(a.Outcome.String()))
	if a.Lease != nil {
		span.SetAttributes(traceattr.Token.Int64(int64(a.Lease.Token)))
	}
}
