package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// Scenario 1. The merchant creates the order, and its reply is lost on the
// way back. Run's Execute sees an error, so the intent is marked UNKNOWN,
// never retried blind. The next Run reconciles: it asks the merchant by
// the same operation key and finds the same order; no payment exists yet
// under the payment's operation key, so it executes again, and the
// merchant replays the order for that key while the payment is made once.
func TestLostReplyAfterOrderCreated(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const key = "s1-purchase-lamp"
	w.register(t, key, purchase("desk lamp", 1, 8900))

	cut := &fakes.CutReply{Cut: fakes.CutFirst(http.MethodPost, "/orders")}
	s := w.shop(cut)
	var executes atomic.Int32
	var foundOrder string
	task := client.Task{
		Key: key,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			executes.Add(1)
			o, err := s.CreateOrder(ctx, att.OperationKey("create-order"), orderOf(att))
			if err != nil {
				return nil, err
			}
			amount, currency := amountOf(att)
			a, err := s.Authorize(ctx, att.OperationKey("authorize-payment"), amount, currency, att.Key)
			if err != nil {
				return nil, err
			}
			return refs(refOrder, o.ID, refPayment, a.ID), nil
		},
		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			orderKey, payKey := att.OperationKey("create-order"), att.OperationKey("authorize-payment")
			o, ordered, err := s.FindOrder(ctx, orderKey)
			if err != nil {
				return client.Evidence{}, err
			}
			rec, paid, err := s.LookupPayment(ctx, payKey)
			if err != nil {
				return client.Evidence{}, err
			}
			switch {
			case ordered && paid:
				var a fakes.Authorization
				if rec.InFlight || rec.Status/100 != 2 || json.Unmarshal(rec.Body, &a) != nil {
					return client.Undecided(fmt.Sprintf("order %s, and under %s a payment that is in flight or failed (HTTP %d)", o.ID, payKey, rec.Status)), nil
				}
				return client.Found(refs(refOrder, o.ID, refPayment, a.ID)), nil
			case ordered && !paid:
				foundOrder = o.ID
				return client.Absent(fmt.Sprintf("order %s exists under %s, no payment under %s: executing again replays the order by its key", o.ID, orderKey, payKey)), nil
			case !ordered && !paid:
				return client.Absent("neither an order nor a payment under " + att.Key), nil
			default:
				return client.Undecided(fmt.Sprintf("payment under %s without an order under %s", payKey, orderKey)), nil
			}
		},
	}
	sess := openSession(t, w.c, "s1-worker", 10*time.Second)

	out, err := sess.Run(ctx, task)
	if !errors.Is(err, fakes.ErrReplyCut) || out == nil || out.Intent.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Fatalf("first Run: want the cut reply's error and UNKNOWN, got %s", outcomeOf(out, err))
	}
	if got := w.merchant.Count(); got != 1 {
		t.Fatalf("after the cut reply the merchant holds %d orders, want 1 (the effect happened)", got)
	}

	out, err = sess.Run(ctx, task)
	got := mustComplete(t, "second Run", out, err)
	orders := w.merchant.Orders()
	if foundOrder == "" || got[refOrder] != foundOrder || len(orders) != 1 || orders[0].ID != foundOrder {
		t.Errorf("reconcile found order %q, the result says %q, the merchant holds %v: want one order, the same id everywhere", foundOrder, got[refOrder], orders)
	}
	if n := w.merchant.Requests(); n != 2 {
		t.Errorf("merchant saw %d order requests, want 2 (the cut one and its replay under the same key)", n)
	}
	auths := w.payments.Authorizations()
	if len(auths) != 1 || got[refPayment] != auths[0].ID {
		t.Errorf("payment provider holds %v, result says %q: want exactly that one authorization", auths, got[refPayment])
	}
	if n := executes.Load(); n != 2 {
		t.Errorf("Execute ran %d times, want 2 (the lost one, and once after the confirmed absence of the payment)", n)
	}

	in := get(t, w.c, key)
	for _, k := range []intentv1.HistoryEntry_Kind{
		intentv1.HistoryEntry_KIND_MARKED_UNKNOWN, intentv1.HistoryEntry_KIND_RELEASED, intentv1.HistoryEntry_KIND_COMPLETED,
	} {
		if len(entries(in, k)) != 1 {
			t.Errorf("history has %d %s entries, want 1:\n%s", len(entries(in, k)), k, story(in))
		}
	}
	if !hasAcquired(in, intentv1.LeaseMode_LEASE_MODE_RECONCILE) {
		t.Errorf("history has no RECONCILE lease:\n%s", story(in))
	}

	out, err = sess.Run(ctx, task)
	if again := mustComplete(t, "third Run", out, err); out.Executed || again[refOrder] != got[refOrder] {
		t.Errorf("third Run: want the stored result replayed without executing, got %s", outcomeOf(out, err))
	}
	if w.merchant.Count() != 1 || w.payments.Count() != 1 {
		t.Errorf("world after the replay: %d orders, %d authorizations; want 1 and 1", w.merchant.Count(), w.payments.Count())
	}
}

// Scenario 2. Worker A (a process) places the order and is stopped
// (SIGSTOP) before it reports, for longer than its session TTL. B waits
// for A's lease to lapse, gets RECONCILE, finds the order by its operation
// key and completes. A resumes (SIGCONT) with its answer in hand and
// reports it: refused as stale, kept in the history as evidence. One order.
func TestPausedWorkerRefusedAfterTakeover(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const key = "s2-purchase-chair"
	w.register(t, key, purchase("office chair", 1, 24900))

	a := startChild(t, w.childSpec(modePause, key))
	a.expect("session", 20*time.Second)
	done := a.expect("effect-done", 20*time.Second)
	orderA, tokenA := strings.Fields(done)[0], field(done, "token")
	a.signal(syscall.SIGSTOP)
	stoppedAt := time.Now()

	b := openSession(t, w.c, "s2-worker-b", 10*time.Second)
	out, err := b.Run(ctx, w.shop(nil).orderTask(key))
	got := mustComplete(t, "B's Run", out, err)
	if out.Executed || got[refOrder] != orderA {
		t.Errorf("B: want the order A placed (%s) found by reconciling, not executed again; got %s", orderA, outcomeOf(out, err))
	}
	t.Logf("B completed %v after A stopped", time.Since(stoppedAt).Round(10*time.Millisecond))

	a.signal(syscall.SIGCONT)
	a.send("resume")
	res := a.expect("run-result", 20*time.Second)
	if field(res, "stale") != "true" {
		t.Errorf("A after resuming: want its Complete refused as stale, got %q", res)
	}
	a.expect("exit", 10*time.Second)
	a.wait(10 * time.Second)

	if n, r := w.merchant.Count(), w.merchant.Requests(); n != 1 || r != 1 {
		t.Errorf("merchant holds %d orders after %d requests, want 1 and 1", n, r)
	}
	in := get(t, w.c, key)
	if in.GetState() != intentv1.State_STATE_COMPLETED || in.GetResult().GetExternalRefs()[refOrder] != orderA {
		t.Errorf("intent is %s with %v, want COMPLETED with %s", in.GetState(), in.GetResult().GetExternalRefs(), orderA)
	}
	var accepted, evidence int
	for _, e := range entries(in, intentv1.HistoryEntry_KIND_COMPLETED) {
		switch {
		case e.GetAccepted() && e.GetToken() == in.GetLease().GetToken():
			accepted++
		case !e.GetAccepted() && strconv.FormatUint(e.GetToken(), 10) == tokenA && e.GetResult().GetExternalRefs()[refOrder] == orderA:
			evidence++
		}
	}
	if accepted != 1 || evidence != 1 {
		t.Errorf("want B's Complete accepted and A's (token %s, %s) kept as evidence with accepted=false; history:\n%s", tokenA, orderA, story(in))
	}
	if len(entries(in, intentv1.HistoryEntry_KIND_LEASE_LAPSED)) == 0 {
		t.Errorf("history does not show A's lease lapsing:\n%s", story(in))
	}
}

// Scenario 3. Worker A (a process) places the order and is killed
// (SIGKILL) before it records anything. Once A's lease lapses the next
// worker gets RECONCILE, not EXECUTE, and finds the order instead of
// placing another.
func TestCrashBetweenEffectAndRecord(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const key = "s3-purchase-desk"
	w.register(t, key, purchase("standing desk", 1, 49900))

	a := startChild(t, w.childSpec(modeCrash, key))
	done := a.expect("effect-done", 20*time.Second)
	a.signal(syscall.SIGKILL)
	a.wait(10 * time.Second)
	orderA := strings.Fields(done)[0]

	b := openSession(t, w.c, "s3-worker-b", 10*time.Second)
	var executes atomic.Int32
	task := w.shop(nil).orderTask(key)
	execute := task.Execute
	task.Execute = func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		executes.Add(1)
		return execute(ctx, att)
	}
	out, err := b.Run(ctx, task)
	got := mustComplete(t, "B's Run", out, err)
	if out.Executed || executes.Load() != 0 || got[refOrder] != orderA {
		t.Errorf("B: want A's order %s found by reconciling, Execute never called; got %s (executes %d)", orderA, outcomeOf(out, err), executes.Load())
	}
	if n, r := w.merchant.Count(), w.merchant.Requests(); n != 1 || r != 1 {
		t.Errorf("merchant holds %d orders after %d requests, want 1 and 1", n, r)
	}
	in := get(t, w.c, key)
	if len(entries(in, intentv1.HistoryEntry_KIND_LEASE_LAPSED)) != 1 || !hasAcquired(in, intentv1.LeaseMode_LEASE_MODE_RECONCILE) ||
		len(entries(in, intentv1.HistoryEntry_KIND_MARKED_UNKNOWN)) != 0 {
		t.Errorf("want A's lease lapsed (no report from A) and a RECONCILE lease; history:\n%s", story(in))
	}
}

// Scenario 4. Two workers claim the same intent at the same instant (each
// with its own session, released by one barrier, both registering it as
// approver-workers do); and one purchase arrives twice from the queue, as
// two messages with two ids, its key derived by intentd from the business
// identity alone. Each time: one Execute, one order, the same result for
// both.
func TestSimultaneousClaimsAndRedelivery(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	s := w.shop(nil)
	sessions := [2]*client.Session{openSession(t, w.c, "s4-worker-a", 10*time.Second), openSession(t, w.c, "s4-worker-b", 10*time.Second)}

	// race runs task on both sessions at once and returns both outcomes.
	race := func(tasks [2]client.Task) (outs [2]*client.Outcome, errs [2]error) {
		barrier := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				<-barrier
				outs[i], errs[i] = sessions[i].Run(ctx, tasks[i])
			})
		}
		close(barrier)
		wg.Wait()
		return outs, errs
	}
	slowOrder := func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		time.Sleep(30 * time.Millisecond) // long enough for the other claim to find it held
		return s.executeOrder(ctx, att)
	}

	const rounds = 8
	for r := range rounds {
		key := fmt.Sprintf("s4-race-%d", r)
		task := s.orderTask(key)
		task.Execute = slowOrder
		task.Register = &intentv1.RegisterRequest{Params: purchase("monitor arm", 1+r, 5900)}
		outs, errs := race([2]client.Task{task, task})
		a := mustComplete(t, key+" worker a", outs[0], errs[0])
		b := mustComplete(t, key+" worker b", outs[1], errs[1])
		if outs[0].Executed == outs[1].Executed || a[refOrder] != b[refOrder] {
			t.Errorf("%s: want exactly one execution and one order id, got a: %s; b: %s", key, outcomeOf(outs[0], errs[0]), outcomeOf(outs[1], errs[1]))
		}
	}
	if n := w.merchant.Count(); n != rounds {
		t.Errorf("after %d simultaneous double claims the merchant holds %d orders, want %d", rounds, n, rounds)
	}

	// One purchase, delivered twice: the message id is the queue's, the
	// identity is the business's.
	type message struct {
		ID   string
		Body map[string]any
	}
	body := map[string]any{"customer": "c-1017", "cart": "cart-881", "merchant": "M"}
	msgs := [2]message{{"msg-7f3a", body}, {"msg-91c2", body}}
	var tasks [2]client.Task
	var keys [2]string
	for i, m := range msgs {
		identity, err := structpb.NewStruct(m.Body) // never m.ID
		if err != nil {
			t.Fatal(err)
		}
		resp, err := w.c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: "purchase", Identity: identity})
		if err != nil {
			t.Fatalf("DeriveKey for %s: %v", m.ID, err)
		}
		keys[i] = resp.GetKey()
		tasks[i] = s.orderTask(keys[i])
		tasks[i].Execute = slowOrder
		tasks[i].Register = &intentv1.RegisterRequest{Params: purchase("webcam", 1, 7900)}
	}
	local, _, err := intent.DeriveKey("purchase", body)
	if err != nil {
		t.Fatal(err)
	}
	if keys[0] != keys[1] || keys[0] != local {
		t.Fatalf("keys for one purchase: %s (%s), %s (%s), locally %s: want one key", keys[0], msgs[0].ID, keys[1], msgs[1].ID, local)
	}
	before := w.merchant.Count()
	outs, errs := race(tasks)
	a := mustComplete(t, msgs[0].ID, outs[0], errs[0])
	b := mustComplete(t, msgs[1].ID, outs[1], errs[1])
	if outs[0].Executed == outs[1].Executed || a[refOrder] != b[refOrder] {
		t.Errorf("two deliveries: want one execution and one order id, got %s: %s; %s: %s", msgs[0].ID, outcomeOf(outs[0], errs[0]), msgs[1].ID, outcomeOf(outs[1], errs[1]))
	}
	if n := w.merchant.Count() - before; n != 1 {
		t.Errorf("two deliveries of one purchase placed %d orders, want 1", n)
	}
	if d := w.merchant.Duplicates(); d != 0 {
		t.Errorf("merchant holds %d duplicate orders, want 0", d)
	}
}

// Scenario 5. The approved purchase says one; a delivery under the same
// key says two. A changed quantity is a new customer decision, not a
// retry: the claim is refused with ErrFingerprintMismatch (whether the
// worker registers the terms it holds or states their fingerprint), the
// worker escalates the existing intent with its reason, nothing is
// ordered, and no later Run executes it.
func TestChangedQuantityEscalated(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const key = "s5-purchase-lamps"
	approved, changed := purchase("desk lamp", 1, 8900), purchase("desk lamp", 2, 8900)
	w.register(t, key, approved)

	s := w.shop(nil)
	var executes atomic.Int32
	task := s.orderTask(key)
	task.Execute = func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		executes.Add(1)
		return s.executeOrder(ctx, att)
	}
	sess := openSession(t, w.c, "s5-worker", 10*time.Second)

	withTerms := task
	withTerms.Register = &intentv1.RegisterRequest{Params: changed}
	withFingerprint := task
	withFingerprint.ExpectedFingerprint = fingerprint(t, changed)
	for name, tk := range map[string]client.Task{"registering the changed terms": withTerms, "stating their fingerprint": withFingerprint} {
		out, err := sess.Run(ctx, tk)
		if !errors.Is(err, client.ErrFingerprintMismatch) {
			t.Fatalf("Run %s: want ErrFingerprintMismatch, got %s", name, outcomeOf(out, err))
		}
	}
	reason := "delivery asks for quantity 2 under " + key + ", approved terms differ (fingerprint mismatch): a changed quantity needs a new approval"
	if _, err := w.c.Escalate(ctx, &intentv1.EscalateRequest{Key: key, Reason: reason, Actor: "s5-worker"}); err != nil {
		t.Fatalf("Escalate: %v", err)
	}

	in := get(t, w.c, key)
	esc := entries(in, intentv1.HistoryEntry_KIND_ESCALATED)
	if in.GetState() != intentv1.State_STATE_NEEDS_REVIEW || len(esc) != 1 || esc[0].GetReason() != reason || esc[0].GetPrincipal() != "s5-worker" {
		t.Errorf("want NEEDS_REVIEW with the worker's escalation recorded, got %s:\n%s", in.GetState(), story(in))
	}
	if q := in.GetParams().GetFields()["quantity"].GetNumberValue(); q != 1 || in.GetFingerprint() != fingerprint(t, approved) {
		t.Errorf("stored terms changed: quantity %v, fingerprint %s", q, in.GetFingerprint())
	}

	out, err := sess.Run(ctx, task) // the approved terms, again
	if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_NEEDS_REVIEW || out.Executed {
		t.Errorf("Run after escalation: want NEEDS_REVIEW without executing, got %s", outcomeOf(out, err))
	}
	if n, r, e := w.merchant.Count(), w.merchant.Requests(), executes.Load(); n != 0 || r != 0 || e != 0 {
		t.Errorf("world: %d orders, %d order requests, %d executions; want none", n, r, e)
	}
}

// reconcilePayment is a Reconcile that asks the payment provider what it
// stored under the "authorize-payment" operation key. While the first
// request is still in flight it waits (calling inFlight each time). A key
// the provider does not know is a confirmed absence only while the
// provider still remembers every key the intent could have used: it
// forgets keys retention after first use, and no attempt is older than the
// intent, so once the intent is older than retention (by the provider's
// clock) the provider's silence proves nothing and a human decides.
func (s *shop) reconcilePayment(clock *fakes.Clock, retention time.Duration, inFlight func()) func(context.Context, *client.Attempt) (client.Evidence, error) {
	return func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
		opKey := att.OperationKey("authorize-payment")
		for {
			rec, found, err := s.LookupPayment(ctx, opKey)
			switch {
			case err != nil:
				return client.Evidence{}, err
			case !found:
				created := att.Intent.GetCreatedAt()
				if age := clock.Now().Sub(created.AsTime()); created == nil || age > retention {
					return client.Undecided(fmt.Sprintf("the payment provider has no key %s, but it forgets keys after %v and the intent was approved %v ago: forgetting cannot be told from absence", opKey, retention, age.Round(time.Minute))), nil
				}
				return client.Absent("the payment provider has no key " + opKey), nil
			case !rec.InFlight:
				return paymentEvidence(rec)
			}
			if inFlight != nil {
				inFlight()
			}
			select {
			case <-ctx.Done():
				return client.Evidence{}, ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// Scenario 6. The payment provider is still working on the first request
// when the worker's client gives up and sends it again, with the same key
// as it must: the provider answers 409 "in use" and stores nothing. The
// worker does not mint a new key; Execute returns a plain error, so the
// intent is UNKNOWN. The reconciler looks the key up, waits while the
// first request is in flight, then finds its authorization and completes.
func TestInFlightConflictReconciled(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const key = "s6-purchase-headset"
	w.register(t, key, purchase("headset", 1, 12900))
	started, release := w.payments.HoldNext()
	defer release()

	s := w.shop(nil)
	var firstErr error
	var waited atomic.Int32
	task := client.Task{
		Key: key,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			opKey := att.OperationKey("authorize-payment")
			amount, currency := amountOf(att)
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, firstErr = s.Authorize(actx, opKey, amount, currency, att.Key)
			cancel()
			<-started
			// The client's retry: the same request, the same key.
			a, err := s.Authorize(ctx, opKey, amount, currency, att.Key)
			if err != nil {
				return nil, fmt.Errorf("authorize under %s: %w", opKey, err)
			}
			return refs(refPayment, a.ID), nil
		},
		Reconcile: s.reconcilePayment(w.clock, paymentRetention, func() { waited.Add(1) }),
	}
	sess := openSession(t, w.c, "s6-worker", 10*time.Second)

	out, err := sess.Run(ctx, task)
	if firstErr == nil || harness.HTTPStatus(err) != http.StatusConflict || out == nil || out.Intent.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Fatalf("first Run: want the timed-out request, then 409 in use and UNKNOWN; got first error %v, %s", firstErr, outcomeOf(out, err))
	}
	opKey := intent.OperationKey(key, "authorize-payment")
	if byKey := w.payments.PostsByKey(); len(byKey) != 1 || byKey[opKey] != 2 {
		t.Errorf("provider saw POSTs by key %v, want 2 under %s and no other key", byKey, opKey)
	}
	if n := w.payments.Count(); n != 0 {
		t.Fatalf("%d authorizations while the first request is held, want 0", n)
	}

	go func() { // let the first request finish once the reconciler is waiting on it
		for waited.Load() == 0 && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		release()
	}()
	out, err = sess.Run(ctx, task)
	got := mustComplete(t, "reconciling Run", out, err)
	auths := w.payments.Authorizations()
	if out.Executed || len(auths) != 1 || got[refPayment] != auths[0].ID || waited.Load() == 0 {
		t.Errorf("want the in-flight request's authorization found after waiting, not a new one; got %s, provider holds %v, waited %d", outcomeOf(out, err), auths, waited.Load())
	}
	if n := w.payments.Posts(); n != 2 {
		t.Errorf("provider got %d POSTs, want 2", n)
	}
	in := get(t, w.c, key)
	if mu := entries(in, intentv1.HistoryEntry_KIND_MARKED_UNKNOWN); len(mu) != 1 || !strings.Contains(mu[0].GetReason(), "409") {
		t.Errorf("want one MARKED_UNKNOWN naming the 409:\n%s", story(in))
	}
}

// Scenario 7. The payment's reply is lost, and the intent is retried only
// after the provider's key retention passed: the provider has forgotten the
// key (the authorization itself still exists). Reconcile cannot tell
// forgetting from absence, so the intent goes to NEEDS_REVIEW; every
// further Run returns NEEDS_REVIEW without executing, and the provider
// holds what it held.
func TestRetentionPassedNeedsReview(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const key = "s7-purchase-printer"
	w.register(t, key, purchase("printer", 1, 19900))

	s := w.shop(&fakes.CutReply{Cut: fakes.CutFirst(http.MethodPost, "/v1/payment_intents")})
	var executes atomic.Int32
	task := client.Task{
		Key: key,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			executes.Add(1)
			return s.executePayment(ctx, att)
		},
		Reconcile: s.reconcilePayment(w.clock, paymentRetention, nil),
	}
	sess := openSession(t, w.c, "s7-worker", 10*time.Second)

	out, err := sess.Run(ctx, task)
	if !errors.Is(err, fakes.ErrReplyCut) || out == nil || out.Intent.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Fatalf("first Run: want the cut reply and UNKNOWN, got %s", outcomeOf(out, err))
	}
	w.clock.Advance(paymentRetention + time.Hour)
	if _, found, err := s.LookupPayment(ctx, intent.OperationKey(key, "authorize-payment")); err != nil || found {
		t.Fatalf("provider still knows the key after its retention (found %t, %v)", found, err)
	}

	for i := range 4 {
		out, err := sess.Run(ctx, task)
		if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_NEEDS_REVIEW || out.Executed {
			t.Fatalf("Run %d after the retention: want NEEDS_REVIEW without executing, got %s", i+2, outcomeOf(out, err))
		}
	}
	if e, n, p := executes.Load(), w.payments.Count(), w.payments.Posts(); e != 1 || n != 1 || p != 1 {
		t.Errorf("executions %d, authorizations %d, POSTs %d; want 1, 1, 1", e, n, p)
	}
	in := get(t, w.c, key)
	if esc := entries(in, intentv1.HistoryEntry_KIND_ESCALATED); in.GetState() != intentv1.State_STATE_NEEDS_REVIEW || len(esc) != 1 || !strings.Contains(esc[0].GetReason(), "forgets keys") {
		t.Errorf("want NEEDS_REVIEW with the reconciler's reason, got %s:\n%s", in.GetState(), story(in))
	}
	list, err := w.c.List(ctx, &intentv1.ListRequest{States: []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW}})
	if err != nil || len(list.GetIntents()) != 1 || list.GetIntents()[0].GetKey() != key {
		t.Errorf("review queue: want exactly %s, got %v (%v)", key, list.GetIntents(), err)
	}
}

// Scenario 8. A purchase is one parent intent with two steps. Its worker
// completes the parent and registers the steps as children in the same
// transaction (the outbox). The order step completes; the payment step's
// reply is lost, so it is UNKNOWN, and the parent shows exactly that.
// Reconciliation finds the authorization; one order, one payment.
func TestOrderCreatedPaymentUncertain(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const parent = "s8-purchase-bike"
	terms := map[string]any{"item": "bicycle", "quantity": 1, "merchant": "M", "amount_cents": 89900, "currency": "EUR"}
	params, _ := structpb.NewStruct(terms)
	w.register(t, parent, params)
	orderKey, payKey := intent.OperationKey(parent, "create-order"), intent.OperationKey(parent, "authorize-payment")
	step := func(name string) *structpb.Struct {
		m := map[string]any{"purchase": parent, "step": name}
		for k, v := range terms {
			m[k] = v
		}
		p, _ := structpb.NewStruct(m)
		return p
	}

	s := w.shop(&fakes.CutReply{Cut: fakes.CutFirst(http.MethodPost, "/v1/payment_intents")})
	sess := openSession(t, w.c, "s8-worker", 10*time.Second)
	out, err := sess.Run(ctx, client.Task{
		Key: parent,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			att.RegisterChild(&intentv1.RegisterRequest{Key: orderKey, Params: step("create-order")})
			att.RegisterChild(&intentv1.RegisterRequest{Key: payKey, Params: step("authorize-payment")})
			return &intentv1.Result{Payload: []byte("steps: create-order, authorize-payment")}, nil
		},
	})
	mustComplete(t, "parent", out, err)

	out, err = sess.Run(ctx, s.orderTask(orderKey))
	order := mustComplete(t, "create-order", out, err)[refOrder]
	payTask := client.Task{Key: payKey, Execute: s.executePayment, Reconcile: s.reconcilePayment(w.clock, paymentRetention, nil)}
	out, err = sess.Run(ctx, payTask)
	if !errors.Is(err, fakes.ErrReplyCut) || out == nil || out.Intent.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Fatalf("authorize-payment: want the cut reply and UNKNOWN, got %s", outcomeOf(out, err))
	}

	children := func() map[string]intentv1.State {
		m := map[string]intentv1.State{}
		for _, c := range get(t, w.c, parent).GetChildren() {
			m[c.GetKey()] = c.GetState()
		}
		return m
	}
	want := map[string]intentv1.State{orderKey: intentv1.State_STATE_COMPLETED, payKey: intentv1.State_STATE_UNKNOWN}
	if got := children(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parent's children: got %v, want %v", got, want)
	}
	if n, p := w.merchant.Count(), w.payments.Count(); n != 1 || p != 1 {
		t.Errorf("with the payment uncertain the world holds %d orders and %d authorizations, want 1 and 1", n, p)
	}

	out, err = sess.Run(ctx, payTask)
	paid := mustComplete(t, "reconciling authorize-payment", out, err)[refPayment]
	auths := w.payments.Authorizations()
	if out.Executed || len(auths) != 1 || paid != auths[0].ID || auths[0].Reference != parent {
		t.Errorf("want the lost authorization found, not a new one: %s, provider holds %v", outcomeOf(out, err), auths)
	}
	want[payKey] = intentv1.State_STATE_COMPLETED
	if got := children(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parent's children after reconciliation: got %v, want %v", got, want)
	}
	orders := w.merchant.Orders()
	if len(orders) != 1 || orders[0].ID != order || orders[0].Reference != parent || w.payments.Posts() != 1 {
		t.Errorf("world: orders %v, %d payment POSTs; want one order %s for %s and one POST", orders, w.payments.Posts(), order, parent)
	}
	if pk := get(t, w.c, payKey).GetParentKey(); pk != parent {
		t.Errorf("child's parent_key is %q, want %q", pk, parent)
	}
}

// executePickup is an Execute that books the attempt's pickup through the
// gateway under its token.
func (s *shop) executePickup(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
	p, err := s.BookPickup(ctx, att.Key, att.Token, fakes.Pickup{Parcel: att.Key, Address: "Dock 4"})
	if harness.HTTPStatus(err) == http.StatusConflict {
		return nil, client.NotAttempted(err) // refused at the gateway: never reached the courier
	}
	if err != nil {
		return nil, err
	}
	return refs(refPickup, p.ID), nil
}

// reconcilePickup is a Reconcile that asks the gateway what it forwarded
// for the intent. The question carries the reconciler's token, which the
// gateway admits first: from then on it refuses every older token, so a
// "nothing forwarded" stays true for every earlier attempt.
func (s *shop) reconcilePickup(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
	calls, err := s.Forwarded(ctx, att.Key, att.Token)
	if err != nil {
		return client.Evidence{}, err
	}
	if len(calls) == 0 {
		return client.Absent(fmt.Sprintf("the gateway forwarded no call for %s and refuses tokens below %s from now on", att.Key, att.Token)), nil
	}
	for _, c := range calls {
		var p fakes.Pickup
		if c.Status/100 == 2 && json.Unmarshal(c.Body, &p) == nil {
			return client.Found(refs(refPickup, p.ID)), nil
		}
	}
	return client.Undecided(fmt.Sprintf("the gateway forwarded %d calls for %s without a confirmed pickup", len(calls), att.Key)), nil
}

// Scenario 9. The courier takes no idempotency key: only our gateway's
// fencing stands between a stale worker and a second pickup. Worker A (a
// process) holds the lease and is stopped before it calls; its lease
// lapses; B reconciles through the gateway (which fences out A's token),
// finds nothing, and books the pickup. A resumes and sends its call under
// its old token: the gateway refuses it, the courier never sees it, and A's
// report is refused as stale. One pickup.
func TestStaleWorkerFencedAtGateway(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t, time.Minute)
	const key = "s9-pickup-parcel"
	params, _ := structpb.NewStruct(map[string]any{"parcel": "P-311", "address": "Dock 4", "window": "2026-12-01T09:00/12:00"})
	w.register(t, key, params)

	a := startChild(t, w.childSpec(modeStaleGateway, key))
	tokenA := field(a.expect("ready", 20*time.Second), "token")
	a.signal(syscall.SIGSTOP)

	s := w.shop(nil)
	b := openSession(t, w.c, "s9-worker-b", 10*time.Second)
	out, err := b.Run(ctx, client.Task{Key: key, Execute: s.executePickup, Reconcile: s.reconcilePickup, WaitInProgress: 20 * time.Second})
	got := mustComplete(t, "B's Run", out, err)
	if !out.Executed || w.courier.Count() != 1 {
		t.Fatalf("B: want a confirmed absence, then one pickup; got %s, courier holds %d", outcomeOf(out, err), w.courier.Count())
	}

	a.signal(syscall.SIGCONT)
	a.send("resume")
	if st := a.expect("gateway-status", 20*time.Second); st != "409" {
		t.Errorf("A's call under token %s: gateway answered %s, want 409", tokenA, st)
	}
	if res := a.expect("run-result", 20*time.Second); field(res, "stale") != "true" {
		t.Errorf("A's report: want refused as stale, got %q", res)
	}
	a.expect("exit", 10*time.Second)

	if n, r := w.courier.Count(), w.gateway.Refused(); n != 1 || r != 1 {
		t.Errorf("courier holds %d pickups, gateway refused %d calls; want 1 and 1", n, r)
	}
	tA, _ := fencing.Parse(tokenA)
	if h := w.gateway.Checker.Highest(key); h <= tA {
		t.Errorf("gateway's highest token for %s is %s, want above A's %s", key, h, tA)
	}
	in := get(t, w.c, key)
	if in.GetState() != intentv1.State_STATE_COMPLETED || in.GetResult().GetExternalRefs()[refPickup] != got[refPickup] {
		t.Errorf("intent is %s with %v, want COMPLETED with B's pickup", in.GetState(), in.GetResult().GetExternalRefs())
	}
	stale := false
	for _, e := range entries(in, intentv1.HistoryEntry_KIND_RELEASED) {
		stale = stale || (!e.GetAccepted() && strconv.FormatUint(e.GetToken(), 10) == tokenA)
	}
	if !stale {
		t.Errorf("want A's report (token %s) kept as evidence, accepted=false:\n%s", tokenA, story(in))
	}
}

// hasAcquired reports whether the history shows a lease of mode issued.
func hasAcquired(in *intentv1.Intent, mode intentv1.LeaseMode) bool {
	for _, e := range entries(in, intentv1.HistoryEntry_KIND_ACQUIRED) {
		if e.GetMode() == mode {
			return true
		}
	}
	return false
}
