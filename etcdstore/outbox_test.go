package etcdstore_test

// Sub-operations and the outbox against a real etcd: children registered by
// a Complete exist if and only if the completion was recorded.

import (
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

// outboxChildren are the follow-ups a completed purchase must cause, keyed
// from the parent so that every retry names the same ones.
func outboxChildren(t *testing.T, parent string) []intent.Registration {
	t.Helper()
	mail, err := intent.Canonical(map[string]any{"template": "order-confirmation", "to": "c-17@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	invoice, err := intent.Canonical(map[string]any{"template": "invoice", "amount": "89.00", "currency": "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	// Complete, as the server makes them: in the parent's tenant, under
	// the parent.
	return []intent.Registration{
		{Tenant: "default", Key: parent + ":send-confirmation", ParentKey: parent, Params: mail, Labels: map[string]string{"kind": "email"}},
		{Tenant: "default", Key: parent + ":send-invoice", ParentKey: parent, Params: invoice, Labels: map[string]string{"kind": "invoice"}},
	}
}

func completeWithChildren(key string, token fencing.Token, orderID string, children []intent.Registration) intent.Report {
	r := complete(key, token, orderID)
	r.Children = children
	return r
}

func childKeys(in *intent.Intent) []string {
	var out []string
	for _, c := range in.Children {
		out = append(out, c.Key)
	}
	slices.Sort(out)
	return out
}

// Complete with two children registers them in the completion's own
// transaction; Get of the parent lists them; a dispatcher acquires and
// completes them like any intent.
func TestOutboxCompleteRegistersChildren(t *testing.T) {
	c := newCluster(t)
	var writes, reads int
	counted := countingKV(c.cli.KV, &writes, &reads)
	s := storeWith(t, c, counted, func(*etcdstore.Config) {})
	const parent = "purchase-1"
	register(t, s, lamp(t, parent, 1))
	a := acquire(t, s, parent, openSession(t, s, "buyer", 30*time.Second))
	children := outboxChildren(t, parent)

	counted.mu.Lock()
	w0 := writes
	counted.mu.Unlock()
	out, err := report(t, s, completeWithChildren(parent, a.Lease.Token, "SO-1", children))
	if err != nil {
		t.Fatalf("Complete with children: %v", err)
	}
	counted.mu.Lock()
	w1 := writes
	counted.mu.Unlock()
	if w1-w0 != 1 {
		t.Fatalf("Complete with two children cost %d write transactions, want 1", w1-w0)
	}

	p := get(t, s, parent)
	want := []string{children[0].Key, children[1].Key}
	if p.State != intent.StateCompleted || !slices.Equal(childKeys(p), want) {
		t.Fatalf("parent: state %v children %v, want COMPLETED with %v", p.State, childKeys(p), want)
	}
	for _, ch := range p.Children {
		if ch.State != intent.StatePending {
			t.Errorf("parent lists child %s in %v, want PENDING", ch.Key, ch.State)
		}
	}
	if n := countEvents(p, intent.EventChildRegistered); n != 2 {
		t.Errorf("parent history has %d child registrations, want 2", n)
	}
	for i, reg := range children {
		ch := get(t, s, reg.Key)
		switch {
		case ch.State != intent.StatePending || ch.ParentKey != parent:
			t.Fatalf("child %s: state %v parent %q, want PENDING under %q", reg.Key, ch.State, ch.ParentKey, parent)
		case ch.Revision != out.Intent.Revision:
			t.Fatalf("child %s written at revision %d, the completion at %d: want one transaction", reg.Key, ch.Revision, out.Intent.Revision)
		case ch.Fingerprint != intent.Fingerprint(reg.Params) || ch.Labels["kind"] != reg.Labels["kind"]:
			t.Fatalf("child %s: fingerprint %s labels %v, want the registration's", reg.Key, ch.Fingerprint, ch.Labels)
		case countEvents(ch, intent.EventRegistered) != 1:
			t.Fatalf("child %s: history %+v, want one registration", reg.Key, ch.History)
		}
		// The dispatcher acquires children like any intent.
		d := acquire(t, s, reg.Key, openSession(t, s, fmt.Sprintf("dispatcher-%d", i), 30*time.Second))
		mustOutcome(t, d, intent.OutcomeExecute)
		if i == 0 {
			if _, err := report(t, s, complete(reg.Key, d.Lease.Token, "MAIL-1")); err != nil {
				t.Fatalf("child Complete: %v", err)
			}
		}
	}
	p = get(t, s, parent)
	states := map[string]intent.State{}
	for _, ch := range p.Children {
		states[ch.Key] = ch.State
	}
	if states[children[0].Key] != intent.StateCompleted || states[children[1].Key] != intent.StateInProgress {
		t.Fatalf("parent's children %v, want the first COMPLETED and the second IN_PROGRESS", states)
	}

	// A retried Complete (its reply was lost) replays and adds no child.
	again, err := report(t, s, completeWithChildren(parent, a.Lease.Token, "SO-1", children))
	if err != nil || !again.Replayed {
		t.Fatalf("retried Complete: %+v, %v; want a replay", again, err)
	}
	if got := keysOf(listAll(t, s, intent.ListQuery{Filter: intent.Filter{Tenant: "default", ParentKey: parent}}, 10)); !slices.Equal(got, want) {
		t.Fatalf("List(parent) = %v, want %v", got, want)
	}
}

// The outbox under the race the issue names: a stale and a current token
// complete at the same moment, each with children (and the current one's
// retry on a second replica). Whatever the interleaving, the children exist
// if and only if the parent is COMPLETED, and exactly once. In half the
// rounds the current holder fails the intent instead, so that only the
// stale worker offers children.
func TestOutboxChildrenExistIffParentCompleted(t *testing.T) {
	c := newCluster(t)
	replicas := []*etcdstore.Store{c.store(t), c.store(t)}
	s := replicas[0]
	for round := range 20 {
		parent := fmt.Sprintf("race-%02d", round)
		register(t, s, lamp(t, parent, 1))
		old := openSession(t, s, "paused", 30*time.Second)
		staleTok := acquire(t, s, parent, old).Lease.Token
		lapse(t, s, old)
		cur := acquire(t, replicas[1], parent, openSession(t, replicas[1], "reconciler", 30*time.Second))
		mustOutcome(t, cur, intent.OutcomeReconcile)
		children := outboxChildren(t, parent)
		currentCompletes := round%2 == 0

		reports := []intent.Report{completeWithChildren(parent, staleTok, "SO-STALE", children)}
		if currentCompletes {
			r := completeWithChildren(parent, cur.Lease.Token, "SO-CUR", children)
			reports = append(reports, r, r) // and its retry
		} else {
			reports = append(reports, intent.Report{Key: parent, Token: cur.Lease.Token, Kind: intent.ReportFail, Failure: &intent.Failure{Code: "declined"}})
		}
		errs := make([]error, len(reports))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, r := range reports {
			r.Tenant = "default"
			wg.Go(func() {
				<-start
				_, errs[i] = replicas[i%2].Report(ctx(t), r)
			})
		}
		close(start)
		wg.Wait()

		if !errors.Is(errs[0], intent.ErrStaleToken) {
			t.Fatalf("round %d: stale Complete: err = %v, want ErrStaleToken", round, errs[0])
		}
		for i, err := range errs[1:] {
			if err != nil {
				t.Fatalf("round %d: current report %d: %v", round, i, err)
			}
		}
		p := get(t, s, parent)
		listed := keysOf(listAll(t, s, intent.ListQuery{Filter: intent.Filter{Tenant: "default", ParentKey: parent}}, 10))
		var existing []string
		for _, reg := range children {
			in, err := s.Get(ctx(t), "default", reg.Key)
			switch {
			case err == nil:
				existing = append(existing, in.Key)
				if countEvents(in, intent.EventRegistered) != 1 || in.ParentKey != parent {
					t.Fatalf("round %d: child %s history %+v parent %q, want registered once under %s", round, reg.Key, in.History, in.ParentKey, parent)
				}
			case !errors.Is(err, intent.ErrNotFound):
				t.Fatalf("round %d: Get(%s): %v", round, reg.Key, err)
			}
		}
		completed := p.State == intent.StateCompleted
		if completed != currentCompletes {
			t.Fatalf("round %d: parent %v, want COMPLETED %v", round, p.State, currentCompletes)
		}
		if completed && (p.Result.ExternalRefs["supplier_order_id"] != "SO-CUR" || len(existing) != 2 || len(listed) != 2 || len(p.Children) != 2) {
			t.Fatalf("round %d: COMPLETED with result %+v, children existing %v, listed %v, on parent %v; want SO-CUR and both children exactly once", round, p.Result, existing, listed, childKeys(p))
		}
		if !completed && (len(existing) != 0 || len(listed) != 0 || len(p.Children) != 0) {
			t.Fatalf("round %d: parent %v but children existing %v, listed %v; want none", round, p.State, existing, listed)
		}
		if n := countEvents(p, intent.EventChildRegistered); (n == 2) != completed || (n != 0 && n != 2) {
			t.Fatalf("round %d: %d child registrations in the parent's history, parent %v", round, n, p.State)
		}
	}
}

// A child key that already exists (with other terms, another parent, or
// expired) refuses the whole completion: the parent stays IN_PROGRESS, no
// child is created, and the holder may still complete without them. A child
// registered beforehand with the same terms and parent is left alone.
func TestOutboxChildConflicts(t *testing.T) {
	c := newCluster(t)
	clock := newFakeClock(epoch, time.Millisecond)
	s := storeWith(t, c, nil, retentionConfig(clock))

	// A key expired long ago, for the tombstone case.
	completeNow(t, s, lamp(t, "expired-child", 1), "SO-OLD")
	clock.Advance(testRetention + time.Minute)
	if r := sweep(t, s); r.Removed != 1 {
		t.Fatalf("Sweep = %+v, want the old child removed", r)
	}

	cases := []struct {
		name string
		// prepare makes the first child's key exist (or not) and returns
		// the children to complete with.
		prepare   func(t *testing.T, parent string, children []intent.Registration) []intent.Registration
		wantErr   error // nil: the completion is recorded
		wantField string
	}{
		{
			name: "child exists with other params",
			prepare: func(t *testing.T, parent string, children []intent.Registration) []intent.Registration {
				register(t, s, lamp(t, children[0].Key, 2))
				return children
			},
			wantErr: intent.ErrFingerprintMismatch,
		},
		{
			name: "child exists with the same params but no parent",
			prepare: func(t *testing.T, parent string, children []intent.Registration) []intent.Registration {
				reg := children[0]
				reg.ParentKey = ""
				register(t, s, reg)
				return children
			},
			wantErr: intent.ErrFingerprintMismatch,
		},
		{
			name: "child key expired",
			prepare: func(t *testing.T, parent string, children []intent.Registration) []intent.Registration {
				children[0].Key = "expired-child"
				return children
			},
			wantErr: intent.ErrInvalid, wantField: "children[0].key",
		},
		{
			name: "child registered beforehand under this parent with the same params",
			prepare: func(t *testing.T, parent string, children []intent.Registration) []intent.Registration {
				register(t, s, children[0])
				return children
			},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := fmt.Sprintf("conflict-%d", i)
			register(t, s, lamp(t, parent, 1))
			a := acquire(t, s, parent, openSession(t, s, "buyer", 30*time.Second))
			children := tc.prepare(t, parent, outboxChildren(t, parent))
			var firstBefore *intent.Intent
			if in, err := s.Get(ctx(t), "default", children[0].Key); err == nil {
				firstBefore = in
			}
			before := get(t, s, parent)

			_, err := report(t, s, completeWithChildren(parent, a.Lease.Token, "SO-1", children))
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Complete: %v", err)
				}
				p := get(t, s, parent)
				if want := []string{children[0].Key, children[1].Key}; p.State != intent.StateCompleted || !slices.Equal(childKeys(p), want) {
					t.Fatalf("parent %v children %v, want COMPLETED with %v", p.State, childKeys(p), want)
				}
				if first := get(t, s, children[0].Key); first.Revision != firstBefore.Revision {
					t.Fatalf("the existing child was rewritten: revision %d, was %d", first.Revision, firstBefore.Revision)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Complete: err = %v, want %v", err, tc.wantErr)
			}
			var fpm *intent.FingerprintMismatchError
			if errors.As(err, &fpm) && fpm.Key != children[0].Key {
				t.Fatalf("mismatch names %q, want the child %q", fpm.Key, children[0].Key)
			}
			var inv *intent.InvalidError
			if tc.wantField != "" && (!errors.As(err, &inv) || inv.Field != tc.wantField) {
				t.Fatalf("err = %v, want an InvalidError on %q", err, tc.wantField)
			}
			p := get(t, s, parent)
			if p.State != intent.StateInProgress || p.Revision != before.Revision || len(p.Children) != 0 {
				t.Fatalf("parent after the refusal: state %v revision %d (was %d) children %v; want IN_PROGRESS untouched, no children", p.State, p.Revision, before.Revision, childKeys(p))
			}
			if _, err := s.Get(ctx(t), "default", children[1].Key); !errors.Is(err, intent.ErrNotFound) {
				t.Fatalf("second child after the refusal: err = %v, want ErrNotFound", err)
			}
			if firstBefore != nil {
				if first := get(t, s, children[0].Key); first.Revision != firstBefore.Revision {
					t.Fatalf("the conflicting child changed: revision %d, was %d", first.Revision, firstBefore.Revision)
				}
			}
			// Nothing was lost: the holder completes without the children.
			if _, err := report(t, s, complete(parent, a.Lease.Token, "SO-1")); err != nil {
				t.Fatalf("Complete without children after the refusal: %v", err)
			}
		})
	}
}

// A registration names its parent, which must exist. (A child's tenant
// and parent, and a key neither its parent's nor a sibling's, are the
// server's to give and check: server.TestChildrenRefusedTogether.)
func TestChildRegistrationChecks(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "parent", 1))
	sess := openSession(t, s, "w", 30*time.Second)
	acquire(t, s, "parent", sess)

	orphan := lamp(t, "orphan", 1)
	orphan.ParentKey = "no-such-parent"
	optimistic := lamp(t, "orphan-2", 1)
	optimistic.ParentKey = "no-such-parent"
	cases := []struct {
		name      string
		call      func() error
		wantField string
	}{
		{"Register with a missing parent", func() error {
			_, _, err := s.Register(ctx(t), orphan)
			return err
		}, "parent_key"},
		{"Acquire registering with a missing parent", func() error {
			_, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: optimistic.Key, SessionID: sess, RequestID: "r-orphan", Register: &optimistic})
			return err
		}, "parent_key"},
	}
	for _, tc := range cases {
		var inv *intent.InvalidError
		if err := tc.call(); !errors.As(err, &inv) || inv.Field != tc.wantField {
			t.Errorf("%s: err = %v, want an InvalidError on %q", tc.name, err, tc.wantField)
		}
	}
	for _, k := range []string{"orphan", "orphan-2"} {
		if _, err := s.Get(ctx(t), "default", k); !errors.Is(err, intent.ErrNotFound) {
			t.Errorf("Get(%s): err = %v, want ErrNotFound", k, err)
		}
	}
	if in := get(t, s, "parent"); in.State != intent.StateInProgress || len(in.Children) != 0 {
		t.Fatalf("parent: state %v children %v, want IN_PROGRESS with none", in.State, childKeys(in))
	}
	// Register with an existing parent works, and the parent lists it.
	child := lamp(t, "parent:sub", 1)
	child.ParentKey = "parent"
	register(t, s, child)
	if got := childKeys(get(t, s, "parent")); !slices.Equal(got, []string{"parent:sub"}) {
		t.Fatalf("parent's children %v, want [parent:sub]", got)
	}
}
