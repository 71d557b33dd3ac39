// Package tracing sets up intentd's OpenTelemetry tracing: a span per gRPC
// call (otelgrpc's server stats handler, W3C trace context from the
// caller) around the store's spans per etcd transaction, exported over
// OTLP/gRPC when an endpoint is configured. Without one nothing is set up:
// no exporter, no stats handler, no tracer in the store: the default path
// pays for one nil check per etcd call.
//
// Spans never carry request or response messages (params, results,
// statements): otelgrpc records the method and status code, the store
// records a hash of the intent key, the transaction's outcome, the state
// written, the fencing token and the try number.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime/debug"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// Config says where spans go.
type Config struct {
	// Endpoint is the OTLP/gRPC collector's URL: http://host:4317 for
	// plaintext, https://host:4317 for TLS. Empty: tracing is off, unless
	// Provider is set.
	Endpoint string
	// SampleRatio is the share of traces started here that are recorded
	// (0 to 1); a call whose caller sent a sampled trace context is
	// recorded whatever the ratio, one sent unsampled is not.
	SampleRatio float64
	// ServiceVersion is reported as service.version; empty: the main
	// module's version from the build info.
	ServiceVersion string
	// Provider, when set, receives the spans instead of an OTLP exporter
	// (a program that embeds intentd and has its own, or a test).
	Provider trace.TracerProvider
	// ServiceName is reported as service.name; empty: intentd.
	ServiceName string
}

// ParseEndpoint checks an OTLP endpoint URL: http or https, with a host.
func ParseEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return err
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an http:// (plaintext) or https:// (TLS) URL, such as http://127.0.0.1:4317")
	case u.Host == "":
		return errors.New("the URL names no host")
	}
	return nil
}

// Tracing is intentd's tracer provider and propagator, and how to flush
// them at shutdown.
type Tracing struct {
	provider trace.TracerProvider
	shutdown func(context.Context) error
}

// Start sets up tracing as cfg asks. It does not wait for the collector: an
// unreachable one costs dropped spans, never a failed start. Nothing is
// installed globally.
func Start(ctx context.Context, cfg Config) (*Tracing, error) {
	if cfg.Provider != nil {
		return &Tracing{provider: cfg.Provider, shutdown: func(context.Context) error { return nil }}, nil
	}
	if cfg.Endpoint == "" {
		return &Tracing{}, nil
	}
	if err := ParseEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("tracing: endpoint %q: %w", cfg.Endpoint, err)
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", cfg.Endpoint, err)
	}
	version := cfg.ServiceVersion
	if bi, ok := debug.ReadBuildInfo(); ok && version == "" {
		version = bi.Main.Version
	}
	name := cfg.ServiceName
	if name == "" {
		name = "intentd"
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", name),
		attribute.String("service.version", version),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	return &Tracing{provider: tp, shutdown: tp.Shutdown}, nil
}

// Enabled reports whether spans go anywhere.
func (t *Tracing) Enabled() bool { return t.provider != nil }

// Provider is the tracer provider for the store; nil when off, which the
// store reads as "start no spans".
func (t *Tracing) Provider() trace.TracerProvider { return t.provider }

// ServerOptions instrument a gRPC server: a server span per call, the
// child of the caller's span when it sent W3C trace context. Health checks
// and reflection get none (probes would drown the calls that matter).
// Off: none at all.
func (t *Tracing) ServerOptions() []grpc.ServerOption {
	if !t.Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.provider),
		otelgrpc.WithPropagators(propagation.TraceContext{}),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()), // metrics are Prometheus's
		otelgrpc.WithFilter(filters.Not(filters.Any(filters.HealthCheck(), filters.ServicePrefix("grpc.reflection.")))),
	))}
}

// Shutdown flushes the spans not exported yet, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}
