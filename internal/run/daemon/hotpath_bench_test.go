//go:build unix

package daemon_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// BenchmarkPerCallPath measures the per-call path of a whole in-process
// intentd (its default embedded etcd, every interceptor, an INFO logger
// that writes nowhere) over one loopback gRPC connection, for profiling
// (docs/PERFORMANCE.md, "Per-call path: profile findings"):
//
//   - echo: gRPC health Check on a bare gRPC server on loopback, the floor
//     of any unary call here;
//   - replay/c=1 and replay/c=64: Acquire of a COMPLETED intent, answered
//     from memory;
//   - cycle/c=1: a fresh intent, Acquire with register (EXECUTE), then
//     Complete: two etcd writes.
//
// Rate limits are off. Each reports cpu-µs/op, the CPU time of the whole
// process (client, intentd and its etcd) per call or cycle, which a machine
// shared with other work disturbs less than ns/op. Compare the
// sub-benchmarks of one run:
//
//	go test -run '^$' -bench PerCallPath -benchtime 3s -cpuprofile cpu.out -memprofile mem.out ./internal/run/daemon
func BenchmarkPerCallPath(b *testing.B) {
	cfg := testConfig(b.TempDir())
	cfg.MetricsListen = ""
	cfg.RatePerPrincipal, cfg.RatePerTenant = 0, 0 // unlimited
	in := intentdtest.Start(b, cfg, slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})))
	c := intentv1.NewIntentServiceClient(in.Dial(b))
	ctx := context.Background()
	sess, err := c.OpenSession(ctx, &intentv1.OpenSessionRequest{Worker: "bench", Ttl: durationpb.New(5 * time.Minute)})
	if err != nil {
		b.Fatal(err)
	}
	p := params(b, 1)
	cycle := func(key string) *intentv1.AcquireResponse {
		a, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: sess.GetSessionId(), RequestId: "r",
			Register: &intentv1.RegisterRequest{Key: key, Params: p}})
		if err != nil {
			b.Fatal(err)
		}
		if a.GetLease() != nil {
			if _, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: a.GetLease().GetToken(),
				Result: &intentv1.Result{Payload: make([]byte, 300)}}); err != nil {
				b.Fatal(err)
			}
		}
		return a
	}
	cycle("replayed")
	replay := &intentv1.AcquireRequest{Key: "replayed", SessionId: sess.GetSessionId(), RequestId: "r2",
		Register: &intentv1.RegisterRequest{Key: "replayed", Params: p}}
	echo := healthpb.NewHealthClient(bareEcho(b))

	b.Run("echo/c=1", func(b *testing.B) {
		defer cpuPerOp(b)()
		for b.Loop() {
			if _, err := echo.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, par := range []int{1, 64} {
		b.Run(fmt.Sprintf("replay/c=%d", par), func(b *testing.B) {
			defer cpuPerOp(b)()
			b.SetParallelism(max(1, par/ncpu()))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					a, err := c.Acquire(ctx, replay)
					if err != nil || a.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
						b.Errorf("replay: %v %v, want COMPLETED", a.GetOutcome(), err)
						return
					}
				}
			})
		})
	}
	var n atomic.Int64
	run := time.Now().UnixNano()
	b.Run("cycle/c=1", func(b *testing.B) {
		defer cpuPerOp(b)()
		for b.Loop() {
			if a := cycle(fmt.Sprintf("k-%d-%d", run, n.Add(1))); a.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
				b.Fatalf("fresh intent: %v, want EXECUTE", a.GetOutcome())
			}
		}
	})
}

// cpuPerOp starts measuring the process's CPU time; the function it
// returns reports it per op as cpu-µs/op.
func cpuPerOp(b *testing.B) func() {
	start := cpuTime(b)
	return func() { b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op") }
}

// cpuTime is the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ncpu is GOMAXPROCS, which RunParallel multiplies its parallelism by.
func ncpu() int { return runtime.GOMAXPROCS(0) }

// bareEcho serves gRPC health, and nothing else, on loopback.
func bareEcho(b *testing.B) *grpc.ClientConn {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }() // exits at Stop
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return conn
}
