package etcdstore_test

// Retention, tombstones and the janitor against a real etcd, with time
// driven by a fake clock injected through Config.Now.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// epoch is where fake clocks start.
var epoch = time.Date(2030, time.March, 1, 9, 0, 0, 0, time.UTC)

// fakeClock is a Config.Now a test moves by hand. Every reading moves it on
// by step, so that records registered one after another get distinct times.
type fakeClock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func newFakeClock(start time.Time, step time.Duration) *fakeClock {
	return &fakeClock{now: start, step: step}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now
	c.now = c.now.Add(c.step)
	return t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// storeWith returns a Store on the cluster through kv (nil: the cluster's
// own), with DefaultConfig changed by configure.
func storeWith(t testing.TB, c *cluster, kv clientv3.KV, configure func(*etcdstore.Config)) *etcdstore.Store {
	t.Helper()
	cfg := etcdstore.DefaultConfig()
	configure(&cfg)
	if kv == nil {
		kv = c.cli.KV
	}
	s, err := etcdstore.NewWithKV(c.cli, kv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Retention settings of the tests: short, so that a fake clock passes them
// in one step.
const (
	testRetention     = time.Hour
	testMaxRetention  = 24 * time.Hour
	testTombRetention = 48 * time.Hour
)

func retentionConfig(clock *fakeClock) func(*etcdstore.Config) {
	return func(cfg *etcdstore.Config) {
		cfg.DefaultRetention = testRetention
		cfg.MaxRetention = testMaxRetention
		cfg.TombstoneRetention = testTombRetention
		cfg.Now = clock.Now
	}
}

func sweep(t *testing.T, s *etcdstore.Store) etcdstore.SweepReport {
	t.Helper()
	r, err := s.Sweep(ctx(t))
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	return r
}

func mustSweep(t *testing.T, s *etcdstore.Store, want etcdstore.SweepReport) {
	t.Helper()
	if got := sweep(t, s); got != want {
		t.Fatalf("Sweep = %+v, want %+v", got, want)
	}
}

// rawExists reports whether an etcd key exists, read directly.
func rawExists(t *testing.T, c *cluster, key string) bool {
	t.Helper()
	resp, err := c.cli.Get(ctx(t), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// completeNow registers, acquires and completes an intent.
func completeNow(t *testing.T, s *etcdstore.Store, reg intent.Registration, orderID string) *intent.Intent {
	t.Helper()
	register(t, s, reg)
	a := acquire(t, s, reg.Key, openSession(t, s, "w-"+reg.Key, 30*time.Second))
	mustOutcome(t, a, intent.OutcomeExecute)
	out, err := report(t, s, complete(reg.Key, a.Lease.Token, orderID))
	if err != nil {
		t.Fatalf("Complete(%s): %v", reg.Key, err)
	}
	return out.Intent
}

// The retention test of issue 3: a completed intent outlives its retention,
// the janitor removes it and leaves a tombstone; a late retry, on any
// replica, gets EXPIRED and nothing executes; intents that are not final
// are kept however old, and reported as overdue; the tombstone goes after
// its own retention.
func TestRetentionExpiresFinalIntentsOnly(t *testing.T) {
	c := newCluster(t)
	clock := newFakeClock(epoch, time.Millisecond)
	s := storeWith(t, c, nil, retentionConfig(clock))
	var writes, reads int
	counted := countingKV(c.cli.KV, &writes, &reads)
	readsOf := func() int {
		counted.mu.Lock()
		defer counted.mu.Unlock()
		return reads
	}
	// b is another replica; it replays "done" from memory.
	b := storeWith(t, c, counted, retentionConfig(clock))

	done := completeNow(t, s, lamp(t, "done", 1), "SO-DONE")
	doneToken := done.Lease.Token
	long := lamp(t, "long", 1)
	long.Retention = 15 * time.Hour
	completeNow(t, s, long, "SO-LONG")
	if want := done.CompletedAt.Add(testRetention); !done.RetainUntil.Equal(want) {
		t.Fatalf("retain_until %v, want completed_at + default retention = %v", done.RetainUntil, want)
	}

	// The four states that are not final, none ever removed.
	register(t, s, lamp(t, "pending", 1))
	holder := openSession(t, s, "holder", 60*time.Second)
	mustOutcome(t, acquire(t, s, register(t, s, lamp(t, "in-progress", 1)).Key, holder), intent.OutcomeExecute)
	u := acquire(t, s, register(t, s, lamp(t, "unknown", 1)).Key, holder)
	if _, err := report(t, s, intent.Report{Key: "unknown", Token: u.Lease.Token, Kind: intent.ReportMarkUnknown}); err != nil {
		t.Fatal(err)
	}
	register(t, s, lamp(t, "needs-review", 1))
	if _, err := escalate(t, s, intent.Escalation{Key: "needs-review", Actor: reviewer, Reason: "check"}); err != nil {
		t.Fatal(err)
	}
	unfinished := map[string]intent.State{
		"pending": intent.StatePending, "in-progress": intent.StateInProgress,
		"unknown": intent.StateUnknown, "needs-review": intent.StateNeedsReview,
	}

	bSession := openSession(t, b, "late-b", 60*time.Second)
	mustOutcome(t, acquire(t, b, "done", bSession), intent.OutcomeCompleted)
	r0 := readsOf()
	mustOutcome(t, acquire(t, b, "done", bSession), intent.OutcomeCompleted)
	if r := readsOf(); r != r0 {
		t.Fatalf("a replay within retention cost %d reads, want 0 (from memory)", r-r0)
	}

	mustSweep(t, s, etcdstore.SweepReport{})

	clock.Advance(testRetention + time.Second)
	// Past retention but before the janitor ran: b must ask etcd, which
	// still has the record.
	r0 = readsOf()
	a := acquire(t, b, "done", bSession)
	mustOutcome(t, a, intent.OutcomeCompleted)
	if readsOf() == r0 {
		t.Fatal("a replay past retention was served from memory; want a read of etcd")
	}

	mustSweep(t, s, etcdstore.SweepReport{Removed: 1, Overdue: len(unfinished)})
	// The tombstone is packed: the first one creates the last chunk, which
	// covers every hash.
	if rawExists(t, c, "/intentd/v1/t/default/i/done") || !rawExists(t, c, "/intentd/v1/Z/ffffffffffffffffffffffffffffffff") ||
		rawExists(t, c, "/intentd/v1/t/default/z/done") {
		t.Fatal("after the sweep: want the record gone and its tombstone in place, packed")
	}

	// Late retries on the replica that swept, on the one that cached the
	// final record, and on a cold one.
	reg := lamp(t, "done", 1)
	for name, st := range map[string]*etcdstore.Store{"sweeper": s, "cached": b, "cold": c.store(t)} {
		t.Run(name, func(t *testing.T) {
			sess := openSession(t, st, "late", 60*time.Second)
			for _, req := range []intent.AcquireRequest{
				{Tenant: "default", Key: "done", SessionID: sess, RequestID: "late-1"},
				{Tenant: "default", Key: "done", SessionID: sess, RequestID: "late-2", Register: &reg},
			} {
				a, err := st.Acquire(ctx(t), req)
				if err != nil {
					t.Fatalf("Acquire (register %v): %v", req.Register != nil, err)
				}
				if a.Outcome != intent.OutcomeExpired || a.Lease != nil || a.Fresh {
					t.Fatalf("Acquire (register %v): outcome %v lease %+v, want EXPIRED and no lease", req.Register != nil, a.Outcome, a.Lease)
				}
				// A packed tombstone holds the state and the completion
				// to the second, not the fingerprint.
				if a.Intent.State != intent.StateCompleted || a.Intent.Fingerprint != "" || !a.Intent.CompletedAt.Equal(done.CompletedAt.Truncate(time.Second)) {
					t.Fatalf("EXPIRED intent %+v, want the tombstone's COMPLETED at %v", a.Intent, done.CompletedAt.Truncate(time.Second))
				}
			}
			_, _, err := st.Register(ctx(t), reg)
			var expired *intent.ExpiredError
			if !errors.As(err, &expired) || expired.State != intent.StateCompleted || expired.Fingerprint != "" || expired.Key != "done" {
				t.Fatalf("Register: err = %v, want an *intent.ExpiredError naming COMPLETED", err)
			}
			if _, err := st.Get(ctx(t), "default", "done"); !errors.Is(err, intent.ErrExpired) {
				t.Fatalf("Get: err = %v, want ErrExpired", err)
			}
			if _, err := report(t, st, complete("done", doneToken, "SO-DONE")); !errors.Is(err, intent.ErrExpired) {
				t.Fatalf("late Complete: err = %v, want ErrExpired", err)
			}
			if _, _, err := st.Resolve(ctx(t), intent.Resolution{Tenant: "default", Key: "done", Decision: intent.StatePending, Actor: reviewer}); !errors.Is(err, intent.ErrExpired) {
				t.Fatalf("Resolve: err = %v, want ErrExpired", err)
			}
		})
	}
	// Nothing executed again: the record was not re-registered.
	if rawExists(t, c, "/intentd/v1/t/default/i/done") {
		t.Fatal("a late retry registered the expired intent again")
	}

	for key, want := range unfinished {
		if in := get(t, s, key); in.State != want || !in.RetainUntil.IsZero() {
			t.Errorf("%s: state %v retain_until %v, want %v kept with no retention end", key, in.State, in.RetainUntil, want)
		}
	}
	if in := get(t, s, "long"); in.State != intent.StateCompleted {
		t.Fatalf("long: state %v, want COMPLETED kept for its own 15h retention", in.State)
	}
	mustSweep(t, s, etcdstore.SweepReport{Overdue: len(unfinished)})

	clock.Advance(14 * time.Hour) // past "long"'s retention, just after midnight
	mustSweep(t, s, etcdstore.SweepReport{Removed: 1, Overdue: len(unfinished)})
	if _, err := s.Get(ctx(t), "default", "long"); !errors.Is(err, intent.ErrExpired) {
		t.Fatalf("Get(long): err = %v, want ErrExpired", err)
	}

	// "done"'s tombstone is due 48h after its removal, at 10:00 two days
	// later, and stays until that day ends (a packed tombstone's end is a
	// day); "long"'s is due 14h later, the next day.
	clock.Advance(testTombRetention - 14*time.Hour + time.Minute)
	mustSweep(t, s, etcdstore.SweepReport{Overdue: len(unfinished)})
	if _, err := s.Get(ctx(t), "default", "done"); !errors.Is(err, intent.ErrExpired) {
		t.Fatalf("Get(done) on the day its tombstone's retention ends: err = %v, want ErrExpired", err)
	}
	clock.Advance(14 * time.Hour)
	mustSweep(t, s, etcdstore.SweepReport{TombstonesRemoved: 1, Overdue: len(unfinished)})
	if _, err := s.Get(ctx(t), "default", "done"); !errors.Is(err, intent.ErrNotFound) {
		t.Fatalf("Get(done) after its tombstone went: err = %v, want ErrNotFound", err)
	}
	if _, err := s.Get(ctx(t), "default", "long"); !errors.Is(err, intent.ErrExpired) {
		t.Fatalf("Get(long): err = %v, want ErrExpired (its tombstone is not due)", err)
	}
	for key := range unfinished {
		get(t, s, key)
	}
}

// A registration may ask for its own retention within the maximum.
func TestRetentionBounds(t *testing.T) {
	c := newCluster(t)
	clock := newFakeClock(epoch, time.Millisecond)
	s := storeWith(t, c, nil, retentionConfig(clock))
	cases := []struct {
		retention time.Duration
		wantField string // "": accepted
	}{
		{0, ""},
		{time.Minute, ""},
		{testMaxRetention, ""},
		{testMaxRetention + time.Nanosecond, "retention"},
		{-time.Second, "retention"},
	}
	for i, tc := range cases {
		reg := lamp(t, fmt.Sprintf("bounds-%d", i), 1)
		reg.Retention = tc.retention
		_, _, err := s.Register(ctx(t), reg)
		var inv *intent.InvalidError
		switch {
		case tc.wantField == "" && err != nil:
			t.Errorf("retention %v: err = %v, want accepted", tc.retention, err)
		case tc.wantField != "" && (!errors.As(err, &inv) || inv.Field != tc.wantField):
			t.Errorf("retention %v: err = %v, want an InvalidError on %q", tc.retention, err, tc.wantField)
		}
	}
}

// A session that ends while it holds intents: the janitor marks them
// UNKNOWN once (so the review queue shows them), and leaves intents held by
// live sessions alone.
func TestSweepMarksLapsedLeasesUnknown(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	gone := openSession(t, s, "gone", 30*time.Second)
	alive := openSession(t, s, "alive", 30*time.Second)
	tokens := map[string]uint64{}
	for _, k := range []string{"lapsed-1", "lapsed-2"} {
		register(t, s, lamp(t, k, 1))
		tokens[k] = uint64(acquire(t, s, k, gone).Lease.Token)
	}
	register(t, s, lamp(t, "held", 1))
	mustOutcome(t, acquire(t, s, "held", alive), intent.OutcomeExecute)
	lapse(t, s, gone)

	if in := get(t, s, "lapsed-1"); in.State != intent.StateUnknown || in.Lease.Live {
		t.Fatalf("before the sweep: state %v live %v, want UNKNOWN (the holder is gone)", in.State, in.Lease.Live)
	}
	if got := sweep(t, s); got.Lapsed != 2 {
		t.Fatalf("Sweep = %+v, want Lapsed 2", got)
	}
	for k, tok := range tokens {
		in := get(t, s, k)
		if in.State != intent.StateUnknown {
			t.Errorf("%s: state %v, want UNKNOWN", k, in.State)
		}
		var lapsed []intent.Event
		for _, e := range in.History {
			if e.Kind == intent.EventLeaseLapsed {
				lapsed = append(lapsed, e)
			}
		}
		if len(lapsed) != 1 || uint64(lapsed[0].Token) != tok || lapsed[0].SessionID != gone {
			t.Errorf("%s: lease-lapsed entries %+v, want one under token %d of session %s", k, lapsed, tok, gone)
		}
	}
	if in := get(t, s, "held"); in.State != intent.StateInProgress || !in.Lease.Live {
		t.Fatalf("held: state %v live %v, want IN_PROGRESS under its live lease", in.State, in.Lease.Live)
	}
	queue := listAll(t, s, intent.ListQuery{Filter: intent.Filter{Tenant: "default", States: []intent.State{intent.StateUnknown, intent.StateNeedsReview}}}, 10)
	if want := []string{"lapsed-1", "lapsed-2"}; !slices.Equal(keysOf(queue), want) {
		t.Fatalf("review queue %v, want %v", keysOf(queue), want)
	}
	if got := keysOf(listAll(t, s, intent.ListQuery{Filter: intent.Filter{Tenant: "default", States: []intent.State{intent.StateInProgress}}}, 10)); !slices.Equal(got, []string{"held"}) {
		t.Fatalf("List(IN_PROGRESS) = %v, want [held]", got)
	}

	mustSweep(t, s, etcdstore.SweepReport{})
	a := acquire(t, s, "lapsed-1", alive)
	mustOutcome(t, a, intent.OutcomeReconcile)
	if uint64(a.Lease.Token) <= tokens["lapsed-1"] {
		t.Fatalf("reconcile token %d, want > %d", a.Lease.Token, tokens["lapsed-1"])
	}
	if n := countEvents(get(t, s, "lapsed-1"), intent.EventLeaseLapsed); n != 1 {
		t.Fatalf("after RECONCILE: %d lease-lapsed entries, want still 1", n)
	}
}

// Two replicas run the janitor on one etcd: one sweeps at a time, never
// both at once, and when the leader stops the other takes over.
func TestJanitorOneSweeperAtATime(t *testing.T) {
	c := newCluster(t)
	setup := c.store(t)
	for i := range 6 {
		completeNow(t, setup, lamp(t, fmt.Sprintf("old-%d", i), 1), "SO")
	}
	// Something to mark lapsed, too.
	w := openSession(t, setup, "w", 30*time.Second)
	register(t, setup, lamp(t, "lapsing", 1))
	acquire(t, setup, "lapsing", w)
	lapse(t, setup, w)

	var inPass, maxInPass atomic.Int32
	type replica struct {
		store    *etcdstore.Store
		mu       sync.Mutex
		sweeping bool
		passes   int
		removed  int
		errs     []error
	}
	replicas := make([]*replica, 2)
	for i := range replicas {
		r := &replica{}
		clock := newFakeClock(time.Now().Add(time.Duration(10+i)*365*24*time.Hour), 0)
		// A pass begins with the store reading its clock (Sweep's first
		// step) and ends with its report.
		now := func() time.Time {
			r.mu.Lock()
			if !r.sweeping {
				r.sweeping = true
				n := inPass.Add(1)
				for m := maxInPass.Load(); n > m && !maxInPass.CompareAndSwap(m, n); m = maxInPass.Load() {
				}
			}
			r.mu.Unlock()
			return clock.Now()
		}
		r.store = storeWith(t, c, nil, func(cfg *etcdstore.Config) { cfg.Now = now })
		replicas[i] = r
	}
	passes := func(r *replica) int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.passes
	}
	cancels := make([]context.CancelFunc, 2)
	dones := make([]chan struct{}, 2)
	for i, r := range replicas {
		jctx, cancel := context.WithCancel(context.Background())
		cancels[i], dones[i] = cancel, make(chan struct{})
		t.Cleanup(cancel)
		go func() {
			defer close(dones[i])
			r.store.RunJanitor(jctx, c.cli, fmt.Sprintf("replica-%d", i), 10*time.Millisecond, func(rep etcdstore.SweepReport, err error) {
				r.mu.Lock()
				defer r.mu.Unlock()
				if r.sweeping {
					r.sweeping = false
					inPass.Add(-1)
				}
				r.passes++
				r.removed += rep.Removed
				if err != nil && !errors.Is(err, context.Canceled) {
					r.errs = append(r.errs, err)
				}
			})
		}()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (passes %d and %d)", what, passes(replicas[0]), passes(replicas[1]))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("8 passes", func() bool { return passes(replicas[0])+passes(replicas[1]) >= 8 })
	leader, follower := 0, 1
	if passes(replicas[1]) > 0 {
		leader, follower = 1, 0
	}
	if n := passes(replicas[follower]); n != 0 {
		t.Fatalf("both replicas swept: %d and %d passes, want one sweeper", passes(replicas[leader]), n)
	}
	time.Sleep(50 * time.Millisecond)
	if n := passes(replicas[follower]); n != 0 {
		t.Fatalf("the follower swept %d times while the leader ran", n)
	}

	cancels[leader]()
	select {
	case <-dones[leader]:
	case <-time.After(15 * time.Second):
		t.Fatal("RunJanitor did not return after its context ended")
	}
	stopped := passes(replicas[leader])
	waitFor("the follower to take over", func() bool { return passes(replicas[follower]) >= 5 })
	if n := passes(replicas[leader]); n != stopped {
		t.Fatalf("the stopped leader swept %d more times", n-stopped)
	}
	cancels[follower]()
	<-dones[follower]

	if m := maxInPass.Load(); m > 1 {
		t.Fatalf("%d replicas were inside a pass at one moment, want at most 1", m)
	}
	removed := 0
	for i, r := range replicas {
		r.mu.Lock()
		removed += r.removed
		if len(r.errs) > 0 {
			t.Errorf("replica %d: pass errors %v", i, r.errs)
		}
		r.mu.Unlock()
	}
	if removed != 6 {
		t.Fatalf("the janitors removed %d records, want the 6 expired ones exactly once", removed)
	}
	if in := get(t, setup, "lapsing"); in.State != intent.StateUnknown || countEvents(in, intent.EventLeaseLapsed) != 1 {
		t.Fatalf("lapsing: state %v with %d lapse entries, want UNKNOWN marked once", in.State, countEvents(in, intent.EventLeaseLapsed))
	}
}
