package daemon_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/intentdtest"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// Every call used to be logged at INFO, health checks and reflection streams
// included: one grpcurl session wrote 184 "finished call" lines. By default
// the log now holds what an operator reads — refused calls — and
// --access-log turns the per-call log back on.
func TestDefaultLogIsNotAnAccessLog(t *testing.T) {
	for _, tc := range []struct {
		name      string
		accessLog bool
		// want is how many "finished call" lines the calls below write:
		// 3 Registers, 3 health checks, 1 reflection stream, 1 refused Get.
		want int
	}{
		{"default: refusals only", false, 1},
		{"--access-log: every call", true, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.AccessLog = tc.accessLog
			logs := &testlog.Buffer{}
			conn := startLogged(t, cfg, logs)
			c := intentv1.NewIntentServiceClient(conn)
			for _, key := range []string{"log-a", "log-b", "log-c"} {
				if _, err := c.Register(call(t), &intentv1.RegisterRequest{Key: key, Params: params(t, 1)}); err != nil {
					t.Fatal(err)
				}
			}
			for range 3 {
				if _, err := healthpb.NewHealthClient(conn).Check(call(t), &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(call(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
				t.Fatal(err)
			}
			if _, err := rs.Recv(); err != nil {
				t.Fatal(err)
			}
			_ = rs.CloseSend()
			if _, err := rs.Recv(); err == nil {
				t.Fatal("reflection stream: want its end after CloseSend")
			}
			if _, err := c.Get(call(t), &intentv1.GetRequest{Key: "log-missing"}); err == nil {
				t.Fatal("Get of a missing key succeeded")
			}
			// The server logs a call after answering it: wait for the last.
			deadline := time.Now().Add(5 * time.Second)
			for strings.Count(logs.String(), "finished call") < tc.want && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // and for any line too many
			got := logs.String()
			if n := strings.Count(got, "finished call"); n != tc.want {
				t.Errorf("%d \"finished call\" lines, want %d\n--- log ---\n%s", n, tc.want, got)
			}
			if !strings.Contains(got, "grpc.method=Get") || !strings.Contains(got, "grpc.code=NotFound") {
				t.Errorf("the refused Get is not in the log\n--- log ---\n%s", got)
			}
		})
	}
}

// startLogged runs intentd in-process with its log at INFO going to w, and
// returns a connection to it. It stops when the test ends.
func startLogged(t *testing.T, cfg daemon.Config, w *testlog.Buffer) *grpc.ClientConn {
	t.Helper()
	return intentdtest.Start(t, cfg, slog.New(slog.NewTextHandler(w, nil))).Dial(t)
}
