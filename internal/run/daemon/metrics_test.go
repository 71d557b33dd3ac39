package daemon_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
)

// /metrics exports gRPC calls by method and code and the store's counters.
func TestMetrics(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = freeport.Addr(t)
	in := start(t, cfg)
	c := intentv1.NewIntentServiceClient(in.conn)
	if _, err := c.Register(call(t), &intentv1.RegisterRequest{Key: "m-1", Params: params(t, 1)}); err != nil {
		t.Fatal(err)
	}
	body := scrape(t, cfg.MetricsListen)
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Register",grpc_service="intent.v1.IntentService",grpc_type="unary"} 1`,
		"intentd_store_commits_total 1",
		"intentd_store_ambiguous_commits_total 0",
		"intentd_intents_attempts_exhausted_total 0",
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// scrape reads /metrics at addr, waiting up to 10s for it to serve.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /metrics: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A dashboard or an alert on a method's calls (a rate of refusals, a
// latency quantile) needs the series before the first call: every method
// of the API starts at zero. They used to be initialised before the
// services were registered, so nothing existed until it was called.
func TestGRPCMetricsExistBeforeTheFirstCall(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = freeport.Addr(t)
	start(t, cfg)
	body := scrape(t, cfg.MetricsListen)
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="Aborted",grpc_method="Complete",grpc_service="intent.v1.IntentService",grpc_type="unary"} 0`,
		`grpc_server_handled_total{grpc_code="Unavailable",grpc_method="Acquire",grpc_service="intent.v1.IntentService",grpc_type="unary"} 0`,
		`grpc_server_handling_seconds_count{grpc_method="Acquire",grpc_service="intent.v1.IntentService",grpc_type="unary"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics before any call lacks %q", want)
		}
	}
}

// --pprof-listen serves Go's profiles; without it nothing serves them, the
// metrics listener neither.
func TestPprofListen(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = freeport.Addr(t)
	cfg.PprofListen = freeport.Addr(t)
	start(t, cfg)
	for path, want := range map[string]string{
		"/debug/pprof/goroutine?debug=1": "goroutine profile:",
		"/debug/pprof/heap?debug=1":      "heap profile:",
	} {
		code, body := waitHTTP(t, cfg.PprofListen, path, "200", func(code int, _ string) bool { return code != 0 })
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s = %d %.200q, want 200 and %q", path, code, body, want)
		}
	}
	if code, _ := get(t, cfg.MetricsListen, "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ on the metrics listener: %d, want 404", code)
	}
}
