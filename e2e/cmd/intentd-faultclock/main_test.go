package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// TestMain builds intentd-faultclock (this package) and cmd/intentd.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Want{FaultClock: true}, nil))
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

// near reports whether got is want within a minute: far tighter than the
// 5-minute jumps, loose enough for a slow machine.
func near(got, want time.Time) bool {
	d := got.Sub(want)
	return d > -time.Minute && d < time.Minute
}

// The fault clock shifts what intentd writes into history, and a jump
// while it runs changes the next timestamps and nothing else: a lease held
// across the jump still heartbeats and completes, because lease liveness
// is etcd's, not the clock's.
func TestClockOffsetFileJumps(t *testing.T) {
	d := harness.StartIntentd(t, harness.Bins(t), "faultclock", harness.IntentdConfig{InjectedClock: true, ClockOffset: 5 * time.Minute})
	offset := d.ClockFile
	conn, err := harness.Dial(d.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := intentv1.NewIntentServiceClient(conn)

	sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w1", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(key string) uint64 {
		t.Helper()
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{
			Key: key, SessionId: sess.GetSessionId(), RequestId: key,
			Register: &intentv1.RegisterRequest{Key: key, Params: params(t, 1)},
		})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", key, err)
		}
		return a.GetLease().GetToken()
	}
	completeIt := func(key string, token uint64) {
		t.Helper()
		if _, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: key, Token: token, Result: &intentv1.Result{Payload: []byte("ok")}}); err != nil {
			t.Fatalf("Complete(%s): %v", key, err)
		}
	}
	history := func(key string) map[intentv1.HistoryEntry_Kind]time.Time {
		t.Helper()
		got, err := c.Get(call(t), &intentv1.GetRequest{Key: key})
		if err != nil {
			t.Fatalf("Get(%s): %v", key, err)
		}
		out := map[intentv1.HistoryEntry_Kind]time.Time{}
		for _, e := range got.GetIntent().GetHistory() {
			out[e.GetKind()] = e.GetTime().AsTime()
		}
		return out
	}

	// Clock 5 minutes ahead: every entry of a whole life says so.
	completeIt("ahead-1", acquire("ahead-1"))
	for kind, at := range history("ahead-1") {
		if want := time.Now().Add(5 * time.Minute); !near(at, want) {
			t.Errorf("ahead-1 %v at %v, want about %v (now+5m)", kind, at, want)
		}
	}

	// A lease taken before the jump.
	held := acquire("across-1")

	// Jump 10 minutes back, to now-5m, while running. Wait until a
	// registration shows it: the file is re-read every 100 ms.
	if err := os.WriteFile(offset, []byte("-5m"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		key := fmt.Sprintf("probe-%d", i)
		if _, err := c.Register(call(t), &intentv1.RegisterRequest{Key: key, Params: params(t, 1)}); err != nil {
			t.Fatal(err)
		}
		if near(history(key)[intentv1.HistoryEntry_KIND_REGISTERED], time.Now().Add(-5*time.Minute)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the clock offset file was not re-read within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The lease keeps working across the jump.
	if _, err := c.Heartbeat(call(t), &intentv1.HeartbeatRequest{
		SessionId: sess.GetSessionId(), Leases: []*intentv1.HeldLease{{Key: "across-1", Token: held}},
	}); err != nil {
		t.Fatalf("Heartbeat after the jump: %v", err)
	}
	completeIt("across-1", held)
	h := history("across-1")
	if at, want := h[intentv1.HistoryEntry_KIND_ACQUIRED], time.Now().Add(5*time.Minute); !near(at, want) {
		t.Errorf("across-1 acquired at %v, want about %v (before the jump)", at, want)
	}
	if at, want := h[intentv1.HistoryEntry_KIND_COMPLETED], time.Now().Add(-5*time.Minute); !near(at, want) {
		t.Errorf("across-1 completed at %v, want about %v (after the jump)", at, want)
	}
}
