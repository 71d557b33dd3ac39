package daemon_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// /metrics exports gRPC calls by method and code and the store's counters.
func TestMetrics(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = addr
	in := start(t, cfg)
	c := intentv1.NewIntentServiceClient(in.conn)
	if _, err := c.Register(call(t), &intentv1.RegisterRequest{Key: "m-1", Params: params(t, 1)}); err != nil {
		t.Fatal(err)
	}
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /metrics: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Register",grpc_service="intent.v1.IntentService",grpc_type="unary"} 1`,
		"intentd_store_commits_total 1",
		"intentd_store_ambiguous_commits_total 0",
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
