package etcdstore_test

// One test per invariant of DESIGN.md (1–6), each against a real etcd. Each
// fails if its invariant is broken.

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// Invariant 1: at most one live lease per intent at any moment. 64 workers
// (each its own session, spread over two store replicas) race to acquire
// one PENDING intent: exactly one gets EXECUTE, everyone else sees it
// IN_PROGRESS under that very lease.
func TestInvariant1AtMostOneLiveLease(t *testing.T) {
	c := newCluster(t)
	replicas := []*etcdstore.Store{c.store(t), c.store(t)}
	register(t, replicas[0], lamp(t, "race-1", 1))

	const workers = 64
	sessions := make([]string, workers)
	for i := range sessions {
		sessions[i] = openSession(t, replicas[i%2], fmt.Sprintf("w%d", i), 30*time.Second)
	}
	results := make([]*intent.Acquisition, workers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range workers {
		wg.Go(func() {
			<-start
			a, err := replicas[i%2].Acquire(ctx(t), intent.AcquireRequest{
				Tenant: "default", Key: "race-1", SessionID: sessions[i], RequestID: fmt.Sprintf("r%d", i),
			})
			if err != nil {
				t.Errorf("worker %d: Acquire: %v", i, err)
				return
			}
			results[i] = a
		})
	}
	close(start)
	wg.Wait()

	var winners []int
	for i, a := range results {
		if a != nil && a.Outcome == intent.OutcomeExecute {
			winners = append(winners, i)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("EXECUTE went to workers %v, want exactly one", winners)
	}
	won := results[winners[0]].Lease
	for i, a := range results {
		if a == nil || i == winners[0] {
			continue
		}
		if a.Outcome != intent.OutcomeInProgress || a.Lease.Token != won.Token || a.Lease.SessionID != won.SessionID {
			t.Errorf("worker %d: outcome %v lease %+v, want IN_PROGRESS under the winner's lease %d", i, a.Outcome, a.Lease, won.Token)
		}
	}
	if n := countEvents(get(t, replicas[0], "race-1"), intent.EventAcquired); n != 1 {
		t.Errorf("history has %d acquisitions, want 1", n)
	}
}

// Invariant 2: tokens strictly increase per intent and across the
// cluster. Leases issued on several intents, by two replicas, through
// EXECUTE, lapses, RECONCILE and Release, come out in strictly increasing
// token order, and an intent's later lease always has a larger token.
func TestInvariant2TokensStrictlyIncrease(t *testing.T) {
	c := newCluster(t)
	replicas := []*etcdstore.Store{c.store(t), c.store(t)}
	var issued []fencing.Token
	perIntent := map[string][]fencing.Token{}
	for round := range 3 {
		for i := range 4 {
			s := replicas[(round+i)%2]
			key := fmt.Sprintf("tok-%d", i)
			if round == 0 {
				register(t, s, lamp(t, key, 1))
			}
			sess := openSession(t, s, "w", 30*time.Second)
			a := acquire(t, s, key, sess)
			if a.Lease == nil || (a.Outcome != intent.OutcomeExecute && a.Outcome != intent.OutcomeReconcile) {
				t.Fatalf("round %d %s: outcome %v, want a lease", round, key, a.Outcome)
			}
			issued = append(issued, a.Lease.Token)
			perIntent[key] = append(perIntent[key], a.Lease.Token)
			switch i % 2 {
			case 0: // the worker vanishes: the next round reconciles
				lapse(t, s, sess)
			case 1: // the reconciler confirms absence: the next round executes
				if _, err := report(t, s, intent.Report{Key: key, Token: a.Lease.Token, Kind: intent.ReportRelease}); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
		}
	}
	for i := 1; i < len(issued); i++ {
		if issued[i] <= issued[i-1] {
			t.Fatalf("token %d issued after %d: tokens must strictly increase across the cluster (all: %v)", issued[i], issued[i-1], issued)
		}
	}
	for key, toks := range perIntent {
		if !slices.IsSorted(toks) || len(slices.Compact(slices.Clone(toks))) != len(toks) {
			t.Errorf("%s: tokens %v, want strictly increasing", key, toks)
		}
		var fromHistory []fencing.Token
		for _, e := range get(t, replicas[0], key).History {
			if e.Kind == intent.EventAcquired {
				fromHistory = append(fromHistory, e.Token)
			}
		}
		if !slices.Equal(fromHistory, toks) {
			t.Errorf("%s: history tokens %v, want the issued %v", key, fromHistory, toks)
		}
	}
}

// Invariant 3: a superseded token never changes an intent's state. After a
// reconciler took over, every fenced call under the old token is refused
// with the current token, leaves state, lease and result as they were, and
// is kept as evidence.
func TestInvariant3SupersededTokenChangesNothing(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "stale-1", 1))
	a := openSession(t, s, "a", 30*time.Second)
	old := acquire(t, s, "stale-1", a).Lease.Token
	lapse(t, s, a)
	b := openSession(t, s, "b", 30*time.Second)
	cur := acquire(t, s, "stale-1", b).Lease.Token

	calls := []struct {
		name string
		call func() error
	}{
		{"Complete", func() error { _, err := report(t, s, complete("stale-1", old, "SO-A")); return err }},
		{"MarkUnknown", func() error {
			_, err := report(t, s, intent.Report{Key: "stale-1", Token: old, Kind: intent.ReportMarkUnknown, Reason: "timeout"})
			return err
		}},
		{"Release", func() error {
			_, err := report(t, s, intent.Report{Key: "stale-1", Token: old, Kind: intent.ReportRelease})
			return err
		}},
		{"Fail", func() error {
			_, err := report(t, s, intent.Report{Key: "stale-1", Token: old, Kind: intent.ReportFail, Failure: &intent.Failure{Code: "declined"}})
			return err
		}},
		{"Heartbeat", func() error {
			b2 := openSession(t, s, "a-again", 30*time.Second)
			_, err := s.Heartbeat(ctx(t), "default", b2, []intent.HeldLease{{Key: "stale-1", Token: old}})
			return err
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			before := get(t, s, "stale-1")
			mustStale(t, tc.call(), cur)
			after := get(t, s, "stale-1")
			if after.State != before.State || after.Lease.Token != before.Lease.Token || after.Result != nil {
				t.Fatalf("after stale %s: state %v token %d result %v; want %v %d nil", tc.name, after.State, after.Lease.Token, after.Result, before.State, before.Lease.Token)
			}
			if got := len(after.History) - len(before.History); got != 1 {
				t.Fatalf("stale %s added %d history entries, want 1 (the evidence)", tc.name, got)
			}
			ev := after.History[len(after.History)-1]
			if ev.Accepted || ev.Token != old {
				t.Fatalf("evidence entry %+v: want accepted=false under token %d", ev, old)
			}
		})
	}
	// The stale worker's order id is kept: it tells the reconciler the truth.
	in := get(t, s, "stale-1")
	i := slices.IndexFunc(in.History, func(e intent.Event) bool { return e.Kind == intent.EventCompleted && !e.Accepted })
	if i < 0 || in.History[i].Result.ExternalRefs["supplier_order_id"] != "SO-A" {
		t.Fatalf("history %+v: want the stale Complete with SO-A kept as evidence", in.History)
	}
}

// Invariant 4: COMPLETED is final: the result never changes, and every
// replay, from the replica that completed it, from another replica, and
// after the cache is cold, returns it byte for byte.
func TestInvariant4CompletedIsFinal(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "final-1", 1))
	w := openSession(t, s, "w", 30*time.Second)
	tok := acquire(t, s, "final-1", w).Lease.Token
	want := complete("final-1", tok, "SO-1042").Result
	if _, err := report(t, s, complete("final-1", tok, "SO-1042")); err != nil {
		t.Fatal(err)
	}

	refusals := []struct {
		name string
		r    intent.Report
		want error
	}{
		{"Complete with another result", complete("final-1", tok, "SO-2"), intent.ErrResultMismatch},
		{"MarkUnknown", intent.Report{Key: "final-1", Token: tok, Kind: intent.ReportMarkUnknown}, intent.ErrInvalidTransition},
		{"Release", intent.Report{Key: "final-1", Token: tok, Kind: intent.ReportRelease}, intent.ErrInvalidTransition},
		{"Fail", intent.Report{Key: "final-1", Token: tok, Kind: intent.ReportFail, Failure: &intent.Failure{Code: "x"}}, intent.ErrInvalidTransition},
	}
	for _, tc := range refusals {
		if _, err := report(t, s, tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s after COMPLETED: err = %v, want %v", tc.name, err, tc.want)
		}
	}

	other := c.store(t) // another replica, cold cache
	for i, st := range []*etcdstore.Store{s, s, other, other, c.store(t)} {
		sess := openSession(t, st, fmt.Sprintf("late-%d", i), 30*time.Second)
		a := acquire(t, st, "final-1", sess)
		mustOutcome(t, a, intent.OutcomeCompleted)
		if a.Lease != nil {
			t.Errorf("replay %d: a replay issued lease %+v", i, a.Lease)
		}
		got := a.Intent.Result
		if !bytes.Equal(got.Payload, want.Payload) || got.ExternalRefs["supplier_order_id"] != "SO-1042" || len(got.ExternalRefs) != 1 {
			t.Errorf("replay %d: result %q %v, want %q %v", i, got.Payload, got.ExternalRefs, want.Payload, want.ExternalRefs)
		}
	}
	in := get(t, other, "final-1")
	if in.State != intent.StateCompleted || !bytes.Equal(in.Result.Payload, want.Payload) {
		t.Fatalf("Get: state %v payload %q, want COMPLETED %q", in.State, in.Result.Payload, want.Payload)
	}
}

// Invariant 5: an expired lease never yields EXECUTE. When a holder's
// session lapses (here by real TTL expiry in etcd), the next Acquire gets
// RECONCILE; and a worker whose own session lapsed gets no lease at all.
func TestInvariant5ExpiredLeaseNeverExecutes(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "expire-1", 1))
	short := openSession(t, s, "short-lived", 2*time.Second)
	first := acquire(t, s, "expire-1", short)
	mustOutcome(t, first, intent.OutcomeExecute)

	deadline := time.Now().Add(20 * time.Second)
	for get(t, s, "expire-1").State != intent.StateUnknown {
		if time.Now().After(deadline) {
			t.Fatal("session did not lapse within 20s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The lapsed worker comes back: its session is gone, so it gets nothing.
	_, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "expire-1", SessionID: short, RequestID: "again"})
	if !errors.Is(err, intent.ErrSessionNotFound) {
		t.Fatalf("Acquire on a lapsed session: err = %v, want ErrSessionNotFound", err)
	}
	next := acquire(t, s, "expire-1", openSession(t, s, "next", 30*time.Second))
	mustOutcome(t, next, intent.OutcomeReconcile)
	if next.Lease.Token <= first.Lease.Token {
		t.Fatalf("reconcile token %d, want > %d", next.Lease.Token, first.Lease.Token)
	}
	if n := countEvents(get(t, s, "expire-1"), intent.EventLeaseLapsed); n != 1 {
		t.Fatalf("history has %d lease-lapsed entries, want 1", n)
	}
}

// Invariant 6: intentd's writes are safe to retry. The reply of every write
// transaction is lost after etcd applied it; the store reads back and
// recognizes its own effect: one lease, one completion, one registration.
func TestInvariant6AmbiguousCommitReadBack(t *testing.T) {
	c := newCluster(t)
	var dropped int
	lossy := lossyKV(c.cli.KV, &dropped)
	cfg := etcdstore.DefaultConfig()
	s, err := etcdstore.NewWithKV(c.cli, lossy, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reliable := c.store(t)
	sess := openSession(t, reliable, "w", 30*time.Second)

	// Register and acquire in one transaction, reply lost, then the same
	// for Complete.
	reg := lamp(t, "ambiguous-1", 1)
	a, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: sess, RequestID: "r1", Register: &reg})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	mustOutcome(t, a, intent.OutcomeExecute)
	if _, err := report(t, s, complete(reg.Key, a.Lease.Token, "SO-7")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	// A plain Register whose reply is lost: the read-back knows its own
	// write by the request id.
	reg2 := lamp(t, "ambiguous-2", 1)
	reg2.RequestID = "register-1"
	if _, created, err := s.Register(ctx(t), reg2); err != nil || !created {
		t.Fatalf("Register = created %t, %v; want created true", created, err)
	}
	// MarkUnknown whose reply is lost, then read back.
	b, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "ambiguous-2", SessionID: sess, RequestID: "r2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := report(t, s, intent.Report{Key: "ambiguous-2", Token: b.Lease.Token, Kind: intent.ReportMarkUnknown}); err != nil {
		t.Fatalf("MarkUnknown: %v", err)
	}

	if dropped < 5 { // every call above has returned: no lock needed
		t.Fatalf("only %d replies were dropped; the test did not exercise the fault", dropped)
	}
	in := get(t, reliable, "ambiguous-1")
	if in.State != intent.StateCompleted || in.Lease.Token != a.Lease.Token {
		t.Fatalf("state %v token %d, want COMPLETED under %d", in.State, in.Lease.Token, a.Lease.Token)
	}
	for kind, want := range map[intent.EventKind]int{intent.EventRegistered: 1, intent.EventAcquired: 1, intent.EventCompleted: 1} {
		if n := countEvents(in, kind); n != want {
			t.Errorf("ambiguous-1 history has %d entries of kind %d, want %d", n, kind, want)
		}
	}
	in2 := get(t, reliable, "ambiguous-2")
	if in2.State != intent.StateUnknown || countEvents(in2, intent.EventAcquired) != 1 || countEvents(in2, intent.EventMarkedUnknown) != 1 {
		t.Errorf("ambiguous-2: state %v history %+v, want UNKNOWN after one acquire and one MarkUnknown", in2.State, in2.History)
	}
	// Lost replies to a reconciler's Acquire must not hand out two leases
	// either: the next lease is RECONCILE and the one after it IN_PROGRESS.
	r1, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "ambiguous-2", SessionID: sess, RequestID: "r3"})
	if err != nil {
		t.Fatal(err)
	}
	mustOutcome(t, r1, intent.OutcomeReconcile)
	r2 := acquire(t, reliable, "ambiguous-2", openSession(t, reliable, "other", 30*time.Second))
	mustOutcome(t, r2, intent.OutcomeInProgress)
	if r2.Lease.Token != r1.Lease.Token {
		t.Fatalf("holder token %d, want the reconciler's %d", r2.Lease.Token, r1.Lease.Token)
	}
}

func countEvents(in *intent.Intent, kind intent.EventKind) int {
	n := 0
	for _, e := range in.History {
		if e.Kind == kind && e.Accepted {
			n++
		}
	}
	return n
}
