package client

import (
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// Tracing returns a dial option that starts a client span per call on the
// connection and sends its W3C trace context (the traceparent header) to
// intentd, so that intentd's spans of the call join the caller's trace.
// Pass it to grpc.NewClient beside the credentials.
//
// tp receives the spans; nil uses OpenTelemetry's global provider, which
// records nothing unless the program installed one. The trace context is
// always sent in W3C form, whatever global propagator is set or not. This
// package installs nothing globally, and without this option the client
// does no tracing at all. Spans carry the method and status code, never a
// message's content.
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
