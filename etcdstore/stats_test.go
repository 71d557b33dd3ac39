package etcdstore_test

import (
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// Stats count each way an attempt ends without a report once, by the path
// that recorded it, and Depths counts the review queue and the open
// sessions across tenants.
func TestStatsAndDepths(t *testing.T) {
	c := newCluster(t)
	var mu sync.Mutex
	txns := map[bool]int{}
	cfg := etcdstore.DefaultConfig()
	cfg.ObserveTxn = func(write bool, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if d <= 0 {
			t.Errorf("ObserveTxn(%v, %v): want a positive duration", write, d)
		}
		txns[write]++
	}
	s, err := etcdstore.New(c.cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"st-unknown", "st-acquire-lapse", "st-janitor-lapse", "st-review"} {
		register(t, s, lamp(t, k, 1))
	}
	other := lamp(t, "st-other-tenant", 1)
	other.Tenant = "other"
	register(t, s, other)
	keep := openSession(t, s, "keep", time.Minute)
	if _, err := s.OpenSession(ctx(t), "other", "keep-other", time.Minute); err != nil {
		t.Fatal(err)
	}

	// MarkUnknown, then the same report again (no change, not counted).
	a := acquire(t, s, "st-unknown", keep)
	mustOutcome(t, a, intent.OutcomeExecute)
	for range 2 {
		if _, err := report(t, s, intent.Report{Key: "st-unknown", Kind: intent.ReportMarkUnknown, Token: a.Lease.Token}); err != nil {
			t.Fatal(err)
		}
	}
	// A lapse an Acquire notices.
	gone := openSession(t, s, "gone", time.Minute)
	mustOutcome(t, acquire(t, s, "st-acquire-lapse", gone), intent.OutcomeExecute)
	lapse(t, s, gone)
	mustOutcome(t, acquire(t, s, "st-acquire-lapse", keep), intent.OutcomeReconcile)
	// A lapse the janitor notices.
	gone2 := openSession(t, s, "gone2", time.Minute)
	mustOutcome(t, acquire(t, s, "st-janitor-lapse", gone2), intent.OutcomeExecute)
	lapse(t, s, gone2)
	if r, err := s.Sweep(ctx(t)); err != nil || r.Lapsed != 1 {
		t.Fatalf("Sweep = %+v, %v; want 1 lapsed", r, err)
	}
	// A reviewer escalates a PENDING intent; one in another tenant too.
	for _, e := range []intent.Escalation{{Tenant: "default", Key: "st-review"}, {Tenant: "other", Key: "st-other-tenant"}} {
		e.Reason, e.Actor = "check by hand", "rev"
		if _, err := s.Escalate(ctx(t), e); err != nil {
			t.Fatal(err)
		}
	}

	got := s.Stats()
	want := got
	want.MarkedUnknown, want.LapsesByAcquire, want.LapsesByJanitor, want.AttemptsExhausted = 1, 1, 1, 0
	if got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	// UNKNOWN: st-unknown and st-janitor-lapse (st-acquire-lapse is held
	// again); NEEDS_REVIEW: one per tenant; sessions: keep and keep-other.
	d, err := s.Depths(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if wantD := (etcdstore.Depths{Unknown: 2, NeedsReview: 2, Sessions: 2}); d != wantD {
		t.Errorf("Depths() = %+v, want %+v", d, wantD)
	}
	// Resolving takes an intent out of the queue, and it is final.
	if _, _, err := s.Resolve(ctx(t), intent.Resolution{Tenant: "default", Key: "st-review", Decision: intent.StateCancelled, Actor: "rev", Reason: "not wanted"}); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Depths(ctx(t)); err != nil || d.NeedsReview != 1 || d.Final != 1 {
		t.Errorf("Depths() after Resolve = %+v, %v; want NeedsReview 1, Final 1", d, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if txns[true] < int(got.Commits) || txns[false] == 0 {
		t.Errorf("ObserveTxn saw %d writes and %d reads, want at least the %d commits and some reads", txns[true], txns[false], got.Commits)
	}
}
