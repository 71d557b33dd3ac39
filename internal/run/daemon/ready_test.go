package daemon_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// get returns the status and body of GET http://addr+path, or 0 and the
// error's text when nothing answers.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitHTTP polls path until ok accepts its answer, for up to 30s.
func waitHTTP(t *testing.T, addr, path, want string, ok func(code int, body string) bool) (int, string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get(t, addr, path)
		if ok(code, body) {
			return code, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d %q after 30s, want %s", path, code, body, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isReady(code int, body string) bool { return code == http.StatusOK && body == "ok\n" }

// grpcHealth is what gRPC health says of the intent service.
func grpcHealth(t *testing.T, in *instance) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(in.conn).Check(call(t), &healthpb.HealthCheckRequest{Service: intentv1.IntentService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatalf("gRPC health: %v", err)
	}
	return resp.GetStatus()
}

// /readyz follows etcd: 200 while it answers, 503 with a one-line reason
// while it does not (gRPC health says the same), 200 again once it is
// back; /healthz stays 200 throughout.
func TestReadyzFollowsEtcd(t *testing.T) {
	etcdDir := t.TempDir()
	srv := etcdtest.StartDir(t, etcdDir)
	endpoint := srv.Endpoints[0]
	cfg := testConfig(t.TempDir())
	cfg.EtcdEndpoints = []string{endpoint}
	cfg.MetricsListen = freeport.Addr(t)
	cfg.Store.RequestTimeout = time.Second
	in := start(t, cfg)
	addr := cfg.MetricsListen

	waitHTTP(t, addr, "/readyz", "200 ok", isReady)
	if got := grpcHealth(t, in); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health while /readyz is 200: %v, want SERVING", got)
	}
	if code, body := get(t, addr, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz: %d %q, want 200 %q", code, body, "ok\n")
	}

	srv.Stop()
	_, body := waitHTTP(t, addr, "/readyz", "503 with a reason", func(code int, _ string) bool { return code == http.StatusServiceUnavailable })
	if !strings.HasPrefix(body, "etcd: ") || strings.Count(body, "\n") != 1 || !strings.HasSuffix(body, "\n") {
		t.Errorf("/readyz with etcd stopped: %q, want one line starting %q", body, "etcd: ")
	}
	if want := "etcd: no answer within 1s\n"; body != want {
		t.Logf("/readyz reason %q (a refused connection may say so instead of %q)", body, want)
	}
	if got := grpcHealth(t, in); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health while /readyz is 503: %v, want NOT_SERVING", got)
	}
	if code, body := get(t, addr, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz with etcd stopped: %d %q, want 200 %q", code, body, "ok\n")
	}

	startEtcdAt(t, etcdDir, endpoint)
	waitHTTP(t, addr, "/readyz", "200 ok once etcd is back", isReady)
	if got := grpcHealth(t, in); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health once etcd is back: %v, want SERVING", got)
	}
}

// Shutdown turns /readyz 503 while gRPC still serves the calls in flight,
// so that a probe drains the replica before its connections go.
func TestReadyzGoesDownBeforeGRPCStops(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = freeport.Addr(t)
	cfg.ShutdownTimeout = 3 * time.Second
	in := start(t, cfg)
	addr := cfg.MetricsListen
	waitHTTP(t, addr, "/readyz", "200 ok", isReady)

	// A watch stays in flight until graceful stop gives up on it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := intentv1.NewIntentServiceClient(in.conn).Watch(ctx, &intentv1.WatchRequest{Key: "r-1", CreatedNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.GetType() != intentv1.WatchResponse_TYPE_CREATED {
		t.Fatalf("watch: %v %v, want TYPE_CREATED", first.GetType(), err)
	}
	ended := make(chan struct{})
	go func() { // exits when the stream ends
		defer close(ended)
		for {
			if _, err := watch.Recv(); err != nil {
				return
			}
		}
	}()

	in.Shutdown()
	_, body := waitHTTP(t, addr, "/readyz", "503 shutting down", func(code int, _ string) bool { return code == http.StatusServiceUnavailable })
	select {
	case <-ended:
		t.Fatalf("the watch ended before /readyz said %q", body)
	default:
	}
	if body != "shutting down\n" {
		t.Errorf("/readyz during shutdown: %q, want %q", body, "shutting down\n")
	}
	if code, _ := get(t, addr, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz during shutdown: %d, want 200", code)
	}
	if err := in.Stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	<-ended
}
