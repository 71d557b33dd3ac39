package daemon_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/traceattr"
)

// TestTracingFollowsAcquireToEtcd runs one Acquire → Complete from a
// client dialled with client.Tracing against an intentd with tracing on,
// and checks the trace: the client span of each call is the parent of
// intentd's server span (the W3C trace context crossed the wire), which is
// the parent of the etcd transaction spans, and these carry the hashed
// key, outcome, state, token and try. Neither the key nor anything of the
// params or the result appears in any span.
func TestTracingFollowsAcquireToEtcd(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	// Two providers, as in two processes: only the wire links them.
	serverTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	clientTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	cfg := testConfig(t.TempDir())
	cfg.Tracing.Provider = serverTP
	in := start(t, cfg)

	conn, err := grpc.NewClient(in.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), client.Tracing(clientTP))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := intentv1.NewIntentServiceClient(conn)

	const (
		key         = "order-for-jane.doe@example.com" // a caller's key may carry personal data
		paramSecret = "42 Secret Street"
		resultRef   = "SO-SECRET-77"
	)
	p, err := structpb.NewStruct(map[string]any{"item": "desk lamp", "address": paramSecret})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w1", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	acq, err := c.Acquire(call(t), &intentv1.AcquireRequest{
		Key: key, SessionId: sess.GetSessionId(), RequestId: "r1",
		Register: &intentv1.RegisterRequest{Key: key, Params: p},
	})
	if err != nil {
		t.Fatal(err)
	}
	token := int64(acq.GetLease().GetToken())
	if _, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: key, Token: acq.GetLease().GetToken(),
		Result: &intentv1.Result{Payload: []byte(resultRef), ExternalRefs: map[string]string{"supplier_order_id": resultRef}}}); err != nil {
		t.Fatal(err)
	}

	const acquire, complete = "intent.v1.IntentService/Acquire", "intent.v1.IntentService/Complete"
	// A server span ends just after its response is sent: wait for both.
	ended := func() []sdktrace.ReadOnlySpan { return spans.Ended() }
	deadline := time.Now().Add(10 * time.Second)
	for countKind(ended(), complete, trace.SpanKindServer) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	all := ended()

	hash := intent.KeyHash(intent.DefaultTenant, key)
	for _, tt := range []struct {
		method string
		state  string
		server map[attribute.Key]attribute.Value // beyond otelgrpc's
	}{
		{acquire, intent.StateInProgress.String(), map[attribute.Key]attribute.Value{
			traceattr.KeyHash: attribute.StringValue(hash),
			traceattr.Outcome: attribute.StringValue("EXECUTE"),
			traceattr.Token:   attribute.Int64Value(token),
		}},
		{complete, intent.StateCompleted.String(), nil},
	} {
		t.Run(tt.method, func(t *testing.T) {
			cs := only(t, all, tt.method, trace.SpanKindClient)
			ss := only(t, all, tt.method, trace.SpanKindServer)
			if ss.Parent().SpanID() != cs.SpanContext().SpanID() || ss.SpanContext().TraceID() != cs.SpanContext().TraceID() {
				t.Errorf("server span's parent is %v in trace %v, want the client span %v in trace %v",
					ss.Parent().SpanID(), ss.SpanContext().TraceID(), cs.SpanContext().SpanID(), cs.SpanContext().TraceID())
			}
			checkAttrs(t, ss, tt.server)
			var txn sdktrace.ReadOnlySpan
			for _, s := range all {
				if s.Name() == "etcd txn" && s.Parent().SpanID() == ss.SpanContext().SpanID() {
					txn = s
				}
			}
			if txn == nil {
				t.Fatalf("no etcd txn span under the server span of %s; spans: %v", tt.method, names(all))
			}
			checkAttrs(t, txn, map[attribute.Key]attribute.Value{
				traceattr.KeyHash:    attribute.StringValue(hash),
				traceattr.TxnOutcome: attribute.StringValue("committed"),
				traceattr.TxnAttempt: attribute.IntValue(0),
				traceattr.State:      attribute.StringValue(tt.state),
				traceattr.Token:      attribute.Int64Value(token),
			})
		})
	}

	// A replay is answered from memory: its server span says COMPLETED, and
	// has no etcd span under it.
	first := only(t, all, acquire, trace.SpanKindServer)
	if _, err := c.Acquire(call(t), &intentv1.AcquireRequest{Key: key, SessionId: sess.GetSessionId(), RequestId: "r2"}); err != nil {
		t.Fatal(err)
	}
	for countKind(ended(), acquire, trace.SpanKindServer) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	all = ended()
	var replay sdktrace.ReadOnlySpan
	for _, s := range all {
		if s.Name() == acquire && s.SpanKind() == trace.SpanKindServer && s.SpanContext().SpanID() != first.SpanContext().SpanID() {
			replay = s
		}
	}
	if replay == nil {
		t.Fatalf("no server span of the replayed Acquire; spans: %v", names(all))
	}
	checkAttrs(t, replay, map[attribute.Key]attribute.Value{
		traceattr.KeyHash: attribute.StringValue(hash),
		traceattr.Outcome: attribute.StringValue("COMPLETED"),
	})
	for _, s := range all {
		if s.Parent().SpanID() == replay.SpanContext().SpanID() {
			t.Errorf("replay from memory has a child span %q", s.Name())
		}
	}

	for _, s := range all {
		for _, text := range spanTexts(s) {
			for _, secret := range []string{key, paramSecret, resultRef} {
				if strings.Contains(text, secret) {
					t.Errorf("span %q records %q: %s", s.Name(), secret, text)
				}
			}
		}
	}
}

// spanTexts is everything a span would export as text: name, attributes,
// events and their attributes, status.
func spanTexts(s sdktrace.ReadOnlySpan) []string {
	texts := []string{s.Name(), s.Status().Description}
	for _, a := range s.Attributes() {
		texts = append(texts, fmt.Sprintf("%s=%s", a.Key, a.Value.Emit()))
	}
	for _, e := range s.Events() {
		texts = append(texts, e.Name)
		for _, a := range e.Attributes {
			texts = append(texts, fmt.Sprintf("%s=%s", a.Key, a.Value.Emit()))
		}
	}
	for _, a := range s.Resource().Attributes() {
		texts = append(texts, fmt.Sprintf("%s=%s", a.Key, a.Value.Emit()))
	}
	return texts
}

// checkAttrs checks that span has each of want's attributes with its value.
func checkAttrs(t *testing.T, span sdktrace.ReadOnlySpan, want map[attribute.Key]attribute.Value) {
	t.Helper()
	got := map[attribute.Key]attribute.Value{}
	for _, a := range span.Attributes() {
		got[a.Key] = a.Value
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%v span %s: %s = %v, want %v", span.SpanKind(), span.Name(), k, got[k].Emit(), w.Emit())
		}
	}
}

func countKind(spans []sdktrace.ReadOnlySpan, name string, kind trace.SpanKind) int {
	n := 0
	for _, s := range spans {
		if s.Name() == name && s.SpanKind() == kind {
			n++
		}
	}
	return n
}

func only(t *testing.T, spans []sdktrace.ReadOnlySpan, name string, kind trace.SpanKind) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name && s.SpanKind() == kind {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %v spans named %s, want 1; spans: %v", len(found), kind, name, names(spans))
	}
	return found[0]
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var n []string
	for _, s := range spans {
		n = append(n, s.SpanKind().String()+" "+s.Name())
	}
	return n
}

// collector is an OTLP/gRPC trace collector in-process: it keeps what it
// is sent.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string]string // span name → service.name of its resource
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans[s.GetName()] = service
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestOTLPEndpointReceivesSpans starts intentd with --otlp-endpoint at a
// collector on loopback, makes one Acquire, and stops intentd: the spans
// not exported yet are flushed at shutdown, so the collector then holds the
// call's server span and its etcd transaction, from service intentd.
func TestOTLPEndpointReceivesSpans(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{spans: map[string]string{}}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, col)
	go func() { _ = srv.Serve(lis) }() // exits at srv.Stop
	defer srv.Stop()

	cfg := testConfig(t.TempDir())
	cfg.Tracing.Endpoint = "http://" + lis.Addr().String()
	in := start(t, cfg)
	if _, err := healthpb.NewHealthClient(in.conn).Check(call(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	c := intentv1.NewIntentServiceClient(in.conn)
	sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(call(t), &intentv1.AcquireRequest{
		Key: "k1", SessionId: sess.GetSessionId(), RequestId: "r1",
		Register: &intentv1.RegisterRequest{Key: "k1", Params: params(t, 1)},
	}); err != nil {
		t.Fatal(err)
	}
	in.shutdown(t)

	col.mu.Lock()
	defer col.mu.Unlock()
	for _, name := range []string{"intent.v1.IntentService/Acquire", "etcd txn"} {
		if got, ok := col.spans[name]; !ok || got != "intentd" {
			t.Errorf("collector: span %q from service %q (received: %v), want it from intentd", name, got, ok)
		}
	}
	if _, ok := col.spans["grpc.health.v1.Health/Check"]; ok {
		t.Error("collector received a health check span: probes would drown the calls")
	}
}

// TestHandMadeTraceparentJoinsTheTrace: a client without OpenTelemetry
// (the Python and TypeScript examples) joins a trace by sending a W3C
// traceparent as gRPC metadata; intentd's server span is then in that
// trace, under the span it names.
func TestHandMadeTraceparentJoinsTheTrace(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	cfg := testConfig(t.TempDir())
	cfg.Tracing.Provider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	in := start(t, cfg)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := metadata.AppendToOutgoingContext(call(t), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := intentv1.NewIntentServiceClient(in.conn).DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: "buy-item", Identity: params(t, 1)}); err != nil {
		t.Fatal(err)
	}
	const name = "intent.v1.IntentService/DeriveKey"
	deadline := time.Now().Add(10 * time.Second)
	for countKind(spans.Ended(), name, trace.SpanKindServer) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	s := only(t, spans.Ended(), name, trace.SpanKindServer)
	if got := s.SpanContext().TraceID().String(); got != traceID {
		t.Errorf("server span in trace %s, want %s", got, traceID)
	}
	if got := s.Parent().SpanID().String(); got != parentID || !s.Parent().IsRemote() {
		t.Errorf("server span's parent %s (remote %v), want the caller's %s", got, s.Parent().IsRemote(), parentID)
	}
}

// TestRunIsOneTrace: with client.WithTracerProvider, Session.Run starts a
// span of its own; its Acquire and Complete (on a conn dialled with
// client.Tracing) are its children, and so are the spans the task's
// Execute starts from the context it gets.
func TestRunIsOneTrace(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	serverTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	clientTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	cfg := testConfig(t.TempDir())
	cfg.Tracing.Provider = serverTP
	in := start(t, cfg)
	conn, err := grpc.NewClient(in.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), client.Tracing(clientTP))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := client.New(conn, client.WithTracerProvider(clientTP))
	const key = "run-1"
	if _, err := c.Register(call(t), &intentv1.RegisterRequest{Key: key, Params: params(t, 1)}); err != nil {
		t.Fatal(err)
	}
	sess, err := c.OpenSession(call(t), "w1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(call(t))
	out, err := sess.Run(call(t), client.Task{Key: key, Execute: func(ctx context.Context, _ *client.Attempt) (*intentv1.Result, error) {
		_, span := clientTP.Tracer("merchant").Start(ctx, "create order")
		span.End()
		return &intentv1.Result{Payload: []byte("SO-1")}, nil
	}})
	if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
		t.Fatalf("Run = %v, %v; want COMPLETED", out, err)
	}
	all := spans.Ended()
	run := only(t, all, "intentd Run", trace.SpanKindInternal)
	if run.Parent().IsValid() {
		t.Errorf("Run's span has parent %v, want a root", run.Parent().SpanID())
	}
	checkAttrs(t, run, map[attribute.Key]attribute.Value{
		traceattr.KeyHash:  attribute.StringValue(intent.KeyHash(intent.DefaultTenant, key)),
		traceattr.Outcome:  attribute.StringValue("COMPLETED"),
		traceattr.Executed: attribute.BoolValue(true),
	})
	for _, child := range []struct {
		name string
		kind trace.SpanKind
	}{
		{"intent.v1.IntentService/Acquire", trace.SpanKindClient},
		{"create order", trace.SpanKindInternal},
		{"intent.v1.IntentService/Complete", trace.SpanKindClient},
	} {
		s := only(t, all, child.name, child.kind)
		if s.Parent().SpanID() != run.SpanContext().SpanID() || s.SpanContext().TraceID() != run.SpanContext().TraceID() {
			t.Errorf("%s: parent %v in trace %v, want Run's span %v in trace %v",
				child.name, s.Parent().SpanID(), s.SpanContext().TraceID(), run.SpanContext().SpanID(), run.SpanContext().TraceID())
		}
	}
}
