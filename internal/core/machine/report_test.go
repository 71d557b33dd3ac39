package machine_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

func report(kind intent.ReportKind, t fencing.Token) machine.ReportCall {
	r := &intent.Report{Tenant: "default", Key: key, Token: t, Kind: kind, Reason: "why"}
	switch kind {
	case intent.ReportComplete:
		r.Result = &intent.Result{Payload: []byte(`{"order":"SO-9"}`), ExternalRefs: map[string]string{"supplier_order_id": "SO-9"}}
	case intent.ReportFail:
		r.Failure = &intent.Failure{Code: "declined"}
	}
	return machine.ReportCall{Report: r, Principal: "worker"}
}

// Every report of the diagram, accepted or refused.
func TestReportTransitions(t *testing.T) {
	accepted := func(kind intent.EventKind) func(*testing.T, machine.Decision) {
		return func(t *testing.T, d machine.Decision) {
			e := last(d)
			if d.Next.State == intent.StateNeedsReview { // the attempts limit's own entry comes last
				e = d.Next.History[len(d.Next.History)-2]
			}
			if e.Kind != kind || !e.Accepted || e.Token != tok || e.SessionID != holder || e.Principal != "worker" {
				t.Errorf("report entry %+v, want accepted %v under %v naming the holder's session", e, kind, tok)
			}
			if !d.Next.UpdatedAt.Equal(now) {
				t.Errorf("UpdatedAt %v, want %v", d.Next.UpdatedAt, now)
			}
		}
	}
	final := func(kind intent.EventKind) func(*testing.T, machine.Decision) {
		return func(t *testing.T, d machine.Decision) {
			accepted(kind)(t, d)
			if !d.Next.CompletedAt.Equal(now) || !d.Next.RetainUntil.Equal(now.Add(d.Next.Retention)) {
				t.Errorf("completed %v retained until %v, want now and now + retention", d.Next.CompletedAt, d.Next.RetainUntil)
			}
		}
	}
	completed := func(t *testing.T, d machine.Decision) {
		final(intent.EventCompleted)(t, d)
		if string(d.Next.Result.Payload) != `{"order":"SO-9"}` {
			t.Errorf("result %q, want the reported one", d.Next.Result.Payload)
		}
		if e := last(d); e.Result.Payload != nil || e.PayloadSHA256 == "" || e.Result.ExternalRefs["supplier_order_id"] != "SO-9" {
			t.Errorf("history entry %+v, want the refs and the payload's digest, not the payload", e)
		}
	}
	evidence := func(t *testing.T, d machine.Decision) {
		if e := last(d); e.Accepted || e.Token == tok+1 {
			t.Errorf("evidence %+v, want a refused entry", e)
		}
	}
	write := []machine.GuardKind{machine.RecordAt}
	for _, tc := range []struct {
		name string
		v    *machine.View
		call machine.ReportCall
		want expect
	}{
		{"Complete under the current token: COMPLETED", live(held(intent.ModeExecute)), report(intent.ReportComplete, tok),
			expect{state: intent.StateCompleted, guards: write, show: machine.ShowNext, shown: intent.StateCompleted, check: completed}},
		{"Complete after the lease lapsed, no newer token: still accepted", lapsed(held(intent.ModeExecute)), report(intent.ReportComplete, tok),
			expect{state: intent.StateCompleted, guards: write, show: machine.ShowNext, check: completed}},
		{"Complete of an UNKNOWN intent: the evidence was found", live(in(intent.StateUnknown)), report(intent.ReportComplete, tok),
			expect{state: intent.StateCompleted, guards: write, show: machine.ShowNext, check: final(intent.EventCompleted)}},
		{"Fail: FAILED", live(held(intent.ModeExecute)), report(intent.ReportFail, tok),
			expect{state: intent.StateFailed, guards: write, show: machine.ShowNext, check: func(t *testing.T, d machine.Decision) {
				final(intent.EventFailed)(t, d)
				if d.Next.Failure.Code != "declined" {
					t.Errorf("failure %+v, want the reported one", d.Next.Failure)
				}
			}}},
		{"MarkUnknown: UNKNOWN, one attempt counted", live(held(intent.ModeExecute)), report(intent.ReportMarkUnknown, tok),
			expect{state: intent.StateUnknown, guards: write, show: machine.ShowNext, ended: machine.EndedMarkedUnknown, check: func(t *testing.T, d machine.Decision) {
				accepted(intent.EventMarkedUnknown)(t, d)
				if d.Next.Attempts != 1 || d.Next.EndedToken != tok {
					t.Errorf("attempts %d ended %v, want 1 and %v", d.Next.Attempts, d.Next.EndedToken, tok)
				}
			}}},
		{"MarkUnknown at the attempts limit: NEEDS_REVIEW", live(func() *machine.Record {
			r := held(intent.ModeReconcile)
			r.Attempts, r.EndedToken = 2, tok-1
			return r
		}()), report(intent.ReportMarkUnknown, tok),
			expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext, ended: machine.EndedMarkedUnknown, exh: true, check: accepted(intent.EventMarkedUnknown)}},
		{"MarkUnknown of a lease whose lapse was counted counts nothing more", live(in(intent.StateUnknown)), report(intent.ReportMarkUnknown, tok),
			expect{state: intent.StateUnknown, guards: write, show: machine.ShowNext, ended: machine.EndedMarkedUnknown, check: func(t *testing.T, d machine.Decision) {
				if d.Next.Attempts != 1 {
					t.Errorf("attempts %d, want still 1", d.Next.Attempts)
				}
			}}},
		{"Release after reconciling: PENDING, the count kept", live(held(intent.ModeReconcile)), report(intent.ReportRelease, tok),
			expect{state: intent.StatePending, guards: write, show: machine.ShowNext, check: accepted(intent.EventReleased)}},
		{"a retried Complete is replayed", live(in(intent.StateCompleted)), func() machine.ReportCall {
			c := report(intent.ReportComplete, tok)
			c.Report.Result = &intent.Result{Payload: []byte(`{"order":"SO-1"}`)}
			return c
		}(), expect{shown: intent.StateCompleted, check: func(t *testing.T, d machine.Decision) {
			if !d.Answer.Replayed {
				t.Error("not Replayed")
			}
		}}},
		{"a retried Complete with another result is a mismatch", live(in(intent.StateCompleted)), report(intent.ReportComplete, tok), expect{err: intent.ErrResultMismatch}},
		{"a replay of a Release whose intent is held again shows the holder", live(func() *machine.Record {
			r := held(intent.ModeExecute)
			r.History = append(r.History, intent.Event{Kind: intent.EventReleased, Token: tok - 5, Accepted: true})
			return r
		}()), report(intent.ReportRelease, tok-5), expect{shown: intent.StateInProgress}},
		{"a replay that shows a holder not read asks for it", &machine.View{Key: key, Rec: func() *machine.Record {
			r := held(intent.ModeExecute)
			r.History = append(r.History, intent.Event{Kind: intent.EventReleased, Token: tok - 5, Accepted: true})
			return r
		}(), Rev: rev}, report(intent.ReportRelease, tok-5), expect{need: holder}},
		{"a report under the current token of NEEDS_REVIEW is evidence, refused", live(in(intent.StateNeedsReview)), report(intent.ReportComplete, tok),
			expect{err: intent.ErrInvalidTransition, state: intent.StateNeedsReview, guards: write, shown: intent.StateNeedsReview, check: func(t *testing.T, d machine.Decision) {
				evidence(t, d)
				var tr *intent.TransitionError
				if errors.As(d.Err, &tr); !tr.Evidence || tr.Call != "Complete" {
					t.Errorf("refusal %+v, want Evidence for Complete", tr)
				}
			}}},
		{"Complete of an intent completed otherwise is a mismatch", live(func() *machine.Record {
			r := in(intent.StateCompleted)
			r.History = r.History[:len(r.History)-1] // completed by a reviewer, say
			return r
		}()), report(intent.ReportComplete, tok), expect{err: intent.ErrResultMismatch}},
		{"Fail of a FAILED intent under its token, not a retry, is refused", live(func() *machine.Record {
			r := in(intent.StateFailed)
			r.History = r.History[:len(r.History)-1]
			return r
		}()), report(intent.ReportFail, tok), expect{err: intent.ErrInvalidTransition, shown: intent.StateFailed}},
		{"a report on a released (PENDING) intent is refused", live(func() *machine.Record {
			r := in(intent.StatePending)
			r.Lease = &machine.Lease{Token: tok}
			return r
		}()), report(intent.ReportComplete, tok), expect{err: intent.ErrInvalidTransition, shown: intent.StatePending}},
		{"absent is not found", live(nil), report(intent.ReportComplete, tok), expect{err: intent.ErrNotFound}},
		{"a tombstone is expired", func() *machine.View {
			v := live(nil)
			v.Tomb = &machine.Tombstone{Key: key, State: intent.StateCompleted}
			return v
		}(), report(intent.ReportComplete, tok), expect{err: intent.ErrExpired}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.Report(tc.v, tc.call, now), tc.want)
		})
	}
}

// A Complete registers its children in its own write (the outbox): each
// new child guarded absent and without a tombstone.
func TestReportOutbox(t *testing.T) {
	child := func(k, params string) intent.Registration {
		return intent.Registration{Tenant: "default", Key: k, Params: []byte(params), ParentKey: key}
	}
	withChildren := func(cs ...intent.Registration) machine.ReportCall {
		c := report(intent.ReportComplete, tok)
		c.Report.Children = cs
		return c
	}
	existing := &machine.Record{Key: "c-old", Fingerprint: intent.Fingerprint([]byte(`{"n":1}`)), ParentKey: key}
	for _, tc := range []struct {
		name        string
		others      map[string]machine.Other
		call        machine.ReportCall
		wantErr     error
		wantCreated []string
		wantGuards  []machine.GuardKind
	}{
		{"two new children", map[string]machine.Other{"c-1": {}, "c-2": {}}, withChildren(child("c-1", `{"n":1}`), child("c-2", `{"n":2}`)), nil,
			[]string{"c-1", "c-2"}, []machine.GuardKind{machine.RecordAt, machine.RecordAt, machine.NoTombstone, machine.RecordAt, machine.NoTombstone}},
		{"a child registered already with the same params is left alone", map[string]machine.Other{"c-old": {Rec: existing}}, withChildren(child("c-old", `{"n":1}`)), nil,
			nil, []machine.GuardKind{machine.RecordAt}},
		{"a child registered with other params refuses the completion", map[string]machine.Other{"c-old": {Rec: existing}}, withChildren(child("c-old", `{"n":2}`)),
			intent.ErrFingerprintMismatch, nil, nil},
		{"an expired child refuses the completion", map[string]machine.Other{"c-1": {Tomb: &machine.Tombstone{Key: "c-1"}}}, withChildren(child("c-1", `{"n":1}`)),
			intent.ErrInvalid, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := live(held(intent.ModeExecute))
			v.Others = tc.others
			d := rules.Report(v, tc.call, now)
			if !errorsIs(d.Err, tc.wantErr) {
				t.Fatalf("refusal %v, want %v", d.Err, tc.wantErr)
			}
			if tc.wantErr != nil {
				if d.Writes() {
					t.Errorf("a refused completion writes %+v", d.Next)
				}
				return
			}
			var created []string
			for _, c := range d.Create {
				created = append(created, c.Key)
				if c.State != intent.StatePending || c.ParentKey != key || c.History[0].Reason != "registered by the completion of "+key {
					t.Errorf("child %+v, want PENDING under %s, registered by the completion", c, key)
				}
			}
			if !slices.Equal(created, tc.wantCreated) {
				t.Errorf("created %v, want %v", created, tc.wantCreated)
			}
			if got := kinds(d.Guards); !slices.Equal(got, tc.wantGuards) {
				t.Errorf("guards %v, want %v", got, tc.wantGuards)
			}
			n := 0
			for _, e := range d.Next.History {
				if e.Kind == intent.EventChildRegistered {
					n++
				}
			}
			if n != len(tc.wantCreated) {
				t.Errorf("%d child entries in the parent's history, want %d", n, len(tc.wantCreated))
			}
		})
	}
}

// The fence is one function: every fenced call (a report, a worker's
// Escalate, a heartbeat's held lease) answers an older token, the current
// one and one never issued the same way, and shows a stale caller the
// intent as it is — IN_PROGRESS while its holder lives, UNKNOWN once it
// lapsed. The three copies this replaced disagreed on that liveness.
func TestFenceIsOneRule(t *testing.T) {
	calls := []struct {
		name   string
		field  string
		decide func(v *machine.View, t fencing.Token) machine.Decision
		kind   intent.EventKind
	}{
		{"Complete", "token", func(v *machine.View, t fencing.Token) machine.Decision {
			return rules.Report(v, report(intent.ReportComplete, t), now)
		}, intent.EventCompleted},
		{"Escalate", "token", func(v *machine.View, t fencing.Token) machine.Decision {
			return rules.Escalate(v, machine.EscalateCall{Escalation: &intent.Escalation{Tenant: "default", Key: key, Token: t, Reason: "stuck"}, Principal: "worker"}, now)
		}, intent.EventEscalated},
		{"Heartbeat", "leases[3].token", func(v *machine.View, t fencing.Token) machine.Decision {
			return machine.CheckHeld(v, machine.HeldCall{Held: intent.HeldLease{Key: key, Token: t}, Index: 3, Session: machine.Session{ID: caller}, Principal: "worker"}, now)
		}, intent.EventHeartbeat},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			for _, h := range []struct {
				name      string
				alive     bool
				wantState intent.State
			}{{"holder alive", true, intent.StateInProgress}, {"holder lapsed", false, intent.StateUnknown}} {
				t.Run("older token, "+h.name, func(t *testing.T) {
					v := view(held(intent.ModeExecute), h.alive)
					d := c.decide(v, tok-1)
					var stale *intent.StaleTokenError
					if !errors.As(d.Err, &stale) || stale.Token != tok-1 || stale.Current != tok {
						t.Fatalf("refusal %v, want a StaleTokenError naming %v and current %v", d.Err, tok-1, tok)
					}
					if stale.Intent.State != h.wantState || stale.Intent.Lease.Live != h.alive || stale.Intent.Revision != rev {
						t.Errorf("stale refusal shows %v, lease live %t, revision %d; want %v, %t, %d",
							stale.Intent.State, stale.Intent.Lease.Live, stale.Intent.Revision, h.wantState, h.alive, rev)
					}
					if d.Next == nil || d.Next.State != v.Rec.State || d.Next.Lease.Token != tok || len(d.Next.History) != len(v.Rec.History)+1 {
						t.Fatalf("decision %+v, want the record unchanged but one history entry", d)
					}
					if e := last(d); e.Kind != c.kind || e.Accepted || e.Token != tok-1 || !e.Time.Equal(now) {
						t.Errorf("evidence %+v, want a refused %v under %v", e, c.kind, tok-1)
					}
					// Kept once: the same stale call again writes nothing.
					again := v.Rec.Clone()
					again.History = d.Next.History
					v2 := view(again, h.alive)
					if d2 := c.decide(v2, tok-1); d2.Writes() || !errors.Is(d2.Err, intent.ErrStaleToken) {
						t.Errorf("repeated stale call: writes %t, refusal %v; want no write, stale", d2.Writes(), d2.Err)
					}
				})
			}
			t.Run("older token, holder not read", func(t *testing.T) {
				v := &machine.View{Key: key, Rec: held(intent.ModeExecute), Rev: rev}
				if d := c.decide(v, tok-1); d.NeedSession != holder || d.Writes() || d.Err != nil {
					t.Errorf("decision %+v, want only to read the holder's session", d)
				}
			})
			t.Run("token never issued", func(t *testing.T) {
				d := c.decide(live(held(intent.ModeExecute)), tok+1)
				var inv *intent.InvalidError
				if !errors.As(d.Err, &inv) || inv.Field != c.field || d.Writes() {
					t.Errorf("decision %+v (refusal %v), want invalid %s, nothing written", d, d.Err, c.field)
				}
			})
			t.Run("current token passes", func(t *testing.T) {
				d := c.decide(live(held(intent.ModeExecute)), tok)
				if errors.Is(d.Err, intent.ErrStaleToken) || errors.Is(d.Err, intent.ErrInvalid) {
					t.Errorf("refusal %v under the current token", d.Err)
				}
			})
		})
	}
}

// A heartbeat under the current token decides nothing at all: no write,
// no refusal (the common case, decided on the heartbeat's one read).
func TestCheckHeld(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v       *machine.View
		token   fencing.Token
		wantErr error
		write   bool
	}{
		{"current, holder alive", live(held(intent.ModeExecute)), tok, nil, false},
		{"current, holder not read", &machine.View{Key: key, Rec: held(intent.ModeExecute), Rev: rev, Fresh: true}, tok, nil, false},
		{"current, UNKNOWN", live(in(intent.StateUnknown)), tok, nil, false},
		{"superseded", live(held(intent.ModeExecute)), tok - 1, intent.ErrStaleToken, true},
		{"never issued", live(held(intent.ModeExecute)), tok + 1, intent.ErrInvalid, false},
		{"absent", live(nil), tok, intent.ErrNotFound, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := machine.CheckHeld(tc.v, machine.HeldCall{Held: intent.HeldLease{Key: key, Token: tc.token}, Index: 0, Session: machine.Session{ID: caller}}, now)
			if !errorsIs(d.Err, tc.wantErr) || d.Writes() != tc.write || d.NeedSession != "" {
				t.Errorf("decision %+v (refusal %v), want refusal %v, write %t", d, d.Err, tc.wantErr, tc.write)
			}
		})
	}
}
