package etcdstore

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// BenchmarkUntracedSpan is what the store's spans cost a write when tracing
// is off (the default), and with a no-op tracer provider given.
//
//	go test -run '^$' -bench UntracedSpan ./etcdstore
func BenchmarkUntracedSpan(b *testing.B) {
	d := &machine.Decision{Next: &machine.Record{State: intent.StateInProgress, Lease: &machine.Lease{}}}
	res := outcome{succeeded: true, rev: 7}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"off", nil}, {"noop-provider", noop.NewTracerProvider()}} {
		b.Run(tc.name, func(b *testing.B) {
			s := &Store{tracer: newTracer(tc.tp)}
			for b.Loop() {
				_, span := s.startSpan(ctx, "etcd txn", "default", "order-1")
				endCommit(span, 0, d, res, verdict{})
			}
		})
	}
}
