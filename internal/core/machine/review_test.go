package machine_test

import (
	"testing"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

func escalate(t fencing.Token, force bool) machine.EscalateCall {
	return machine.EscalateCall{Escalation: &intent.Escalation{Tenant: "default", Key: key, Token: t, Reason: "cannot tell", Actor: "alice", Force: force}, Principal: "alice"}
}

// superseded checks that a decision issued a token no worker holds: every
// earlier lease's report is stale from its write on.
func superseded(t *testing.T, d machine.Decision) {
	t.Helper()
	if l := d.Next.Lease; l.Token != 0 || l.Mode != intent.ModeReview || l.SessionID != "" {
		t.Errorf("lease %+v, want a reviewer's token (0 until written), no session", l)
	}
	if c := commit(d, rev+1); c.CurrentToken() <= tok {
		t.Errorf("token after the write %v, want above %v", c.CurrentToken(), tok)
	}
}

func TestEscalateTransitions(t *testing.T) {
	entry := func(token fencing.Token, issued bool) func(*testing.T, machine.Decision) {
		return func(t *testing.T, d machine.Decision) {
			if e := last(d); e.Kind != intent.EventEscalated || !e.Accepted || e.Token != token || e.Issued != issued || e.Reason != "cannot tell" || e.Principal != "alice" {
				t.Errorf("entry %+v, want an accepted escalation under %v (issued %t)", e, token, issued)
			}
		}
	}
	write, gone := []machine.GuardKind{machine.RecordAt}, []machine.GuardKind{machine.RecordAt, machine.SessionGone}
	for _, tc := range []struct {
		name string
		v    *machine.View
		call machine.EscalateCall
		want expect
	}{
		{"the worker escalates under its token", live(held(intent.ModeReconcile)), escalate(tok, false),
			expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext, shown: intent.StateNeedsReview, check: entry(tok, false)}},
		{"the worker escalates its lapsed lease", lapsed(held(intent.ModeReconcile)), escalate(tok, false),
			expect{state: intent.StateNeedsReview, guards: gone, show: machine.ShowNext, check: entry(tok, false)}},
		{"the worker escalates UNKNOWN", live(in(intent.StateUnknown)), escalate(tok, false),
			expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext}},
		{"a worker's token on a PENDING intent is refused", live(func() *machine.Record { r := pending(); r.Lease = &machine.Lease{Token: tok}; return r }()), escalate(tok, false),
			expect{err: intent.ErrInvalidTransition}},
		{"a reviewer escalates PENDING", live(pending()), escalate(0, false),
			expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext, check: entry(0, false)}},
		{"a reviewer escalates UNKNOWN under its current token", live(in(intent.StateUnknown)), escalate(0, false),
			expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext, check: entry(tok, false)}},
		{"a reviewer escalates a lapsed lease while it stays lapsed", lapsed(held(intent.ModeExecute)), escalate(0, false),
			expect{state: intent.StateNeedsReview, guards: gone, show: machine.ShowNext, check: entry(tok, false)}},
		{"a reviewer needs force under a live lease", live(held(intent.ModeExecute)), escalate(0, false), expect{err: intent.ErrLeaseHeld}},
		{"with force the live lease is superseded", live(held(intent.ModeExecute)), escalate(0, true),
			expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext, check: func(t *testing.T, d machine.Decision) {
				entry(0, true)(t, d)
				superseded(t, d)
			}}},
		{"escalating NEEDS_REVIEW again changes nothing", live(in(intent.StateNeedsReview)), escalate(0, false), expect{shown: intent.StateNeedsReview}},
		{"COMPLETED is final", live(in(intent.StateCompleted)), escalate(0, true), expect{err: intent.ErrInvalidTransition, shown: intent.StateCompleted}},
		{"CANCELLED is final", live(in(intent.StateCancelled)), escalate(0, false), expect{err: intent.ErrInvalidTransition}},
		{"absent is not found", live(nil), escalate(0, false), expect{err: intent.ErrNotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.Escalate(tc.v, tc.call, now), tc.want)
		})
	}
}

func resolve(decision intent.State, force bool, requestID string) machine.ResolveCall {
	r := &intent.Resolution{Tenant: "default", Key: key, Decision: decision, Actor: "alice", Reason: "checked the portal", Force: force, RequestID: requestID}
	switch decision {
	case intent.StateCompleted:
		r.Result = &intent.Result{Payload: []byte(`{"order":"SO-7"}`)}
	case intent.StateFailed:
		r.Failure = &intent.Failure{Code: "not-placed"}
	}
	return machine.ResolveCall{Resolution: r, Principal: "alice"}
}

// expected is c deciding only while t is the intent's current token.
func expected(c machine.ResolveCall, t fencing.Token) machine.ResolveCall {
	c.Resolution.ExpectedToken = t
	return c
}

func TestResolveTransitions(t *testing.T) {
	decided := func(t *testing.T, d machine.Decision) {
		superseded(t, d)
		e := last(d)
		if e.Kind != intent.EventResolved || !e.Issued || e.ResolvedState != d.Next.State || e.RequestID != "res-1" || e.Principal != "alice" {
			t.Errorf("entry %+v, want the resolution, issuing a token", e)
		}
		if d.Next.State.Final() != !d.Next.RetainUntil.IsZero() {
			t.Errorf("state %v retained until %v: a final decision starts the retention, only it", d.Next.State, d.Next.RetainUntil)
		}
	}
	exhausted := func() *machine.Record {
		r := in(intent.StateNeedsReview)
		r.Attempts = 3
		return r
	}
	write, gone := []machine.GuardKind{machine.RecordAt}, []machine.GuardKind{machine.RecordAt, machine.SessionGone}
	for _, tc := range []struct {
		name string
		v    *machine.View
		call machine.ResolveCall
		want expect
	}{
		{"NEEDS_REVIEW to COMPLETED with the found result", live(in(intent.StateNeedsReview)), resolve(intent.StateCompleted, false, "res-1"),
			expect{state: intent.StateCompleted, guards: write, show: machine.ShowNext, check: func(t *testing.T, d machine.Decision) {
				decided(t, d)
				if string(d.Next.Result.Payload) != `{"order":"SO-7"}` || last(d).PayloadSHA256 == "" {
					t.Errorf("result %q, entry %+v: want the reviewer's result, its digest in the entry", d.Next.Result.Payload, last(d))
				}
			}}},
		{"NEEDS_REVIEW to PENDING starts a fresh attempts count", live(exhausted()), resolve(intent.StatePending, false, "res-1"),
			expect{state: intent.StatePending, guards: write, show: machine.ShowNext, check: func(t *testing.T, d machine.Decision) {
				decided(t, d)
				if d.Next.Attempts != 0 {
					t.Errorf("attempts %d, want 0", d.Next.Attempts)
				}
			}}},
		{"NEEDS_REVIEW to FAILED", live(exhausted()), resolve(intent.StateFailed, false, "res-1"),
			expect{state: intent.StateFailed, guards: write, show: machine.ShowNext, check: func(t *testing.T, d machine.Decision) {
				decided(t, d)
				if d.Next.Failure.Code != "not-placed" || d.Next.Attempts != 3 {
					t.Errorf("failure %+v attempts %d, want the reviewer's failure, the count kept", d.Next.Failure, d.Next.Attempts)
				}
			}}},
		{"NEEDS_REVIEW to CANCELLED", live(in(intent.StateNeedsReview)), resolve(intent.StateCancelled, false, "res-1"),
			expect{state: intent.StateCancelled, guards: write, show: machine.ShowNext, check: decided}},
		{"UNKNOWN is decided too", live(in(intent.StateUnknown)), resolve(intent.StatePending, false, "res-1"),
			expect{state: intent.StatePending, guards: write, show: machine.ShowNext, check: decided}},
		{"a lapsed lease is decided while it stays lapsed", lapsed(held(intent.ModeReconcile)), resolve(intent.StateCompleted, false, "res-1"),
			expect{state: intent.StateCompleted, guards: gone, show: machine.ShowNext, check: decided}},
		{"a live lease needs force", live(held(intent.ModeReconcile)), resolve(intent.StateCompleted, false, "res-1"), expect{err: intent.ErrLeaseHeld}},
		{"with force a live lease is superseded", live(held(intent.ModeReconcile)), resolve(intent.StateFailed, true, "res-1"),
			expect{state: intent.StateFailed, guards: write, show: machine.ShowNext, check: decided}},
		{"PENDING is not for review", live(pending()), resolve(intent.StateCompleted, false, "res-1"), expect{err: intent.ErrInvalidTransition, shown: intent.StatePending}},
		{"COMPLETED is final", live(in(intent.StateCompleted)), resolve(intent.StatePending, true, "res-1"), expect{err: intent.ErrInvalidTransition}},
		{"a retry answers the intent as it is, deciding nothing", live(func() *machine.Record {
			r := held(intent.ModeExecute) // decided PENDING, acquired again since
			r.History = append(r.History, intent.Event{Kind: intent.EventResolved, ResolvedState: intent.StatePending, Principal: "alice", RequestID: "res-1", Accepted: true})
			return r
		}()), resolve(intent.StatePending, false, "res-1"), expect{shown: intent.StateInProgress, check: func(t *testing.T, d machine.Decision) {
			if !d.Answer.Replayed {
				t.Error("not Replayed")
			}
		}}},
		{"a request id used for another decision is refused", live(func() *machine.Record {
			r := in(intent.StateNeedsReview)
			r.History = append(r.History, intent.Event{Kind: intent.EventResolved, ResolvedState: intent.StatePending, Principal: "alice", RequestID: "res-1", Accepted: true})
			return r
		}()), resolve(intent.StateCompleted, false, "res-1"), expect{err: intent.ErrInvalid}},
		{"the token the reviewer saw, still current, decides", live(in(intent.StateNeedsReview)), expected(resolve(intent.StateCompleted, false, "res-1"), tok),
			expect{state: intent.StateCompleted, guards: write, show: machine.ShowNext, check: decided}},
		{"a token superseded since the reviewer looked is stale, nothing kept", live(in(intent.StateNeedsReview)), expected(resolve(intent.StateCompleted, false, "res-1"), tok-1),
			expect{err: intent.ErrStaleToken, shown: intent.StateNeedsReview}},
		{"any other token is stale too", live(held(intent.ModeExecute)), expected(resolve(intent.StateCompleted, true, "res-1"), tok+1),
			expect{err: intent.ErrStaleToken, shown: intent.StateInProgress}},
		{"the console's decision says so in the history", live(in(intent.StateNeedsReview)), func() machine.ResolveCall {
			c := resolve(intent.StatePending, false, "res-1")
			c.Resolution.Channel = "console"
			return c
		}(), expect{state: intent.StatePending, guards: write, show: machine.ShowNext, check: func(t *testing.T, d machine.Decision) {
			if e := last(d); e.Channel != "console" {
				t.Errorf("entry %+v, want channel console", e)
			}
		}}},
		{"absent is not found", live(nil), resolve(intent.StatePending, false, "res-1"), expect{err: intent.ErrNotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.Resolve(tc.v, tc.call, now), tc.want)
		})
	}
}

func TestCancelTransitions(t *testing.T) {
	cancel := machine.CancelCall{Cancellation: &intent.Cancellation{Tenant: "default", Key: key, Actor: "bob", Reason: "customer withdrew"}, Principal: "bob"}
	for _, tc := range []struct {
		name string
		v    *machine.View
		want expect
	}{
		{"PENDING to CANCELLED, final", live(pending()), expect{state: intent.StateCancelled, guards: []machine.GuardKind{machine.RecordAt}, show: machine.ShowNext,
			shown: intent.StateCancelled, check: func(t *testing.T, d machine.Decision) {
				if e := last(d); e.Kind != intent.EventCancelled || e.Principal != "bob" || e.Reason != "customer withdrew" {
					t.Errorf("entry %+v, want bob's cancellation", e)
				}
				if !d.Next.RetainUntil.Equal(now.Add(d.Next.Retention)) {
					t.Errorf("retained until %v, want now + retention", d.Next.RetainUntil)
				}
			}}},
		{"CANCELLED again changes nothing", live(in(intent.StateCancelled)), expect{shown: intent.StateCancelled}},
		{"IN_PROGRESS is refused, shown held", live(held(intent.ModeExecute)), expect{err: intent.ErrInvalidTransition, shown: intent.StateInProgress}},
		{"IN_PROGRESS lapsed is refused, shown UNKNOWN", lapsed(held(intent.ModeExecute)), expect{err: intent.ErrInvalidTransition, shown: intent.StateUnknown}},
		{"UNKNOWN is refused", live(in(intent.StateUnknown)), expect{err: intent.ErrInvalidTransition}},
		{"NEEDS_REVIEW is refused", live(in(intent.StateNeedsReview)), expect{err: intent.ErrInvalidTransition}},
		{"COMPLETED is refused", live(in(intent.StateCompleted)), expect{err: intent.ErrInvalidTransition}},
		{"absent is not found", live(nil), expect{err: intent.ErrNotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.Cancel(tc.v, cancel, now), tc.want)
		})
	}
}
