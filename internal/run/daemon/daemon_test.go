package daemon_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// instance is one intentd run in-process, with a plaintext connection.
type instance struct {
	*intentdtest.Intentd
	addr string
	conn *grpc.ClientConn
}

func testConfig(dataDir string) daemon.Config {
	cfg := intentdtest.Config(dataDir)
	cfg.HealthInterval = 100 * time.Millisecond
	return cfg
}

func start(t testing.TB, cfg daemon.Config) *instance {
	t.Helper()
	in := intentdtest.Start(t, cfg, slog.New(slog.DiscardHandler))
	return &instance{Intentd: in, addr: in.Addr, conn: in.Dial(t)}
}

// shutdown stops intentd as SIGTERM does and waits for Run to return.
func (in *instance) shutdown(t testing.TB) {
	t.Helper()
	_ = in.conn.Close()
	if err := in.Stop(); err != nil {
		t.Errorf("intentd exited with %v, want a clean stop", err)
	}
}

func call(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func params(t testing.TB, quantity float64) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(map[string]any{"item": "desk lamp", "quantity": quantity})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Restart intentd on the same data directory: every acknowledged state is
// still there, and tokens keep increasing.
func TestRestartKeepsStateAndTokensIncrease(t *testing.T) {
	dir := t.TempDir()
	first := start(t, testConfig(dir))
	c := intentv1.NewIntentServiceClient(first.conn)

	sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w1", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var lastToken uint64
	acq := func(c intentv1.IntentServiceClient, key, session, req string) *intentv1.AcquireResponse {
		t.Helper()
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{
			Key: key, SessionId: session, RequestId: req,
			Register: &intentv1.RegisterRequest{Key: key, Params: params(t, 1)},
		})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", key, err)
		}
		return a
	}
	done := acq(c, "done-1", sess.GetSessionId(), "r1")
	result := &intentv1.Result{Payload: []byte("order SO-1"), ExternalRefs: map[string]string{"supplier_order_id": "SO-1"}}
	if _, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: "done-1", Token: done.GetLease().GetToken(), Result: result}); err != nil {
		t.Fatal(err)
	}
	unknown := acq(c, "unknown-1", sess.GetSessionId(), "r2")
	if _, err := c.MarkUnknown(call(t), &intentv1.MarkUnknownRequest{Key: "unknown-1", Token: unknown.GetLease().GetToken(), Reason: "timeout"}); err != nil {
		t.Fatal(err)
	}
	held := acq(c, "held-1", sess.GetSessionId(), "r3")
	lastToken = held.GetLease().GetToken()
	first.shutdown(t)

	second := start(t, testConfig(dir))
	c = intentv1.NewIntentServiceClient(second.conn)
	for key, want := range map[string]intentv1.State{
		"done-1":    intentv1.State_STATE_COMPLETED,
		"unknown-1": intentv1.State_STATE_UNKNOWN,
		"held-1":    intentv1.State_STATE_IN_PROGRESS, // the session's etcd lease survived the restart
	} {
		got, err := c.Get(call(t), &intentv1.GetRequest{Key: key})
		if err != nil {
			t.Fatalf("Get(%s) after restart: %v", key, err)
		}
		if got.GetIntent().GetState() != want {
			t.Errorf("%s after restart: %v, want %v", key, got.GetIntent().GetState(), want)
		}
	}
	sess2, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w2"})
	if err != nil {
		t.Fatal(err)
	}
	replay := acq(c, "done-1", sess2.GetSessionId(), "r4")
	if replay.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED || string(replay.GetIntent().GetResult().GetPayload()) != "order SO-1" {
		t.Fatalf("replay after restart: %v %q, want COMPLETED %q", replay.GetOutcome(), replay.GetIntent().GetResult().GetPayload(), "order SO-1")
	}
	rec := acq(c, "unknown-1", sess2.GetSessionId(), "r5")
	if rec.GetOutcome() != intentv1.Outcome_OUTCOME_RECONCILE || rec.GetLease().GetToken() <= lastToken {
		t.Fatalf("after restart: %v token %d, want RECONCILE with a token > %d", rec.GetOutcome(), rec.GetLease().GetToken(), lastToken)
	}
	fresh := acq(c, "new-1", sess2.GetSessionId(), "r6")
	if fresh.GetLease().GetToken() <= rec.GetLease().GetToken() {
		t.Fatalf("token %d, want > %d", fresh.GetLease().GetToken(), rec.GetLease().GetToken())
	}
}

// Health says SERVING while etcd answers, reflection is on, and shutdown
// turns health NOT_SERVING before the listener closes.
func TestHealthAndReflection(t *testing.T) {
	in := start(t, testConfig(t.TempDir()))
	h := healthpb.NewHealthClient(in.conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := h.Check(call(t), &healthpb.HealthCheckRequest{Service: intentv1.IntentService_ServiceDesc.ServiceName})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health: %v %v, want SERVING", resp.GetStatus(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	watch, err := h.Watch(call(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health watch: %v %v, want SERVING", first.GetStatus(), err)
	}
	in.Shutdown()
	// The watcher must hear NOT_SERVING before the connection goes.
	got, err := watch.Recv()
	if err != nil || got.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("during shutdown: %v %v, want NOT_SERVING", got.GetStatus(), err)
	}
	if err := in.Stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*daemon.Config)
		wantErr string // substring; empty means valid
	}{
		{"defaults", func(*daemon.Config) {}, ""},
		{"external etcd needs a data dir too (revision floor)", func(c *daemon.Config) { c.EtcdEndpoints = []string{"http://10.0.0.1:2379"}; c.DataDir = "" }, "--data-dir"},
		{"bad listen", func(c *daemon.Config) { c.Listen = "7650" }, "--listen"},
		{"embedded without data dir", func(c *daemon.Config) { c.DataDir = "" }, "--data-dir"},
		{"embed url not http", func(c *daemon.Config) { c.EmbedClientURL = "unix:///x" }, "--embed-client-url"},
		{"empty endpoint", func(c *daemon.Config) { c.EtcdEndpoints = []string{"http://a:2379", " "} }, "--etcd-endpoints"},
		{"prefix without slash", func(c *daemon.Config) { c.Store.Prefix = "/intentd" }, "--prefix"},
		{"operation shorter than request", func(c *daemon.Config) { c.Store.OperationTimeout = time.Second }, "--operation-timeout 1s: must be at least --request-timeout 3s"},
		{"zero shutdown", func(c *daemon.Config) { c.ShutdownTimeout = 0 }, "--shutdown-timeout"},
		{"keepalive faster than gRPC allows", func(c *daemon.Config) { c.EtcdKeepAliveTime = 5 * time.Second }, "--etcd-keepalive-time 5s: must be at least 10s"},
		{"zero keepalive timeout", func(c *daemon.Config) { c.EtcdKeepAliveTimeout = 0 }, "--etcd-keepalive-timeout"},
		{"zero probe interval", func(c *daemon.Config) { c.EtcdProbeInterval = 0 }, "--etcd-probe-interval"},
		{"probe slower than a call", func(c *daemon.Config) {
			c.EtcdEndpoints = []string{"http://a:2379", "http://b:2379"}
			c.EtcdProbeTimeout = 3 * time.Second
		}, "--etcd-probe-timeout 3s: must be below --request-timeout 3s"},
		{"probe timeout unused with one endpoint", func(c *daemon.Config) { c.Store.RequestTimeout = 200 * time.Millisecond }, ""},
		{"pprof on loopback", func(c *daemon.Config) { c.PprofListen = "127.0.0.1:7652" }, ""},
		{"pprof on localhost", func(c *daemon.Config) { c.PprofListen = "localhost:0" }, ""},
		{"pprof on every interface", func(c *daemon.Config) { c.PprofListen = ":7652" }, `--pprof-listen ":7652": want a loopback host:port`},
		{"pprof on a routable address", func(c *daemon.Config) { c.PprofListen = "10.0.0.1:7652" }, `--pprof-listen "10.0.0.1:7652": want a loopback host:port`},
		{"pprof without a port", func(c *daemon.Config) { c.PprofListen = "127.0.0.1" }, `--pprof-listen "127.0.0.1"`},
		{"log level", func(c *daemon.Config) { c.LogLevel = "loud" }, "--log-level"},
		{"log format", func(c *daemon.Config) { c.LogFormat = "xml" }, "--log-format"},
		{"no attempts", func(c *daemon.Config) { c.Store.MaxAttempts = 0 }, "--max-attempts 0: want 1 to 1000"},
		{"too many attempts", func(c *daemon.Config) { c.Store.MaxAttempts = 1001 }, "--max-attempts 1001: want 1 to 1000"},
		{"otlp endpoint without scheme", func(c *daemon.Config) { c.Tracing.Endpoint = "collector:4317" }, `--otlp-endpoint "collector:4317": want an http://`},
		{"otlp endpoint without host", func(c *daemon.Config) { c.Tracing.Endpoint = "http://" }, `--otlp-endpoint "http://": the URL names no host`},
		{"otlp endpoint plaintext", func(c *daemon.Config) { c.Tracing.Endpoint = "http://127.0.0.1:4317" }, ""},
		{"otlp endpoint TLS", func(c *daemon.Config) { c.Tracing.Endpoint = "https://otel.example:4317" }, ""},
		{"sample ratio above 1", func(c *daemon.Config) { c.Tracing.SampleRatio = 1.5 }, "--trace-sample-ratio 1.5: want 0 to 1"},
		{"sample ratio negative", func(c *daemon.Config) { c.Tracing.SampleRatio = -0.1 }, "--trace-sample-ratio -0.1: want 0 to 1"},
		{"sample ratio NaN", func(c *daemon.Config) { c.Tracing.SampleRatio = math.NaN() }, "--trace-sample-ratio NaN: want 0 to 1"},
		{"sample ratio 0", func(c *daemon.Config) { c.Tracing.SampleRatio = 0 }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := daemon.DefaultConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// An external etcd that does not answer is reported at start, naming it,
// within the dial timeout: intentd never serves without its store.
func TestUnreachableEtcdFailsAtStart(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.EtcdEndpoints = []string{"http://127.0.0.1:1"}
	cfg.DialTimeout = time.Second
	err := daemon.Run(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("Run = %v, want an error naming the endpoint", err)
	}
}
