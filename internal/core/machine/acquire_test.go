package machine_test

import (
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// acquireBy is an Acquire by the caller's session.
func acquireBy(requestID string, reg *intent.Registration) machine.AcquireCall {
	req := &intent.AcquireRequest{Tenant: "default", Key: key, SessionID: caller, RequestID: requestID, Register: reg}
	fp := ""
	if reg != nil {
		fp = intent.Fingerprint(reg.Params)
	}
	return machine.AcquireCall{Req: req, Session: machine.Session{ID: caller, Rev: callerR, Worker: "w-caller"}, Fingerprint: fp, Principal: "worker"}
}

func registration() *intent.Registration {
	return &intent.Registration{Tenant: "default", Key: key, Params: []byte(`{"item":"lamp"}`), RequestID: "reg-1"}
}

// Every Acquire of the diagram: what each state yields, and the guards the
// new lease relies on.
func TestAcquireTransitions(t *testing.T) {
	granted := func(mode intent.Mode, outcome intent.Outcome) func(*testing.T, machine.Decision) {
		return func(t *testing.T, d machine.Decision) {
			l := d.Next.Lease
			if l.Token != 0 || l.Mode != mode || l.SessionID != caller || l.SessionRev != callerR || l.RequestID != "acq-2" {
				t.Errorf("lease %+v, want token 0 (this write's revision), mode %v, the caller's session and request", l, mode)
			}
			if e := last(d); e.Kind != intent.EventAcquired || !e.Issued || e.Mode != mode || e.Principal != "worker" {
				t.Errorf("last history entry %+v, want the acquisition, issued, by worker", e)
			}
			a := d.Finish(commit(d, rev+5), rev+5)
			if a.Outcome != outcome || !a.Lease || !a.Fresh || a.Intent.Lease.Token != 75 || !a.Intent.Lease.Live {
				t.Errorf("answer %+v (lease %+v), want %v with a fresh live lease under token 75", a, a.Intent.Lease, outcome)
			}
		}
	}
	answered := func(outcome intent.Outcome, lease bool) func(*testing.T, machine.Decision) {
		return func(t *testing.T, d machine.Decision) {
			if a := d.Answer; a.Outcome != outcome || a.Lease != lease || a.Fresh {
				t.Errorf("answer outcome %v lease %t fresh %t, want %v %t false", a.Outcome, a.Lease, a.Fresh, outcome, lease)
			}
		}
	}
	sessionAlive := []machine.GuardKind{machine.RecordAt, machine.SessionAlive}
	for _, tc := range []struct {
		name string
		v    *machine.View
		call machine.AcquireCall
		want expect
	}{
		{"PENDING yields EXECUTE", live(pending()), acquireBy("acq-2", nil),
			expect{state: intent.StateInProgress, guards: sessionAlive, show: machine.ShowNextHeld, shown: intent.StateInProgress, check: granted(intent.ModeExecute, intent.OutcomeExecute)}},
		{"UNKNOWN yields RECONCILE under a new token", live(in(intent.StateUnknown)), acquireBy("acq-2", nil),
			expect{state: intent.StateInProgress, guards: sessionAlive, show: machine.ShowNextHeld, check: granted(intent.ModeReconcile, intent.OutcomeReconcile)}},
		{"a lapsed holder yields RECONCILE while it stays gone", lapsed(held(intent.ModeExecute)), acquireBy("acq-2", nil),
			expect{state: intent.StateInProgress, guards: []machine.GuardKind{machine.RecordAt, machine.SessionGone, machine.SessionAlive},
				show: machine.ShowNextHeld, ended: machine.EndedLapsedAtAcquire, check: func(t *testing.T, d machine.Decision) {
					granted(intent.ModeReconcile, intent.OutcomeReconcile)(t, d)
					if g := d.Guards[1]; g.Session != holder || g.Rev != holderR {
						t.Errorf("guard %+v, want the holder's session gone", g)
					}
					if d.Next.Attempts != 1 || d.Next.EndedToken != tok {
						t.Errorf("attempts %d ended token %v, want the lapsed lease counted once (1, %v)", d.Next.Attempts, d.Next.EndedToken, tok)
					}
					if e := d.Next.History[len(d.Next.History)-2]; e.Kind != intent.EventLeaseLapsed || e.Token != tok {
						t.Errorf("history entry before the acquisition %+v, want the lapse of token %v", e, tok)
					}
				}}},
		{"the last attempt a lapse may end goes to review, no lease", lapsed(func() *machine.Record {
			r := held(intent.ModeReconcile)
			r.Attempts, r.EndedToken = 2, tok-1
			return r
		}()), acquireBy("acq-2", nil),
			expect{state: intent.StateNeedsReview, guards: []machine.GuardKind{machine.RecordAt, machine.SessionGone}, show: machine.ShowNext,
				shown: intent.StateNeedsReview, ended: machine.EndedLapsedAtAcquire, exh: true, check: func(t *testing.T, d machine.Decision) {
					if a := d.Finish(commit(d, rev+1), rev+1); a.Outcome != intent.OutcomeNeedsReview || a.Lease || a.Fresh {
						t.Errorf("answer %+v, want NEEDS_REVIEW without a lease", a)
					}
					if e := last(d); e.Kind != intent.EventEscalated || e.Principal != "intentd" {
						t.Errorf("last entry %+v, want intentd's escalation", e)
					}
				}}},
		{"a live holder answers IN_PROGRESS with its lease", live(held(intent.ModeExecute)), acquireBy("acq-2", nil),
			expect{shown: intent.StateInProgress, check: func(t *testing.T, d machine.Decision) {
				answered(intent.OutcomeInProgress, true)(t, d)
				if l := d.Answer.Intent.Lease; l.SessionID != holder || !l.Live || l.Token != tok {
					t.Errorf("lease %+v, want the holder's, live", l)
				}
			}}},
		{"a retry of the call that issued the lease gets it again", func() *machine.View {
			v := live(held(intent.ModeReconcile))
			v.Rec.Lease.SessionID, v.Rec.Lease.SessionRev, v.Rec.Lease.RequestID = caller, callerR, "acq-2"
			return v
		}(), acquireBy("acq-2", nil), expect{shown: intent.StateInProgress, check: answered(intent.OutcomeReconcile, true)}},
		{"the same session with another request id waits", func() *machine.View {
			v := live(held(intent.ModeExecute))
			v.Rec.Lease.SessionID, v.Rec.Lease.SessionRev = caller, callerR
			return v
		}(), acquireBy("acq-3", nil), expect{shown: intent.StateInProgress, check: answered(intent.OutcomeInProgress, true)}},
		{"COMPLETED is replayed", live(in(intent.StateCompleted)), acquireBy("acq-2", nil),
			expect{shown: intent.StateCompleted, check: func(t *testing.T, d machine.Decision) {
				answered(intent.OutcomeCompleted, false)(t, d)
				if string(d.Answer.Intent.Result.Payload) != `{"order":"SO-1"}` {
					t.Errorf("replayed result %q, want the stored one byte for byte", d.Answer.Intent.Result.Payload)
				}
			}}},
		{"FAILED is replayed", live(in(intent.StateFailed)), acquireBy("acq-2", nil), expect{shown: intent.StateFailed, check: answered(intent.OutcomeFailed, false)}},
		{"CANCELLED is replayed", live(in(intent.StateCancelled)), acquireBy("acq-2", nil), expect{shown: intent.StateCancelled, check: answered(intent.OutcomeCancelled, false)}},
		{"NEEDS_REVIEW is answered, nobody acts", live(in(intent.StateNeedsReview)), acquireBy("acq-2", nil),
			expect{shown: intent.StateNeedsReview, check: answered(intent.OutcomeNeedsReview, false)}},
		{"a tombstone is EXPIRED", func() *machine.View {
			v := live(nil)
			v.Tomb = &machine.Tombstone{Key: key, State: intent.StateCompleted, Fingerprint: "fp-1", CompletedAt: t0}
			return v
		}(), acquireBy("acq-2", registration()), expect{shown: intent.StateCompleted, check: answered(intent.OutcomeExpired, false)}},
		{"absent without a registration is not found", live(nil), acquireBy("acq-2", nil), expect{err: intent.ErrNotFound}},
		{"absent with a registration registers and executes in one write", live(nil), acquireBy("acq-2", registration()),
			expect{state: intent.StateInProgress, guards: []machine.GuardKind{machine.RecordAt, machine.NoTombstone, machine.SessionAlive},
				show: machine.ShowNextHeld, check: func(t *testing.T, d machine.Decision) {
					granted(intent.ModeExecute, intent.OutcomeExecute)(t, d)
					if h := d.Next.History; len(h) != 2 || h[0].Kind != intent.EventRegistered || h[0].RequestID != "reg-1" {
						t.Errorf("history %+v, want the registration then the acquisition", h)
					}
				}}},
		{"an optimistic view relies on its guards alone", &machine.View{Key: key, Sessions: map[string]int64{caller: callerR}},
			func() machine.AcquireCall {
				c := acquireBy("acq-2", registration())
				c.Req.Register.ParentKey = "parent"
				return c
			}(),
			expect{state: intent.StateInProgress, guards: []machine.GuardKind{machine.RecordAt, machine.NoTombstone, machine.Exists, machine.SessionAlive}, show: machine.ShowNextHeld}},
		{"another fingerprint is a conflict", live(pending()), func() machine.AcquireCall {
			c := acquireBy("acq-2", nil)
			c.Fingerprint = "fp-other"
			return c
		}(), expect{err: intent.ErrFingerprintMismatch}},
		{"a lapsed caller's session is refused", func() *machine.View {
			v := live(pending())
			v.Sessions[caller] = 0
			return v
		}(), acquireBy("acq-2", nil), expect{err: intent.ErrSessionNotFound}},
		{"a session reopened under the same id is another session", func() *machine.View {
			v := live(pending())
			v.Sessions[caller] = callerR + 1
			return v
		}(), acquireBy("acq-2", nil), expect{err: intent.ErrSessionNotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.Acquire(tc.v, tc.call, now), tc.want)
		})
	}
}

// A final record is replayed from memory until its retention ends, then
// etcd is asked; a record not final is never answered from memory.
func TestReplayFinal(t *testing.T) {
	retained := t0.Add(30 * time.Minute) // the fixtures retain final records for an hour
	for _, tc := range []struct {
		name    string
		rec     *machine.Record
		fp      string
		at      time.Time
		wantOK  bool
		wantErr error
	}{
		{"completed, retained", in(intent.StateCompleted), "", retained, true, nil},
		{"completed, same fingerprint", in(intent.StateCompleted), fp1, retained, true, nil},
		{"completed, another fingerprint", in(intent.StateCompleted), "fp-2", retained, true, intent.ErrFingerprintMismatch},
		{"cancelled, retained", in(intent.StateCancelled), "", retained, true, nil},
		{"completed, at the end of its retention", in(intent.StateCompleted), "", t0.Add(time.Hour), false, nil},
		{"pending", pending(), "", retained, false, nil},
		{"in progress", held(intent.ModeExecute), "", retained, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &machine.View{Key: key, Rec: tc.rec, Rev: rev}
			d, ok := machine.ReplayFinal(v, tc.fp, tc.at)
			if ok != tc.wantOK || !errorsIs(d.Err, tc.wantErr) || d.Writes() {
				t.Fatalf("ReplayFinal = %+v, %t; want ok %t, refusal %v, no write", d, ok, tc.wantOK, tc.wantErr)
			}
			if ok && tc.wantErr == nil && (d.Answer.Intent.State != tc.rec.State || d.Answer.Lease) {
				t.Errorf("answer %+v, want the final state replayed without a lease", d.Answer)
			}
		})
	}
}
