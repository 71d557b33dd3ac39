package etcdstore_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// storeWithMaxAttempts is a store whose default attempts limit is n.
func storeWithMaxAttempts(t *testing.T, c *cluster, n int) *etcdstore.Store {
	t.Helper()
	cfg := etcdstore.DefaultConfig()
	cfg.MaxAttempts = n
	s, err := etcdstore.New(c.cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// count is how many history entries of kind in has.
func count(in *intent.Intent, kind intent.EventKind) int {
	n := 0
	for _, e := range in.History {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// attemptEnd ends the attempt under token of a worker on session sess
// without a report of its outcome, one way or another, and returns the
// intent as that left it, when the way it ended tells.
type attemptEnd func(t *testing.T, s *etcdstore.Store, key, sess string, token fencing.Token) *intent.Intent

// The three places that see an attempt end without a report.
var attemptEnds = []struct {
	name string
	end  attemptEnd
}{
	{"Acquire after a lapse", func(t *testing.T, s *etcdstore.Store, key, sess string, _ fencing.Token) *intent.Intent {
		lapse(t, s, sess) // the next Acquire notices
		return nil
	}},
	{"janitor sweep", func(t *testing.T, s *etcdstore.Store, key, sess string, _ fencing.Token) *intent.Intent {
		lapse(t, s, sess)
		if _, err := s.Sweep(ctx(t)); err != nil {
			t.Fatalf("Sweep: %v", err)
		}
		return get(t, s, key)
	}},
	{"MarkUnknown", func(t *testing.T, s *etcdstore.Store, key, sess string, token fencing.Token) *intent.Intent {
		out, err := report(t, s, intent.Report{Key: key, Token: token, Kind: intent.ReportMarkUnknown, Reason: "provider timed out"})
		if err != nil {
			t.Fatalf("MarkUnknown: %v", err)
		}
		return out.Intent
	}},
}

// A poison intent (its workers keep dying on it, or keep saying they cannot
// tell) was handed out for ever: every Acquire after a lapse was RECONCILE,
// and after ten lapses it was still UNKNOWN with nobody told. Past its
// attempts limit it now goes to NEEDS_REVIEW, with a reason in its
// history, in the review queue and in the store's counter, whichever path
// saw the last attempt end; Acquire then answers NEEDS_REVIEW and hands out
// nothing.
func TestPoisonIntentGoesToReview(t *testing.T) {
	c := newCluster(t)
	for _, tc := range attemptEnds {
		t.Run(tc.name, func(t *testing.T) {
			const limit = 3
			s := storeWithMaxAttempts(t, c, limit)
			key := "poison-" + strings.ReplaceAll(tc.name, " ", "-")
			register(t, s, lamp(t, key, 1))
			for i := 1; i <= limit; i++ {
				sess := openSession(t, s, "crashing-worker", 30*time.Second)
				a := acquire(t, s, key, sess)
				want := intent.OutcomeReconcile
				if i == 1 {
					want = intent.OutcomeExecute
				}
				if a.Outcome != want {
					t.Fatalf("Acquire %d: outcome %v, want %v", i, a.Outcome, want)
				}
				if in := tc.end(t, s, key, sess, a.Lease.Token); in != nil {
					wantState := intent.StateUnknown
					if i == limit {
						wantState = intent.StateNeedsReview
					}
					if in.State != wantState || in.Attempts != i {
						t.Fatalf("after attempt %d ended: state %v, attempts %d; want %v, %d", i, in.State, in.Attempts, wantState, i)
					}
				}
			}
			late := openSession(t, s, "next-worker", 30*time.Second)
			for i := range 2 {
				a := acquire(t, s, key, late)
				if a.Outcome != intent.OutcomeNeedsReview || a.Lease != nil {
					t.Fatalf("Acquire %d after %d attempts ended: outcome %v, lease %+v; want NEEDS_REVIEW, no lease", i+1, limit, a.Outcome, a.Lease)
				}
			}

			in := get(t, s, key)
			if in.State != intent.StateNeedsReview || in.Attempts != limit || in.MaxAttempts != limit {
				t.Fatalf("Get: state %v, attempts %d of %d; want NEEDS_REVIEW, %d of %d", in.State, in.Attempts, in.MaxAttempts, limit, limit)
			}
			if n := count(in, intent.EventAcquired); n != limit {
				t.Errorf("history has %d ACQUIRED entries, want %d: no lease after the limit", n, limit)
			}
			esc := lastEntry(t, in)
			if esc.Kind != intent.EventEscalated || esc.Principal != "intentd" || !strings.HasPrefix(esc.Reason, "3 attempts ended without a report") || !strings.Contains(esc.Reason, "max_attempts is 3") {
				t.Errorf("last history entry %+v, want intentd's escalation saying 3 attempts ended without a report, max_attempts is 3", esc)
			}
			page, err := s.List(ctx(t), intent.ListQuery{Filter: intent.Filter{Tenant: "default", States: []intent.State{intent.StateNeedsReview}}})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(page.Intents, func(in *intent.Intent) bool { return in.Key == key }) {
				t.Errorf("the review queue (List NEEDS_REVIEW) does not hold %s", key)
			}
			if got := s.Stats().AttemptsExhausted; got != 1 {
				t.Errorf("Stats().AttemptsExhausted = %d, want 1", got)
			}
		})
	}
}

// A registration's own max_attempts wins over the store's default, and a
// Release (a confirmed absence) neither counts nor resets the count: an
// intent that kills every worker that executes it still reaches the limit
// through reconcile → Release → execute → lapse.
func TestPoisonIntentOwnLimitAndRelease(t *testing.T) {
	c := newCluster(t)
	s := storeWithMaxAttempts(t, c, 10)
	const key = "poison-released"
	reg := lamp(t, key, 1)
	reg.MaxAttempts = 2
	register(t, s, reg)

	w1 := openSession(t, s, "w1", 30*time.Second)
	mustOutcome(t, acquire(t, s, key, w1), intent.OutcomeExecute)
	lapse(t, s, w1)
	r := openSession(t, s, "reconciler", 30*time.Second)
	rec := acquire(t, s, key, r)
	mustOutcome(t, rec, intent.OutcomeReconcile)
	out, err := report(t, s, intent.Report{Key: key, Token: rec.Lease.Token, Kind: intent.ReportRelease, Reason: "no order under the operation key"})
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if out.Intent.State != intent.StatePending || out.Intent.Attempts != 1 {
		t.Fatalf("after Release: state %v, attempts %d; want PENDING, 1", out.Intent.State, out.Intent.Attempts)
	}
	mustOutcome(t, acquire(t, s, key, r), intent.OutcomeExecute)
	lapse(t, s, r)
	a := acquire(t, s, key, openSession(t, s, "w3", 30*time.Second))
	if a.Outcome != intent.OutcomeNeedsReview || a.Intent.Attempts != 2 || a.Intent.MaxAttempts != 2 {
		t.Fatalf("Acquire after the second lapse: outcome %v, attempts %d of %d; want NEEDS_REVIEW, 2 of 2", a.Outcome, a.Intent.Attempts, a.Intent.MaxAttempts)
	}
}

// A lease that lapsed (the janitor noted it) and whose worker then reports
// MarkUnknown late, under the same token, is one attempt, not two.
func TestPoisonIntentLeaseCountsOnce(t *testing.T) {
	c := newCluster(t)
	s := storeWithMaxAttempts(t, c, 2)
	const key = "poison-once"
	register(t, s, lamp(t, key, 1))
	w := openSession(t, s, "w", 30*time.Second)
	a := acquire(t, s, key, w)
	lapse(t, s, w)
	if _, err := s.Sweep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	out, err := report(t, s, intent.Report{Key: key, Token: a.Lease.Token, Kind: intent.ReportMarkUnknown, Reason: "late: timed out"})
	if err != nil {
		t.Fatalf("late MarkUnknown under the current token: %v", err)
	}
	if out.Intent.State != intent.StateUnknown || out.Intent.Attempts != 1 {
		t.Fatalf("after a lapse and the same lease's MarkUnknown: state %v, attempts %d; want UNKNOWN, 1", out.Intent.State, out.Intent.Attempts)
	}
}

// A reviewer's Resolve to PENDING (confirmed absent) starts a fresh count:
// the intent executes again and gets its whole limit anew.
func TestPoisonIntentReviewerPendingResetsCount(t *testing.T) {
	c := newCluster(t)
	const limit = 2
	s := storeWithMaxAttempts(t, c, limit)
	const key = "poison-reset"
	register(t, s, lamp(t, key, 1))
	exhaust := func() {
		t.Helper()
		for range limit {
			sess := openSession(t, s, "crashing-worker", 30*time.Second)
			a := acquire(t, s, key, sess)
			if a.Outcome != intent.OutcomeExecute && a.Outcome != intent.OutcomeReconcile {
				t.Fatalf("Acquire: outcome %v, want EXECUTE or RECONCILE", a.Outcome)
			}
			lapse(t, s, sess)
		}
		mustOutcome(t, acquire(t, s, key, openSession(t, s, "probe", 30*time.Second)), intent.OutcomeNeedsReview)
	}
	exhaust()
	in, _, err := resolve(t, s, intent.Resolution{Key: key, Decision: intent.StatePending, Reason: "merchant has no order: run it again"})
	if err != nil {
		t.Fatalf("Resolve PENDING: %v", err)
	}
	if in.State != intent.StatePending || in.Attempts != 0 {
		t.Fatalf("after Resolve PENDING: state %v, attempts %d; want PENDING, 0", in.State, in.Attempts)
	}
	exhaust() // the whole limit again, starting with EXECUTE
	if got := get(t, s, key); got.Attempts != limit || count(got, intent.EventAcquired) != 2*limit {
		t.Fatalf("after the second round: attempts %d, %d ACQUIRED entries; want %d, %d", got.Attempts, count(got, intent.EventAcquired), limit, 2*limit)
	}
}

// The store's default attempts limit is within [1, MaxAttemptsLimit]. (A
// registration's own max_attempts is a rule of intent.proto, checked by
// the server: the store takes it as given.)
func TestMaxAttemptsValidated(t *testing.T) {
	cfg := etcdstore.DefaultConfig()
	for _, n := range []int{0, intent.MaxAttemptsLimit + 1} {
		cfg.MaxAttempts = n
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "MaxAttempts") {
			t.Errorf("Config{MaxAttempts: %d}.Validate() = %v, want an error naming MaxAttempts", n, err)
		}
	}
}
