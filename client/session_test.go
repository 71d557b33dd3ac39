package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// shortTTL is the shortest session TTL intentd grants; heartbeats go every
// TTL/3.
const shortTTL = 2 * time.Second

// noticeWithin bounds how long a session takes to notice a lost lease: one
// heartbeat interval, its round trip, and slack for the race detector.
const noticeWithin = 3 * time.Second

// blocker is an Execute that, the first time, holds its lease until its
// context ends; later calls (Run re-executing after a reviewer's PENDING
// decision) complete at once.
type blocker struct {
	started   chan fencing.Token // the attempt's token, once Execute runs
	cancelled chan time.Time     // when Execute's context ended
	calls     atomic.Int32
}

func newBlocker() *blocker {
	return &blocker{started: make(chan fencing.Token, 1), cancelled: make(chan time.Time, 1)}
}

func (b *blocker) execute(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
	if b.calls.Add(1) > 1 {
		return &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-again"}}, nil
	}
	b.started <- att.Token
	<-ctx.Done()
	b.cancelled <- time.Now()
	return nil, ctx.Err()
}

func (b *blocker) waitStarted(t *testing.T) fencing.Token {
	t.Helper()
	select {
	case tok := <-b.started:
		return tok
	case <-time.After(5 * time.Second):
		t.Fatal("Execute did not start within 5s")
		return 0
	}
}

// waitCancelled fails t unless Execute's context ended within noticeWithin
// of since.
func (b *blocker) waitCancelled(t *testing.T, since time.Time) {
	t.Helper()
	select {
	case at := <-b.cancelled:
		if took := at.Sub(since); took > noticeWithin {
			t.Errorf("Execute's context ended %v after the lease was lost, want within %v", took, noticeWithin)
		} else {
			t.Logf("Execute's context ended %v after the lease was lost", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Execute's context still live 10s after the lease was lost")
	}
}

// evidenceOf fails t unless in's history keeps a refused MarkUnknown under
// token.
func evidenceOf(t *testing.T, in *intentv1.Intent, token fencing.Token) {
	t.Helper()
	for _, e := range entries(in, intentv1.HistoryEntry_KIND_MARKED_UNKNOWN, false) {
		if e.GetToken() == uint64(token) {
			return
		}
	}
	t.Errorf("history %v keeps no refused MarkUnknown under token %v, want the stale report as evidence", in.GetHistory(), token)
}

// TestLeaseLossCancelsExecute: when another party takes the intent over,
// Execute's context ends within a heartbeat or so, Run's report is refused
// but kept as evidence, and Run says the lease was lost.
func TestLeaseLossCancelsExecute(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)

	t.Run("reviewer resolves with force", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		s := openSession(t, c, "worker-1", shortTTL)
		key := keyFor(t, "")
		register(t, c, key)
		b := newBlocker()
		done := runAsync(s, client.Task{Key: key, Execute: b.execute})
		token := b.waitStarted(t)

		if _, err := c.Resolve(ctx, &intentv1.ResolveRequest{Key: key, Decision: intentv1.Decision_DECISION_PENDING, Actor: "reviewer", Reason: "reassign", Force: true}); err != nil {
			t.Fatalf("Resolve(force) = %v", err)
		}
		b.waitCancelled(t, time.Now())
		r := waitRun(t, done, 10*time.Second)
		// The report is refused (ABORTED): Run acquires again, finds the
		// reviewer's PENDING, and executes once more under a new token,
		// with the same operation keys.
		if r.err != nil || r.out == nil || !r.out.Superseded || !r.out.Executed || r.out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
			t.Errorf("Run = %+v, %v; want COMPLETED, superseded and executed, no error", r.out, r.err)
		}
		if n := b.calls.Load(); n != 2 {
			t.Errorf("Execute called %d times, want 2 (once before, once after the reviewer's decision)", n)
		}
		in := get(t, c, key)
		if in.GetState() != intentv1.State_STATE_COMPLETED || in.GetLease().GetToken() <= uint64(token) {
			t.Errorf("state = %v under token %d, want STATE_COMPLETED under a token above %v", in.GetState(), in.GetLease().GetToken(), token)
		}
		evidenceOf(t, in, token)
		select {
		case <-s.Done():
			t.Errorf("session Done after losing one lease (%v), want it alive", s.Err())
		default:
		}
	})

	t.Run("session closed and another worker takes over", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		f := &faults{}
		s1 := openSession(t, newFaultyClient(t, f), "worker-1", shortTTL)
		s2 := openSession(t, c, "worker-2", 0)
		key := keyFor(t, "")
		register(t, c, key)
		b := newBlocker()
		done := runAsync(s1, client.Task{Key: key, Execute: b.execute})
		token := b.waitStarted(t)

		// Hold worker-1's heartbeats back until worker-2 holds the intent,
		// so that worker-1's report is certain to come late.
		f.set("Heartbeat", &rule{fail: -1, code: codes.Unavailable})
		if _, err := c.RPC().CloseSession(ctx, &intentv1.CloseSessionRequest{SessionId: s1.ID()}); err != nil {
			t.Fatalf("CloseSession = %v", err)
		}
		acq := acquire(t, c, s2.ID(), key)
		if acq.GetOutcome() != intentv1.Outcome_OUTCOME_RECONCILE || acq.GetLease().GetToken() <= uint64(token) {
			t.Fatalf("worker-2 Acquire = %v token %d, want OUTCOME_RECONCILE above %v", acq.GetOutcome(), acq.GetLease().GetToken(), token)
		}
		f.set("Heartbeat", nil)
		b.waitCancelled(t, time.Now())
		r := waitRun(t, done, 10*time.Second)
		if !errors.Is(r.err, client.ErrLeaseLost) || !errors.Is(r.err, client.ErrStaleToken) {
			t.Errorf("Run error = %v, want ErrLeaseLost wrapping ErrStaleToken", r.err)
		}
		select {
		case <-s1.Done():
			if !errors.Is(s1.Err(), client.ErrSessionNotFound) {
				t.Errorf("session Err = %v, want ErrSessionNotFound", s1.Err())
			}
		default:
			t.Errorf("worker-1's session not Done after it was closed")
		}
		in := get(t, c, key)
		if in.GetState() != intentv1.State_STATE_IN_PROGRESS || in.GetLease().GetToken() != acq.GetLease().GetToken() {
			t.Errorf("intent %v under token %d, want STATE_IN_PROGRESS under worker-2's %d", in.GetState(), in.GetLease().GetToken(), acq.GetLease().GetToken())
		}
		evidenceOf(t, in, token)
	})

	t.Run("session closed and nobody takes over", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		s := openSession(t, c, "worker-1", shortTTL)
		key := keyFor(t, "")
		register(t, c, key)
		b := newBlocker()
		done := runAsync(s, client.Task{Key: key, Execute: b.execute})
		token := b.waitStarted(t)

		if _, err := c.RPC().CloseSession(ctx, &intentv1.CloseSessionRequest{SessionId: s.ID()}); err != nil {
			t.Fatalf("CloseSession = %v", err)
		}
		b.waitCancelled(t, time.Now())
		r := waitRun(t, done, 10*time.Second)
		// With no newer token issued, the late report is the best evidence
		// there is, and is accepted; Run must still say the lease was lost
		// (its own context was never cancelled).
		if !errors.Is(r.err, client.ErrLeaseLost) {
			t.Errorf("Run error = %v, want one wrapping ErrLeaseLost", r.err)
		}
		in := get(t, c, key)
		if in.GetState() != intentv1.State_STATE_UNKNOWN {
			t.Errorf("state = %v, want STATE_UNKNOWN", in.GetState())
		}
		marked := entries(in, intentv1.HistoryEntry_KIND_MARKED_UNKNOWN, true)
		if len(marked) != 1 || marked[0].GetToken() != uint64(token) {
			t.Errorf("accepted MarkUnknown entries = %v, want one under token %v", marked, token)
		}
	})
}

// TestSessionDoneWhenClosedOnServer: a session closed behind the worker's
// back closes Done within a heartbeat, and Err says why.
func TestSessionDoneWhenClosedOnServer(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	s := openSession(t, c, "worker-1", shortTTL)
	if s.TTL() != shortTTL {
		t.Errorf("TTL() = %v, want %v", s.TTL(), shortTTL)
	}
	select {
	case <-s.Done():
		t.Fatalf("Done before anything happened: %v", s.Err())
	default:
	}
	if err := s.Err(); err != nil {
		t.Errorf("Err() of a live session = %v, want nil", err)
	}

	closed := time.Now()
	if _, err := c.RPC().CloseSession(ctx, &intentv1.CloseSessionRequest{SessionId: s.ID()}); err != nil {
		t.Fatalf("CloseSession = %v", err)
	}
	select {
	case <-s.Done():
		if took := time.Since(closed); took > noticeWithin {
			t.Errorf("Done closed %v after CloseSession, want within %v", took, noticeWithin)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Done still open 10s after CloseSession")
	}
	if err := s.Err(); !errors.Is(err, client.ErrSessionNotFound) {
		t.Errorf("Err() = %v, want ErrSessionNotFound", err)
	}

	key := keyFor(t, "")
	register(t, c, key)
	executed := false
	_, err := s.Run(ctx, client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		executed = true
		return orderResult("SO-1"), nil
	}})
	if !errors.Is(err, client.ErrSessionNotFound) || executed {
		t.Errorf("Run on the closed session = %v, executed %t; want ErrSessionNotFound, not executed", err, executed)
	}
}

// TestSessionClose: Close ends the session at once, here and on the server.
func TestSessionClose(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	s, err := c.OpenSession(ctx, "worker-1", 0)
	if err != nil {
		t.Fatalf("OpenSession = %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close = %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done open after Close")
	}
	if s.Err() == nil {
		t.Error("Err() after Close = nil, want a reason")
	}
	key := keyFor(t, "")
	register(t, c, key)
	_, err = c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: s.ID(), RequestId: requestID()})
	if !errors.Is(err, client.ErrSessionNotFound) {
		t.Errorf("Acquire under the closed session = %v, want ErrSessionNotFound", err)
	}
}

// TestHeartbeatKeepsLeaseAlive: a 2s session outlives its TTL three times
// over on heartbeats alone, while Execute takes 5s and completes.
func TestHeartbeatKeepsLeaseAlive(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	start := time.Now()
	s := openSession(t, c, "worker-slow", shortTTL)
	observer := openSession(t, c, "observer", 0)
	key := keyFor(t, "")
	register(t, c, key)
	started := make(chan struct{})
	done := runAsync(s, client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		close(started)
		select {
		case <-time.After(5 * time.Second):
			return orderResult("SO-slow"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}})
	<-started

	time.Sleep(3 * time.Second) // past the TTL: only heartbeats keep the lease
	acq := acquire(t, c, observer.ID(), key)
	if acq.GetOutcome() != intentv1.Outcome_OUTCOME_IN_PROGRESS || !acq.GetLease().GetLive() || acq.GetLease().GetWorker() != "worker-slow" {
		t.Errorf("observer Acquire at 3s = %v, lease live %t worker %q; want OUTCOME_IN_PROGRESS, live, worker-slow",
			acq.GetOutcome(), acq.GetLease().GetLive(), acq.GetLease().GetWorker())
	}

	r := waitRun(t, done, 10*time.Second)
	if r.err != nil {
		t.Fatalf("Run = %v", r.err)
	}
	if r.out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || !r.out.Executed {
		t.Errorf("Run = %v executed %t, want OUTCOME_COMPLETED executed true", r.out.Outcome, r.out.Executed)
	}
	time.Sleep(time.Until(start.Add(6 * time.Second)))
	select {
	case <-s.Done():
		t.Fatalf("session Done after %v: %v", time.Since(start), s.Err())
	default:
	}
	in := get(t, c, key)
	if in.GetState() != intentv1.State_STATE_COMPLETED {
		t.Errorf("state = %v, want STATE_COMPLETED", in.GetState())
	}
	for _, kind := range []intentv1.HistoryEntry_Kind{intentv1.HistoryEntry_KIND_LEASE_LAPSED, intentv1.HistoryEntry_KIND_MARKED_UNKNOWN} {
		if n := len(entries(in, kind, true)) + len(entries(in, kind, false)); n != 0 {
			t.Errorf("history holds %d %v entries, want none", n, kind)
		}
	}

	// Still alive on the server after 6s: it can take on more work.
	next := keyFor(t, "-next")
	register(t, c, next)
	out, err := s.Run(ctx, client.Task{Key: next, Execute: newShop().execute})
	if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
		t.Errorf("Run after %v = %v, %v; want OUTCOME_COMPLETED", time.Since(start), out, err)
	}
}

// TestRunOnLostSession: once a session is lost (here: no heartbeat answer
// confirmed for a whole TTL, although intentd got them), Run takes no new
// lease under it and calls no Execute.
func TestRunOnLostSession(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	f := &faults{}
	c := newFaultyClient(t, f)
	s := openSession(t, c, "worker-deaf", shortTTL)
	f.set("Heartbeat", &rule{lose: 1 << 30}) // every answer is lost
	select {
	case <-s.Done():
	case <-time.After(2*shortTTL + noticeWithin):
		t.Fatalf("session not Done %v after its heartbeats went unanswered", 2*shortTTL+noticeWithin)
	}
	key := keyFor(t, "")
	register(t, c, key)
	var calls int
	_, err := s.Run(ctx, client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		calls++
		return orderResult("SO-1"), nil
	}})
	if err == nil || calls != 0 {
		t.Errorf("Run on a lost session = %v after %d Execute calls, want an error and none", err, calls)
	}
	in := get(t, c, key)
	if in.GetState() != intentv1.State_STATE_PENDING {
		t.Errorf("state = %v, want STATE_PENDING (untouched)", in.GetState())
	}
}
