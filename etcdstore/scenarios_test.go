package etcdstore_test

// The scenarios of the core issue, each against a real etcd.

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// The seed scenario: worker A acquires, submits to the merchant, pauses; its
// lease lapses; worker B gets RECONCILE with a higher token; A resumes and
// reports — refused, state unchanged, A's report in history; B completes; a
// third Acquire replays B's result.
func TestSeedScenarioPausedWorkerIsFenced(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "lamp-order", 1))

	a := openSession(t, s, "worker-a", 30*time.Second)
	la := acquire(t, s, "lamp-order", a)
	mustOutcome(t, la, intent.OutcomeExecute)
	// A "submits to the merchant" (order SO-1 exists now), then pauses
	// past its lease: no heartbeats, the session lapses.
	lapse(t, s, a)

	b := openSession(t, s, "worker-b", 30*time.Second)
	lb := acquire(t, s, "lamp-order", b)
	mustOutcome(t, lb, intent.OutcomeReconcile)
	if lb.Lease.Token <= la.Lease.Token {
		t.Fatalf("B's token %d, want > A's %d", lb.Lease.Token, la.Lease.Token)
	}

	// A resumes and reports what it did.
	_, err := report(t, s, complete("lamp-order", la.Lease.Token, "SO-1"))
	mustStale(t, err, lb.Lease.Token)
	if in := get(t, s, "lamp-order"); in.State != intent.StateInProgress || in.Lease.Token != lb.Lease.Token || in.Result != nil {
		t.Fatalf("after A's stale report: state %v token %d result %v, want IN_PROGRESS under B, no result", in.State, in.Lease.Token, in.Result)
	}

	// B reconciles: it finds SO-1 by operation key and completes with it.
	if _, err := report(t, s, complete("lamp-order", lb.Lease.Token, "SO-1")); err != nil {
		t.Fatalf("B's Complete: %v", err)
	}
	third := acquire(t, s, "lamp-order", openSession(t, s, "worker-c", 30*time.Second))
	mustOutcome(t, third, intent.OutcomeCompleted)
	if got := third.Intent.Result.ExternalRefs["supplier_order_id"]; got != "SO-1" {
		t.Fatalf("replayed order %q, want SO-1", got)
	}

	in := get(t, s, "lamp-order")
	var staleA, acceptedB bool
	for _, e := range in.History {
		staleA = staleA || (e.Kind == intent.EventCompleted && !e.Accepted && e.Token == la.Lease.Token)
		acceptedB = acceptedB || (e.Kind == intent.EventCompleted && e.Accepted && e.Token == lb.Lease.Token)
	}
	if !staleA || !acceptedB {
		t.Fatalf("history %+v: want A's stale Complete kept and B's accepted", in.History)
	}
}

// The same purchase delivered twice, under two queue message ids, is one
// intent: its key is derived from the business identity, never from the
// delivery.
func TestTwoDeliveriesAreOneIntent(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	type delivery struct {
		messageID string
		body      map[string]any
	}
	deliveries := []delivery{
		{"msg-0001", map[string]any{"customer": "c-17", "cart": "cart-9", "approval": 1.0}},
		{"msg-7731", map[string]any{"approval": 1, "cart": "cart-9", "customer": "c-17"}},
	}
	var keys []string
	var created int
	var executes int
	for _, d := range deliveries {
		key, _, err := intent.DeriveKey("purchase", d.body)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
		reg := lamp(t, key, 1)
		_, isNew, err := s.Register(ctx(t), reg)
		if err != nil {
			t.Fatalf("delivery %s: Register: %v", d.messageID, err)
		}
		if isNew {
			created++
		}
		if acquire(t, s, key, openSession(t, s, d.messageID, 30*time.Second)).Outcome == intent.OutcomeExecute {
			executes++
		}
	}
	if keys[0] != keys[1] {
		t.Fatalf("keys %v: two deliveries of one purchase must derive one key", keys)
	}
	if created != 1 || executes != 1 {
		t.Fatalf("created %d, executed %d; want one intent executed once", created, executes)
	}
}

// A changed quantity under the same key is a new customer decision, not a
// retry: refused, and nothing changes.
func TestChangedQuantityIsRefused(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	first := register(t, s, lamp(t, "qty-1", 1))
	sess := openSession(t, s, "w", 30*time.Second)
	changed := lamp(t, "qty-1", 2)

	_, _, err := s.Register(ctx(t), changed)
	var fpm *intent.FingerprintMismatchError
	if !errors.As(err, &fpm) || fpm.Stored != first.Fingerprint {
		t.Fatalf("Register with quantity 2: err = %v, want a fingerprint mismatch against %s", err, first.Fingerprint)
	}
	_, err = s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "qty-1", SessionID: sess, RequestID: "r", Register: &changed})
	if !errors.Is(err, intent.ErrFingerprintMismatch) {
		t.Fatalf("Acquire with quantity 2: err = %v, want ErrFingerprintMismatch", err)
	}
	_, err = s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "qty-1", SessionID: sess, RequestID: "r2", ExpectedFingerprint: intent.Fingerprint(changed.Params)})
	if !errors.Is(err, intent.ErrFingerprintMismatch) {
		t.Fatalf("Acquire expecting quantity 2's fingerprint: err = %v, want ErrFingerprintMismatch", err)
	}
	in := get(t, s, "qty-1")
	if in.State != intent.StatePending || in.Revision != first.Revision || !bytes.Equal(in.Params, first.Params) {
		t.Fatalf("after refusals: state %v revision %d params %s; want PENDING, revision %d, params %s", in.State, in.Revision, in.Params, first.Revision, first.Params)
	}
}

// Complete retried with the same token and result succeeds and returns the
// identical result; with another result it is refused.
func TestCompleteRetry(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "retry-1", 1))
	tok := acquire(t, s, "retry-1", openSession(t, s, "w", 30*time.Second)).Lease.Token

	first, err := report(t, s, complete("retry-1", tok, "SO-5"))
	if err != nil || first.Replayed {
		t.Fatalf("first Complete: %+v, %v; want recorded", first, err)
	}
	// The retry may land on another replica.
	for _, st := range []*etcdstore.Store{s, c.store(t)} {
		again, err := report(t, st, complete("retry-1", tok, "SO-5"))
		if err != nil || !again.Replayed {
			t.Fatalf("retried Complete: %+v, %v; want a replay", again, err)
		}
		if !bytes.Equal(again.Intent.Result.Payload, first.Intent.Result.Payload) || again.Intent.Revision != first.Intent.Revision {
			t.Fatalf("retried Complete returned %q at revision %d, want %q at %d", again.Intent.Result.Payload, again.Intent.Revision, first.Intent.Result.Payload, first.Intent.Revision)
		}
		if _, err := report(t, st, complete("retry-1", tok, "SO-6")); !errors.Is(err, intent.ErrResultMismatch) {
			t.Fatalf("Complete with another result: err = %v, want ErrResultMismatch", err)
		}
	}
	if n := countEvents(get(t, s, "retry-1"), intent.EventCompleted); n != 1 {
		t.Fatalf("%d accepted completions in history, want 1", n)
	}
}

// MarkUnknown, then Acquire: RECONCILE, never EXECUTE. Release after
// reconciling: EXECUTE again, with the same operation keys.
func TestUnknownReconcilesThenReleaseExecutesAgain(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "unknown-1", 1))
	w := openSession(t, s, "w", 30*time.Second)
	first := acquire(t, s, "unknown-1", w)
	mustOutcome(t, first, intent.OutcomeExecute)
	opKey := intent.OperationKey(first.Intent.Key, "create-order")

	if _, err := report(t, s, intent.Report{Key: "unknown-1", Token: first.Lease.Token, Kind: intent.ReportMarkUnknown, Reason: "provider timeout"}); err != nil {
		t.Fatal(err)
	}
	for range 3 { // every worker, every time: reconcile, not execute
		a := acquire(t, s, "unknown-1", openSession(t, s, "r", 30*time.Second))
		if a.Outcome == intent.OutcomeExecute {
			t.Fatal("Acquire after MarkUnknown gave EXECUTE")
		}
		if a.Outcome == intent.OutcomeReconcile {
			// The reconciler asks the merchant by operation key: no order.
			if _, err := report(t, s, intent.Report{Key: "unknown-1", Token: a.Lease.Token, Kind: intent.ReportRelease, Reason: "no order for " + opKey}); err != nil {
				t.Fatalf("Release: %v", err)
			}
			break
		}
	}
	again := acquire(t, s, "unknown-1", w)
	mustOutcome(t, again, intent.OutcomeExecute)
	if got := intent.OperationKey(again.Intent.Key, "create-order"); got != opKey {
		t.Fatalf("operation key after release %q, want the same %q", got, opKey)
	}
	if again.Lease.Token <= first.Lease.Token {
		t.Fatalf("token %d after release, want > %d", again.Lease.Token, first.Lease.Token)
	}
}

// Evidence must not grow a record past what etcd accepts: stale reports
// with large payloads are kept as digests, so that after many of them the
// current holder can still complete with a large result.
func TestLargeStaleEvidenceKeepsRecordSmall(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "big-1", 1))
	big := bytes.Repeat([]byte("x"), 256<<10)
	var stale []fencing.Token
	for i := range 6 {
		w := openSession(t, s, fmt.Sprintf("w%d", i), 30*time.Second)
		stale = append(stale, acquire(t, s, "big-1", w).Lease.Token)
		lapse(t, s, w)
	}
	final := openSession(t, s, "final", 30*time.Second)
	cur := acquire(t, s, "big-1", final).Lease.Token
	for _, tok := range stale {
		r := complete("big-1", tok, "SO-stale")
		r.Result.Payload = big
		_, err := report(t, s, r)
		mustStale(t, err, cur)
	}
	r := complete("big-1", cur, "SO-final")
	r.Result.Payload = big
	if _, err := report(t, s, r); err != nil {
		t.Fatalf("Complete with a large result after %d large stale reports: %v", len(stale), err)
	}
	in := get(t, s, "big-1")
	if !bytes.Equal(in.Result.Payload, big) {
		t.Fatalf("stored payload %d bytes, want %d", len(in.Result.Payload), len(big))
	}
	for _, e := range in.History {
		if e.Result != nil && len(e.Result.Payload) > 0 {
			t.Fatalf("history entry %v keeps a %d-byte payload, want only its digest", e.Kind, len(e.Result.Payload))
		}
		if e.Kind == intent.EventCompleted && e.PayloadSHA256 == "" {
			t.Fatalf("history entry %+v has no payload digest", e)
		}
	}
}
