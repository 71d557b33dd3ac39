package etcdstore_test

// The review lifecycle of issue 3 against a real etcd: a worker's unknown
// outcome goes to a human and back, and Escalate, Resolve and Cancel keep
// every earlier lease fenced.

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

const reviewer = "alice@ops"

func escalate(t *testing.T, s *etcdstore.Store, e intent.Escalation) (*intent.Intent, error) {
	t.Helper()
	if e.Tenant == "" {
		e.Tenant = "default"
	}
	return s.Escalate(ctx(t), e)
}

func resolve(t *testing.T, s *etcdstore.Store, d intent.Resolution) (*intent.Intent, bool, error) {
	t.Helper()
	if d.Tenant == "" {
		d.Tenant = "default"
	}
	if d.Actor == "" {
		d.Actor = reviewer
	}
	if d.RequestID == "" { // the server requires one
		d.RequestID = fmt.Sprintf("resolve-%d", requestSeq.Add(1))
	}
	return s.Resolve(ctx(t), d)
}

func cancelIntent(t *testing.T, s *etcdstore.Store, key string) (*intent.Intent, error) {
	t.Helper()
	return s.Cancel(ctx(t), intent.Cancellation{Tenant: "default", Key: key, Actor: "approver", Reason: "customer withdrew"})
}

// foundOrder is what a reviewer or reconciler found at the supplier.
func foundOrder(orderID string) *intent.Result {
	return &intent.Result{Payload: []byte(`{"order":"` + orderID + `","found_by":"review"}`), ExternalRefs: map[string]string{"supplier_order_id": orderID}}
}

func lastEntry(t *testing.T, in *intent.Intent) intent.Event {
	t.Helper()
	if len(in.History) == 0 {
		t.Fatalf("%s has no history", in.Key)
	}
	return in.History[len(in.History)-1]
}

func kinds(in *intent.Intent) []intent.EventKind {
	out := make([]intent.EventKind, len(in.History))
	for i, e := range in.History {
		out[i] = e.Kind
	}
	return out
}

// The review round trip of issue 3: a worker times out, a reconciler cannot
// decide and escalates, a reviewer resolves COMPLETED with the supplier's
// order id; the original worker's later Acquire replays that result, and
// its late report is fenced and kept.
func TestReviewRoundTrip(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	const key = "review-1"
	register(t, s, lamp(t, key, 1))

	w := openSession(t, s, "worker", 30*time.Second)
	exec := acquire(t, s, key, w)
	mustOutcome(t, exec, intent.OutcomeExecute)
	t1 := exec.Lease.Token
	if _, err := report(t, s, intent.Report{Key: key, Token: t1, Kind: intent.ReportMarkUnknown, Reason: "merchant timed out"}); err != nil {
		t.Fatalf("MarkUnknown: %v", err)
	}

	r := openSession(t, s, "reconciler", 30*time.Second)
	rec := acquire(t, s, key, r)
	mustOutcome(t, rec, intent.OutcomeReconcile)
	t2 := rec.Lease.Token
	if t2 <= t1 {
		t.Fatalf("reconcile token %d, want > %d", t2, t1)
	}
	esc, err := escalate(t, s, intent.Escalation{Key: key, Token: t2, Actor: "reconciler", Reason: "merchant lists no order, card was authorized"})
	if err != nil {
		t.Fatalf("Escalate under the reconciler's token: %v", err)
	}
	if esc.State != intent.StateNeedsReview {
		t.Fatalf("Escalate returned state %v, want NEEDS_REVIEW", esc.State)
	}
	// While a human decides, nobody may act.
	for _, sess := range []string{w, r, openSession(t, s, "another", 30*time.Second)} {
		a := acquire(t, s, key, sess)
		mustOutcome(t, a, intent.OutcomeNeedsReview)
		if a.Lease != nil {
			t.Fatalf("NEEDS_REVIEW Acquire handed out lease %+v, want none", a.Lease)
		}
	}

	in, replayed, err := resolve(t, s, intent.Resolution{
		Key: key, Decision: intent.StateCompleted, Result: foundOrder("SO-77"),
		Actor: reviewer, Reason: "found SO-77 in the merchant portal",
	})
	if err != nil || replayed {
		t.Fatalf("Resolve: replayed %v, err %v; want a fresh decision", replayed, err)
	}
	if in.State != intent.StateCompleted || in.Result.ExternalRefs["supplier_order_id"] != "SO-77" {
		t.Fatalf("Resolve returned state %v result %+v, want COMPLETED with SO-77", in.State, in.Result)
	}

	got := get(t, s, key)
	wantKinds := []intent.EventKind{intent.EventRegistered, intent.EventAcquired, intent.EventMarkedUnknown, intent.EventAcquired, intent.EventEscalated, intent.EventResolved}
	if !slices.Equal(kinds(got), wantKinds) {
		t.Fatalf("history kinds %v, want %v", kinds(got), wantKinds)
	}
	esc2 := got.History[4]
	if !esc2.Accepted || esc2.Token != t2 || esc2.Principal != "reconciler" || esc2.Reason == "" {
		t.Errorf("escalation entry %+v, want accepted under %d by reconciler with its reason", esc2, t2)
	}
	res := lastEntry(t, got)
	t3 := res.Token
	switch {
	case !res.Accepted || !res.Issued:
		t.Errorf("resolution entry %+v, want accepted and issuing a token", res)
	case res.Principal != reviewer || res.Reason != "found SO-77 in the merchant portal" || res.ResolvedState != intent.StateCompleted:
		t.Errorf("resolution entry principal %q reason %q state %v, want %q, the reviewer's reason, COMPLETED", res.Principal, res.Reason, res.ResolvedState, reviewer)
	case res.Result == nil || res.Result.ExternalRefs["supplier_order_id"] != "SO-77":
		t.Errorf("resolution entry result %+v, want SO-77", res.Result)
	}
	for _, e := range got.History[:len(got.History)-1] {
		if e.Token >= t3 {
			t.Errorf("resolution token %d, want > every earlier token (entry %+v)", t3, e)
		}
	}
	if got.Lease == nil || got.Lease.Token != t3 || got.Lease.Live {
		t.Errorf("lease after resolve %+v, want token %d held by no one", got.Lease, t3)
	}
	if got.State != intent.StateCompleted || got.CompletedAt.IsZero() || got.RetainUntil.IsZero() {
		t.Errorf("state %v completed_at %v retain_until %v, want COMPLETED with both times set", got.State, got.CompletedAt, got.RetainUntil)
	}

	// The original worker comes back: on any replica, Acquire replays the
	// reviewer's result.
	for i, st := range []*etcdstore.Store{s, c.store(t)} {
		sess := w
		if i > 0 {
			sess = openSession(t, st, "worker-again", 30*time.Second)
		}
		a := acquire(t, st, key, sess)
		mustOutcome(t, a, intent.OutcomeCompleted)
		if a.Lease != nil || a.Intent.Result.ExternalRefs["supplier_order_id"] != "SO-77" {
			t.Fatalf("replay %d: lease %+v result %+v, want no lease and SO-77", i, a.Lease, a.Intent.Result)
		}
	}
	// Its late Complete, under its old token, is fenced and kept as evidence.
	_, err = report(t, s, complete(key, t1, "SO-1"))
	mustStale(t, err, t3)
	_, err = report(t, s, intent.Report{Key: key, Token: t2, Kind: intent.ReportRelease, Reason: "late"})
	mustStale(t, err, t3)
	after := get(t, s, key)
	if after.State != intent.StateCompleted || after.Result.ExternalRefs["supplier_order_id"] != "SO-77" || after.Lease.Token != t3 {
		t.Fatalf("after late reports: state %v result %+v token %d, want COMPLETED SO-77 under %d", after.State, after.Result, after.Lease.Token, t3)
	}
	i := slices.IndexFunc(after.History, func(e intent.Event) bool {
		return e.Kind == intent.EventCompleted && !e.Accepted && e.Token == t1
	})
	if i < 0 || after.History[i].Result.ExternalRefs["supplier_order_id"] != "SO-1" {
		t.Fatalf("history %+v: want the worker's late Complete with SO-1 kept unaccepted under %d", after.History, t1)
	}
	if n := countEvents(after, intent.EventResolved); n != 1 {
		t.Fatalf("%d resolutions in history, want 1", n)
	}
}

// reviewFixture is an intent brought into some condition, and the worker
// that held it.
type reviewFixture struct {
	s      *etcdstore.Store
	key    string
	worker string        // the session that acquired it, "" if none
	token  fencing.Token // that session's token
	before *intent.Intent
}

type setupFunc func(t *testing.T, s *etcdstore.Store, key string) *reviewFixture

func pendingIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	register(t, s, lamp(t, key, 1))
	return &reviewFixture{s: s, key: key}
}

// leasedIntent is IN_PROGRESS under a live EXECUTE lease.
func leasedIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	f := pendingIntent(t, s, key)
	f.worker = openSession(t, s, "holder", 30*time.Second)
	a := acquire(t, s, key, f.worker)
	mustOutcome(t, a, intent.OutcomeExecute)
	f.token = a.Lease.Token
	return f
}

// unknownIntent was marked UNKNOWN by its worker.
func unknownIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	f := leasedIntent(t, s, key)
	if _, err := report(t, s, intent.Report{Key: key, Token: f.token, Kind: intent.ReportMarkUnknown, Reason: "timeout"}); err != nil {
		t.Fatalf("MarkUnknown: %v", err)
	}
	return f
}

// lapsedIntent is IN_PROGRESS in etcd, but its holder's session is gone and
// no janitor has swept it yet.
func lapsedIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	f := leasedIntent(t, s, key)
	lapse(t, s, f.worker)
	return f
}

// reviewIntent was escalated by its worker under its token.
func reviewIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	f := unknownIntent(t, s, key)
	if _, err := escalate(t, s, intent.Escalation{Key: key, Token: f.token, Actor: "holder", Reason: "cannot tell"}); err != nil {
		t.Fatalf("Escalate: %v", err)
	}
	return f
}

// supersededIntent is held by a reconciler after its first worker lapsed;
// token is the first worker's, now stale.
func supersededIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	f := lapsedIntent(t, s, key)
	mustOutcome(t, acquire(t, s, key, openSession(t, s, "reconciler", 30*time.Second)), intent.OutcomeReconcile)
	return f
}

// resolvedPendingIntent was escalated and sent back to PENDING by a
// reviewer under request id "rq-<key>".
func resolvedPendingIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	f := reviewIntent(t, s, key)
	if _, _, err := resolve(t, s, intent.Resolution{Key: key, Decision: intent.StatePending, Reason: "absent", RequestID: "rq-" + key}); err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return f
}

func completedIntent(t *testing.T, s *etcdstore.Store, key string) *reviewFixture {
	t.Helper()
	f := leasedIntent(t, s, key)
	if _, err := report(t, s, complete(key, f.token, "SO-C")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return f
}

// staleReportIsFenced checks that the fixture's worker can no longer report
// and that the intent keeps its state.
func staleReportIsFenced(t *testing.T, f *reviewFixture, after *intent.Intent) {
	t.Helper()
	if after.Lease == nil || after.Lease.Token <= f.token {
		t.Fatalf("lease after the decision %+v, want a token > the worker's %d", after.Lease, f.token)
	}
	_, err := report(t, f.s, complete(f.key, f.token, "SO-LATE"))
	mustStale(t, err, after.Lease.Token)
	_, err = f.s.Heartbeat(ctx(t), "default", f.worker, []intent.HeldLease{{Key: f.key, Token: f.token}})
	if !errors.Is(err, intent.ErrStaleToken) {
		t.Fatalf("holder's Heartbeat naming %d: err = %v, want ErrStaleToken", f.token, err)
	}
	if again := get(t, f.s, f.key); again.State != after.State || again.Lease.Token != after.Lease.Token {
		t.Fatalf("after stale reports: state %v token %d, want %v %d", again.State, again.Lease.Token, after.State, after.Lease.Token)
	}
}

// TestEscalateResolveCancel is the semantics table of the reviewer's calls:
// what each does from each state, what it refuses (changing nothing), and
// that every decision fences the earlier leases.
func TestEscalateResolveCancel(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	cases := []struct {
		name      string
		setup     setupFunc
		act       func(t *testing.T, f *reviewFixture) error
		wantErr   error        // nil: the call succeeds
		wantState intent.State // effective state after the call
		evidence  bool         // a refusal that is kept in history
		check     func(t *testing.T, f *reviewFixture, after *intent.Intent)
	}{
		{
			name:  "reviewer escalates a live lease without force",
			setup: leasedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := escalate(t, f.s, intent.Escalation{Key: f.key, Actor: reviewer, Reason: "looks stuck"})
				return err
			},
			wantErr: intent.ErrLeaseHeld, wantState: intent.StateInProgress,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				// The holder is untouched: its report still counts.
				if _, err := report(t, f.s, complete(f.key, f.token, "SO-H")); err != nil {
					t.Fatalf("holder's Complete after the refused escalation: %v", err)
				}
			},
		},
		{
			name:  "reviewer escalates a live lease with force",
			setup: leasedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := escalate(t, f.s, intent.Escalation{Key: f.key, Actor: reviewer, Reason: "looks stuck", Force: true})
				return err
			},
			wantState: intent.StateNeedsReview,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				e := lastEntry(t, after)
				if e.Kind != intent.EventEscalated || !e.Issued || e.Token != after.Lease.Token || e.Principal != reviewer {
					t.Fatalf("escalation entry %+v, want one issuing token %d by %s", e, after.Lease.Token, reviewer)
				}
				staleReportIsFenced(t, f, after)
				mustOutcome(t, acquire(t, f.s, f.key, openSession(t, f.s, "w2", 30*time.Second)), intent.OutcomeNeedsReview)
			},
		},
		{
			name:  "reviewer escalates a PENDING intent",
			setup: pendingIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := escalate(t, f.s, intent.Escalation{Key: f.key, Actor: reviewer, Reason: "suspicious amount"})
				return err
			},
			wantState: intent.StateNeedsReview,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				mustOutcome(t, acquire(t, f.s, f.key, openSession(t, f.s, "w", 30*time.Second)), intent.OutcomeNeedsReview)
			},
		},
		{
			name:  "reviewer escalates an intent whose holder lapsed, without force",
			setup: lapsedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := escalate(t, f.s, intent.Escalation{Key: f.key, Actor: reviewer, Reason: "worker vanished"})
				return err
			},
			wantState: intent.StateNeedsReview,
		},
		{
			name:  "escalating an intent that waits for review changes nothing",
			setup: reviewIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := escalate(t, f.s, intent.Escalation{Key: f.key, Actor: reviewer, Reason: "again"})
				return err
			},
			wantState: intent.StateNeedsReview,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				if after.Revision != f.before.Revision || countEvents(after, intent.EventEscalated) != 1 {
					t.Fatalf("revision %d (was %d), %d escalations; want no write and one escalation", after.Revision, f.before.Revision, countEvents(after, intent.EventEscalated))
				}
			},
		},
		{
			name:  "escalating a COMPLETED intent is refused",
			setup: completedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := escalate(t, f.s, intent.Escalation{Key: f.key, Actor: reviewer, Reason: "late doubt"})
				return err
			},
			wantErr: intent.ErrInvalidTransition, wantState: intent.StateCompleted,
		},
		{
			name:  "worker escalates under a superseded token",
			setup: supersededIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := escalate(t, f.s, intent.Escalation{Key: f.key, Token: f.token, Actor: "holder", Reason: "resumed"})
				if !errors.As(err, new(*intent.StaleTokenError)) {
					t.Errorf("err = %v, want a *intent.StaleTokenError", err)
				}
				return err
			},
			wantErr: intent.ErrStaleToken, wantState: intent.StateInProgress, evidence: true,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				e := lastEntry(t, after)
				if e.Kind != intent.EventEscalated || e.Accepted || e.Token != f.token {
					t.Fatalf("last entry %+v, want the stale escalation kept unaccepted under %d", e, f.token)
				}
			},
		},
		{
			name:  "resolve on PENDING is refused",
			setup: pendingIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-X"), Reason: "r"})
				return err
			},
			wantErr: intent.ErrInvalidTransition, wantState: intent.StatePending,
		},
		{
			name:  "resolve of a live lease without force is refused",
			setup: leasedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-X"), Reason: "r"})
				return err
			},
			wantErr: intent.ErrLeaseHeld, wantState: intent.StateInProgress,
		},
		{
			name:  "resolve of a live lease with force decides and fences the holder",
			setup: leasedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-F"), Reason: "found it", Force: true})
				return err
			},
			wantState: intent.StateCompleted,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				if after.Result.ExternalRefs["supplier_order_id"] != "SO-F" {
					t.Fatalf("result %+v, want the reviewer's SO-F", after.Result)
				}
				staleReportIsFenced(t, f, after)
			},
		},
		{
			name:  "resolve PENDING: the next Acquire executes with the same key and a higher token",
			setup: reviewIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StatePending, Reason: "merchant confirms no order"})
				return err
			},
			wantState: intent.StatePending,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				staleReportIsFenced(t, f, after)
				a := acquire(t, f.s, f.key, openSession(t, f.s, "next", 30*time.Second))
				mustOutcome(t, a, intent.OutcomeExecute)
				if a.Lease.Token <= after.Lease.Token || a.Lease.Token <= f.token {
					t.Fatalf("EXECUTE token %d, want > the decision's %d and the old worker's %d", a.Lease.Token, after.Lease.Token, f.token)
				}
				if got, want := intent.OperationKey(a.Intent.Key, "create-order"), intent.OperationKey(f.key, "create-order"); got != want {
					t.Fatalf("operation key %q, want the same %q", got, want)
				}
			},
		},
		{
			name:  "resolve FAILED is final",
			setup: unknownIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateFailed, Failure: &intent.Failure{Code: "declined"}, Reason: "card declined"})
				return err
			},
			wantState: intent.StateFailed,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				a := acquire(t, f.s, f.key, openSession(t, f.s, "w", 30*time.Second))
				mustOutcome(t, a, intent.OutcomeFailed)
				if a.Intent.Failure == nil || a.Intent.Failure.Code != "declined" || after.RetainUntil.IsZero() {
					t.Fatalf("failure %+v retain_until %v, want declined and a retention", a.Intent.Failure, after.RetainUntil)
				}
				if _, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-2"), Reason: "changed my mind"}); !errors.Is(err, intent.ErrInvalidTransition) {
					t.Fatalf("second decision on FAILED: err = %v, want ErrInvalidTransition", err)
				}
				staleReportIsFenced(t, f, after)
			},
		},
		{
			name:  "resolve CANCELLED is final",
			setup: reviewIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateCancelled, Reason: "customer withdrew"})
				return err
			},
			wantState: intent.StateCancelled,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				mustOutcome(t, acquire(t, f.s, f.key, openSession(t, f.s, "w", 30*time.Second)), intent.OutcomeCancelled)
				if _, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StatePending, Reason: "undo"}); !errors.Is(err, intent.ErrInvalidTransition) {
					t.Fatalf("Resolve PENDING on CANCELLED: err = %v, want ErrInvalidTransition", err)
				}
			},
		},
		{
			name:  "resolve of an intent whose holder lapsed needs no force",
			setup: lapsedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-L"), Reason: "found it"})
				return err
			},
			wantState: intent.StateCompleted,
		},
		{
			name:  "retrying the same Resolve is a replay",
			setup: reviewIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				d := intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-R"), Reason: "found it", RequestID: "rq-" + f.key}
				first, replayed, err := resolve(t, f.s, d)
				if err != nil || replayed {
					t.Fatalf("first Resolve: replayed %v err %v", replayed, err)
				}
				for _, st := range []*etcdstore.Store{f.s, c.store(t)} {
					again, replayed, err := resolve(t, st, d)
					if err != nil || !replayed {
						t.Fatalf("retried Resolve: replayed %v, err %v; want a replay", replayed, err)
					}
					if again.Revision != first.Revision || again.State != intent.StateCompleted {
						t.Fatalf("retried Resolve: state %v revision %d, want COMPLETED at %d", again.State, again.Revision, first.Revision)
					}
				}
				return nil
			},
			wantState: intent.StateCompleted,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				if n := countEvents(after, intent.EventResolved); n != 1 {
					t.Fatalf("%d resolutions in history, want 1", n)
				}
			},
		},
		{
			name:  "a request id reused for another decision is refused",
			setup: resolvedPendingIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StateCancelled, Reason: "absent", RequestID: "rq-" + f.key})
				var inv *intent.InvalidError
				if !errors.As(err, &inv) || inv.Field != "request_id" {
					t.Errorf("err = %v, want an InvalidError on request_id", err)
				}
				return err
			},
			wantErr: intent.ErrInvalid, wantState: intent.StatePending,
		},
		{
			name:  "a second decision under a new request id is refused once decided",
			setup: resolvedPendingIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, _, err := resolve(t, f.s, intent.Resolution{Key: f.key, Decision: intent.StatePending, Reason: "absent"})
				return err
			},
			wantErr: intent.ErrInvalidTransition, wantState: intent.StatePending,
		},
		{
			name:  "cancel PENDING, then cancel again",
			setup: pendingIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				in, err := cancelIntent(t, f.s, f.key)
				if err != nil {
					return err
				}
				again, err := cancelIntent(t, f.s, f.key)
				if err != nil || again.Revision != in.Revision || again.State != intent.StateCancelled {
					t.Fatalf("second Cancel: %v, %v; want CANCELLED unchanged at revision %d", again, err, in.Revision)
				}
				return nil
			},
			wantState: intent.StateCancelled,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				if n := countEvents(after, intent.EventCancelled); n != 1 {
					t.Fatalf("%d cancellations in history, want 1", n)
				}
				e := lastEntry(t, after)
				if e.Principal != "approver" || e.Reason != "customer withdrew" || after.RetainUntil.IsZero() {
					t.Fatalf("cancellation entry %+v retain_until %v, want who and why and a retention", e, after.RetainUntil)
				}
				mustOutcome(t, acquire(t, f.s, f.key, openSession(t, f.s, "w", 30*time.Second)), intent.OutcomeCancelled)
			},
		},
		{
			name:  "cancel IN_PROGRESS is refused",
			setup: leasedIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := cancelIntent(t, f.s, f.key)
				return err
			},
			wantErr: intent.ErrInvalidTransition, wantState: intent.StateInProgress,
		},
		{
			name:  "cancel NEEDS_REVIEW is refused",
			setup: reviewIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := cancelIntent(t, f.s, f.key)
				return err
			},
			wantErr: intent.ErrInvalidTransition, wantState: intent.StateNeedsReview,
		},
		{
			name:  "a report under the current token while NEEDS_REVIEW is refused and kept",
			setup: reviewIntent,
			act: func(t *testing.T, f *reviewFixture) error {
				_, err := report(t, f.s, complete(f.key, f.token, "SO-E"))
				var te *intent.TransitionError
				if !errors.As(err, &te) || !te.Evidence || te.State != intent.StateNeedsReview {
					t.Errorf("err = %#v, want a *intent.TransitionError in NEEDS_REVIEW with Evidence", err)
				}
				// A retry adds no second evidence entry.
				if _, err2 := report(t, f.s, complete(f.key, f.token, "SO-E")); !errors.Is(err2, intent.ErrInvalidTransition) {
					t.Errorf("retried report: err = %v, want ErrInvalidTransition", err2)
				}
				return err
			},
			wantErr: intent.ErrInvalidTransition, wantState: intent.StateNeedsReview, evidence: true,
			check: func(t *testing.T, f *reviewFixture, after *intent.Intent) {
				e := lastEntry(t, after)
				if e.Kind != intent.EventCompleted || e.Accepted || e.Token != f.token || e.Result.ExternalRefs["supplier_order_id"] != "SO-E" {
					t.Fatalf("last entry %+v, want the refused Complete with SO-E unaccepted under %d", e, f.token)
				}
				if len(after.History) != len(f.before.History)+1 || after.Result != nil {
					t.Fatalf("history grew by %d, result %+v; want one evidence entry and no result", len(after.History)-len(f.before.History), after.Result)
				}
			},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.setup(t, s, fmt.Sprintf("erc-%02d", i))
			f.before = get(t, s, f.key)
			err := tc.act(t, f)
			if tc.wantErr == nil && err != nil {
				t.Fatalf("err = %v, want success", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			after := get(t, s, f.key)
			if after.State != tc.wantState {
				t.Fatalf("state %v, want %v", after.State, tc.wantState)
			}
			if tc.wantErr != nil && !tc.evidence && (after.Revision != f.before.Revision || len(after.History) != len(f.before.History)) {
				t.Fatalf("refusal wrote: revision %d history %d, was %d %d", after.Revision, len(after.History), f.before.Revision, len(f.before.History))
			}
			if tc.check != nil {
				tc.check(t, f, after)
			}
		})
	}
}

// A retried Resolve (same request id) returns replayed, which is also how
// it recognizes its own write after an ambiguous commit. A stale report
// that lands in between must not turn the retry into a refusal of a
// decision that was recorded.
func TestResolveRetryAfterStaleEvidenceIsReplayed(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	f := reviewIntent(t, s, "retry-resolve")
	d := intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-9"), Reason: "found it", RequestID: "rq-1"}
	first, _, err := resolve(t, s, d)
	if err != nil {
		t.Fatal(err)
	}
	// The paused worker reports late: stale, kept as evidence.
	_, err = report(t, s, complete(f.key, f.token, "SO-9"))
	mustStale(t, err, first.Lease.Token)

	for _, st := range []*etcdstore.Store{s, c.store(t)} {
		again, replayed, err := resolve(t, st, d)
		if err != nil || !replayed {
			t.Fatalf("retried Resolve after a stale report: replayed %v, err %v; want a replay", replayed, err)
		}
		if again.State != intent.StateCompleted || again.Result.ExternalRefs["supplier_order_id"] != "SO-9" {
			t.Fatalf("retry: state %v result %+v, want COMPLETED with SO-9", again.State, again.Result)
		}
	}
	if n := countEvents(get(t, s, f.key), intent.EventResolved); n != 1 {
		t.Fatalf("%d resolutions in history, want 1", n)
	}
}

// The same race on the read-back path: the reply to the reviewer's decision
// is lost after etcd applied it, and a stale report lands before the store
// reads back. The decision was recorded, so Resolve must report success.
func TestResolveAmbiguousCommitWithInterleavedEvidence(t *testing.T) {
	c := newCluster(t)
	reliable := c.store(t)
	f := reviewIntent(t, reliable, "ambiguous-resolve")
	injected := false
	kv := &hookedKV{KV: c.cli.KV}
	kv.afterCommit = func(write bool, resp *clientv3.TxnResponse, err error) (*clientv3.TxnResponse, error) {
		if !write || err != nil || !resp.Succeeded || injected {
			return resp, err
		}
		injected = true
		// The late worker's report reaches etcd first, then our reply is lost.
		if _, rerr := reliable.Report(ctx(t), intent.Report{Tenant: "default", Key: f.key, Token: f.token, Kind: intent.ReportComplete, Result: foundOrder("SO-1")}); !errors.Is(rerr, intent.ErrStaleToken) {
			t.Errorf("injected late report: err = %v, want ErrStaleToken", rerr)
		}
		return nil, status.Error(codes.Unavailable, "reply lost after commit")
	}
	s := storeWith(t, c, kv, func(*etcdstore.Config) {})
	in, replayed, err := resolve(t, s, intent.Resolution{Key: f.key, Decision: intent.StateCompleted, Result: foundOrder("SO-1"), Reason: "found it", RequestID: "rq-ambiguous"})
	if !injected {
		t.Fatal("the fault was not injected")
	}
	got := get(t, reliable, f.key)
	if got.State != intent.StateCompleted || countEvents(got, intent.EventResolved) != 1 {
		t.Fatalf("stored: state %v, %d resolutions; want the decision recorded once", got.State, countEvents(got, intent.EventResolved))
	}
	if err != nil {
		t.Fatalf("Resolve: the decision is stored (state %v) but Resolve returned err = %v", got.State, err)
	}
	if in.State != intent.StateCompleted || !replayed || in.Result.ExternalRefs["supplier_order_id"] != "SO-1" {
		t.Fatalf("Resolve returned state %v replayed %v result %+v, want the recorded COMPLETED decision, recognized on read-back", in.State, replayed, in.Result)
	}
}

// Escalate under a worker's token is "fenced like a report": a superseded
// token is told so and kept as evidence, also when the intent already waits
// for review (a report under the same token is refused as stale).
func TestStaleEscalateWhileNeedsReview(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	f := leasedIntent(t, s, "stale-escalate")
	if _, err := escalate(t, s, intent.Escalation{Key: f.key, Actor: reviewer, Reason: "stuck", Force: true}); err != nil {
		t.Fatal(err)
	}
	cur := get(t, s, f.key).Lease.Token
	_, err := report(t, s, intent.Report{Key: f.key, Token: f.token, Kind: intent.ReportMarkUnknown, Reason: "timeout"})
	mustStale(t, err, cur)

	_, err = escalate(t, s, intent.Escalation{Key: f.key, Token: f.token, Actor: "holder", Reason: "merchant shows two orders"})
	mustStale(t, err, cur)
	e := lastEntry(t, get(t, s, f.key))
	if e.Kind != intent.EventEscalated || e.Accepted || e.Token != f.token {
		t.Fatalf("last entry %+v, want the stale escalation kept unaccepted under %d", e, f.token)
	}
}
