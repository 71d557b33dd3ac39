package daemon_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// benchKeys numbers the fresh intents of BenchmarkTracingCost across runs.
var benchKeys atomic.Int64

// BenchmarkTracingCost measures what tracing costs the calls a worker makes
// most, over loopback gRPC against in-process intentds: a replay (Acquire
// of a COMPLETED intent, answered from memory) and a happy-path intent
// (Acquire with registration, then Complete: 2 etcd writes). "off" is the
// default (no --otlp-endpoint); "on" records every span, client and server,
// into a provider that exports nowhere: the cost of the instrumentation
// without the exporter's. Both intentds run side by side and the
// sub-benchmarks alternate, so compare off and on of the same run:
//
//	go test -run '^$' -bench TracingCost -benchtime 2000x -count 5 ./internal/run/daemon
func BenchmarkTracingCost(b *testing.B) {
	worker := map[string]func(key string) *intentv1.AcquireResponse{}
	for _, mode := range []string{"off", "on"} {
		cfg := testConfig(b.TempDir())
		cfg.MetricsListen = ""
		cfg.RatePerPrincipal, cfg.RatePerTenant = 0, 0 // unlimited
		dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if mode == "on" {
			cfg.Tracing.Provider = sdktrace.NewTracerProvider()
			dial = append(dial, client.Tracing(sdktrace.NewTracerProvider()))
		}
		in := start(b, cfg)
		conn, err := grpc.NewClient(in.addr, dial...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		worker[mode] = happyPath(b, intentv1.NewIntentServiceClient(conn), params(b, 1))
		worker[mode]("replayed")
	}
	run := time.Now().UnixNano()
	for _, bench := range []string{"replay", "happy"} {
		for _, mode := range []string{"off", "on"} {
			b.Run(bench+"/tracing="+mode, func(b *testing.B) {
				for b.Loop() {
					if bench == "replay" {
						if a := worker[mode]("replayed"); a.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
							b.Fatalf("replay: %v, want COMPLETED", a.GetOutcome())
						}
						continue
					}
					if a := worker[mode](fmt.Sprintf("k-%d-%d", run, benchKeys.Add(1))); a.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
						b.Fatalf("fresh intent: %v, want EXECUTE", a.GetOutcome())
					}
				}
			})
		}
	}
}

// happyPath returns a worker of one session that acquires an intent
// (registering it) and completes it when told to execute.
func happyPath(b *testing.B, c intentv1.IntentServiceClient, p *structpb.Struct) func(key string) *intentv1.AcquireResponse {
	sess, err := c.OpenSession(call(b), &intentv1.OpenSessionRequest{Worker: "w1", Ttl: durationpb.New(5 * time.Minute)})
	if err != nil {
		b.Fatal(err)
	}
	return func(key string) *intentv1.AcquireResponse {
		a, err := c.Acquire(call(b), &intentv1.AcquireRequest{Key: key, SessionId: sess.GetSessionId(), RequestId: "r", Register: &intentv1.RegisterRequest{Key: key, Params: p}})
		if err != nil {
			b.Fatal(err)
		}
		if a.GetLease() != nil {
			if _, err := c.Complete(call(b), &intentv1.CompleteRequest{Key: key, Token: a.GetLease().GetToken(), Result: &intentv1.Result{Payload: []byte("SO-1")}}); err != nil {
				b.Fatal(err)
			}
		}
		return a
	}
}
