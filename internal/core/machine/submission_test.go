package machine_test

import (
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

const op = "create-pickup"

var sent = intent.SubmittedRequest{Upstream: "courier", Method: "POST", Target: "/pickups?x=1", BodySHA256: strings.Repeat("ab", 32), BodyBytes: 42, Body: []byte(`{"parcel":"P-1"}`)}

// begin is a BeginSubmission of op under token t, as submission id.
func begin(t fencing.Token, id string, lookup, hasLookup bool) machine.BeginCall {
	return machine.BeginCall{Principal: "worker", Start: &intent.SubmissionStart{
		Tenant: "default", Key: key, Operation: op, Token: t, ID: id, Lookup: lookup, HasLookup: hasLookup,
		Request: sent, Timeout: 30 * time.Second,
	}}
}

// end is a RecordSubmission of op's submission id under token t.
func end(t fencing.Token, id string, o intent.SubmissionOutcome) machine.RecordCall {
	e := &intent.SubmissionEnd{Tenant: "default", Key: key, Operation: op, Token: t, ID: id, Outcome: o}
	switch o {
	case intent.OutcomeAnswered, intent.OutcomeRefusedUpstream, intent.OutcomeFound:
		e.Response = &intent.UpstreamResponse{Status: 201, Header: []intent.HeaderField{{Name: "Content-Type", Value: "application/json"}}, Body: []byte(`{"id":"PU-1"}`), BodyBytes: 13}
	default:
		e.Error = "read tcp: connection reset by peer"
	}
	return machine.RecordCall{End: e, Principal: "worker"}
}

// submitted is rec with op's submission in state st under token t, begun
// at t0 with id "sub-1" and a deadline d after it; Unknown ones leave
// their loss in the history.
func submitted(rec *machine.Record, st intent.SubmissionState, t fencing.Token, hasLookup bool, d time.Duration) *machine.Record {
	s := intent.Submission{Operation: op, ID: "sub-1", Token: t, State: st, Request: sent, HasLookup: hasLookup, StartedAt: t0, Deadline: t0.Add(d)}
	switch st {
	case intent.SubmissionRecorded, intent.SubmissionRefused:
		s.Response = &intent.UpstreamResponse{Status: 201, Body: []byte(`{"id":"PU-1"}`), BodyBytes: 13}
	case intent.SubmissionUnknown:
		rec.History = append(rec.History, intent.Event{Kind: intent.EventSubmissionUnknown, Token: t, Accepted: true, RequestID: "sub-1"})
	}
	rec.History = append(rec.History, intent.Event{Kind: intent.EventSubmissionStarted, Token: t, Accepted: true, RequestID: "sub-1"})
	rec.Submissions = append(rec.Submissions, s)
	return rec
}

func sub(d machine.Decision) intent.Submission {
	for _, s := range d.Next.Submissions {
		if s.Operation == op {
			return s
		}
	}
	return intent.Submission{}
}

func verdictIs(want intent.SubmissionVerdict, replayed bool) func(*testing.T, machine.Decision) {
	return func(t *testing.T, d machine.Decision) {
		if d.Answer.Verdict != want || d.Answer.Replayed != replayed {
			t.Errorf("verdict %v replayed %t, want %v %t", d.Answer.Verdict, d.Answer.Replayed, want, replayed)
		}
		if d.Answer.Submission == nil || d.Answer.Submission.Operation != op {
			t.Errorf("answer's submission %+v, want op's", d.Answer.Submission)
		}
	}
}

func TestBeginSubmission(t *testing.T) {
	forward := []machine.GuardKind{machine.RecordAt, machine.SessionAlive}
	started := func(t *testing.T, d machine.Decision) {
		verdictIs(intent.VerdictForward, false)(t, d)
		s := sub(d)
		if s.State != intent.SubmissionInFlight || s.ID != "sub-2" || s.Token != tok || !s.StartedAt.Equal(now) || !s.Deadline.Equal(now.Add(30*time.Second)) || s.Request.Target != sent.Target {
			t.Errorf("submission %+v, want in flight under sub-2, token %v, from now for 30s", s, tok)
		}
		if g := d.Guards[1]; g.Session != holder || g.Rev != holderR {
			t.Errorf("guard %+v, want the holder's session alive", g)
		}
		e := last(d)
		if e.Kind != intent.EventSubmissionStarted || !e.Accepted || e.Token != tok || e.RequestID != "sub-2" || e.SessionID != holder || !strings.Contains(e.Reason, "POST /pickups?x=1") {
			t.Errorf("history entry %+v, want the accepted start of sub-2 saying what is sent", e)
		}
	}
	lostTo := func(st intent.State, escalated bool) func(*testing.T, machine.Decision) {
		return func(t *testing.T, d machine.Decision) {
			verdictIs(intent.VerdictUnknown, false)(t, d)
			s := sub(d)
			if s.State != intent.SubmissionUnknown || !s.EndedAt.Equal(now) || !strings.Contains(s.Error, "deadline") {
				t.Errorf("submission %+v, want unknown since now, for its deadline", s)
			}
			var lost *intent.Event
			for i := range d.Next.History {
				if e := &d.Next.History[i]; e.Kind == intent.EventSubmissionUnknown && e.RequestID == "sub-1" && e.Accepted {
					lost = e
				}
			}
			if lost == nil || !strings.Contains(lost.Reason, "POST /pickups?x=1") || !strings.Contains(lost.Reason, t0.Format(time.RFC3339Nano)) {
				t.Fatalf("history %+v, want the loss with what was sent and when", d.Next.History)
			}
			if e := last(d); (e.Kind == intent.EventEscalated) != escalated || (escalated && !strings.Contains(e.Reason, "no lookup")) {
				t.Errorf("last entry %+v, escalated %t", e, escalated)
			}
		}
	}
	confirmedAbsent := func() *machine.Record {
		r := submitted(held(intent.ModeExecute), intent.SubmissionUnknown, tok-3, true, time.Minute)
		r.History = append(r.History, intent.Event{Kind: intent.EventReleased, Token: tok - 2, Accepted: true})
		return r
	}
	for _, tc := range []struct {
		name string
		v    *machine.View
		call machine.BeginCall
		want expect
	}{
		{"first submission under a live EXECUTE lease: forward, in flight", live(held(intent.ModeExecute)), begin(tok, "sub-2", false, false),
			expect{state: intent.StateInProgress, guards: forward, show: machine.ShowNextHeld, shown: intent.StateInProgress, check: started}},
		{"first submission under a RECONCILE lease: nothing was sent through the gateway, forward", live(held(intent.ModeReconcile)), begin(tok, "sub-2", false, false),
			expect{state: intent.StateInProgress, guards: forward, show: machine.ShowNextHeld, check: started}},
		{"a superseded token: STALE_TOKEN, the attempt kept as evidence", live(held(intent.ModeExecute)), begin(tok-1, "sub-2", false, false),
			expect{err: intent.ErrStaleToken, state: intent.StateInProgress, guards: []machine.GuardKind{machine.RecordAt}, shown: intent.StateInProgress, check: func(t *testing.T, d machine.Decision) {
				if e := last(d); e.Kind != intent.EventSubmissionStarted || e.Accepted || e.Token != tok-1 || e.RequestID != "sub-2" {
					t.Errorf("evidence %+v, want the refused start under the stale token", e)
				}
				if len(d.Next.Submissions) != 0 {
					t.Errorf("submissions %+v, want none", d.Next.Submissions)
				}
			}}},
		{"a superseded token, its evidence kept already: refused, nothing written", live(func() *machine.Record {
			r := held(intent.ModeExecute)
			r.History = append(r.History, intent.Event{Kind: intent.EventSubmissionStarted, Token: tok - 1})
			return r
		}()), begin(tok-1, "sub-3", false, false), expect{err: intent.ErrStaleToken}},
		{"a superseded token, the answer recorded: refused all the same", live(submitted(held(intent.ModeReconcile), intent.SubmissionRecorded, tok-1, false, time.Minute)), begin(tok-1, "sub-3", false, false),
			expect{err: intent.ErrStaleToken, state: intent.StateInProgress, guards: []machine.GuardKind{machine.RecordAt}}},
		{"a token never issued", live(held(intent.ModeExecute)), begin(tok+1, "sub-2", false, false), expect{err: intent.ErrInvalid}},
		{"the lease lapsed, no newer token: refused, nothing sent", lapsed(held(intent.ModeExecute)), begin(tok, "sub-2", false, false),
			expect{err: intent.ErrInvalidTransition, shown: intent.StateUnknown}},
		{"the holder's session not read: read it first", &machine.View{Key: key, Rec: held(intent.ModeExecute), Rev: rev, Sessions: map[string]int64{}},
			begin(tok, "sub-2", false, false), expect{need: holder}},
		{"an intent waiting for review: refused, kept as evidence", live(in(intent.StateNeedsReview)), begin(tok, "sub-2", false, false),
			expect{err: intent.ErrInvalidTransition, state: intent.StateNeedsReview, guards: []machine.GuardKind{machine.RecordAt}}},
		{"an UNKNOWN intent (the lease ended): refused", live(in(intent.StateUnknown)), begin(tok, "sub-2", false, false), expect{err: intent.ErrInvalidTransition}},
		{"a completed intent without a recorded answer: refused", live(in(intent.StateCompleted)), begin(tok, "sub-2", false, false), expect{err: intent.ErrInvalidTransition}},
		{"the answer is recorded: replay it, send nothing", live(submitted(held(intent.ModeExecute), intent.SubmissionRecorded, tok, false, time.Minute)), begin(tok, "sub-2", false, false),
			expect{shown: intent.StateInProgress, check: verdictIs(intent.VerdictReplay, false)}},
		{"recorded under an older lease, asked by the newer holder: replay", live(submitted(held(intent.ModeReconcile), intent.SubmissionRecorded, tok-5, false, time.Minute)), begin(tok, "sub-2", false, false),
			expect{check: verdictIs(intent.VerdictReplay, false)}},
		{"recorded, the intent completed since: replay", live(submitted(in(intent.StateCompleted), intent.SubmissionRecorded, tok, false, time.Minute)), begin(tok, "sub-2", false, false),
			expect{shown: intent.StateCompleted, check: verdictIs(intent.VerdictReplay, false)}},
		{"another submission in flight: busy", live(submitted(held(intent.ModeExecute), intent.SubmissionInFlight, tok, false, 2*time.Hour)), begin(tok, "sub-2", false, false),
			expect{check: verdictIs(intent.VerdictBusy, false)}},
		{"in flight under an older lease, asked by the newer holder: busy", live(submitted(held(intent.ModeReconcile), intent.SubmissionInFlight, tok-5, true, 2*time.Hour)), begin(tok, "sub-2", false, false),
			expect{check: verdictIs(intent.VerdictBusy, false)}},
		{"this very submission again (a read-back): forward, replayed", live(submitted(held(intent.ModeExecute), intent.SubmissionInFlight, tok, false, 2*time.Hour)), begin(tok, "sub-1", false, false),
			expect{check: verdictIs(intent.VerdictForward, true)}},
		{"this very submission, its token superseded since: still its own", live(submitted(held(intent.ModeReconcile), intent.SubmissionInFlight, tok-5, false, 2*time.Hour)), func() machine.BeginCall {
			c := begin(tok-5, "sub-1", false, false)
			return c
		}(), expect{check: verdictIs(intent.VerdictForward, true)}},
		{"in flight past its deadline, a lookup offered: unknown, the lease ended (UNKNOWN)", live(submitted(held(intent.ModeExecute), intent.SubmissionInFlight, tok, true, time.Minute)), begin(tok, "sub-2", false, true),
			expect{state: intent.StateUnknown, guards: []machine.GuardKind{machine.RecordAt}, show: machine.ShowNext, ended: machine.EndedMarkedUnknown, check: func(t *testing.T, d machine.Decision) {
				lostTo(intent.StateUnknown, false)(t, d)
				if d.Next.Attempts != 1 || d.Next.EndedToken != tok {
					t.Errorf("attempts %d ended %v, want the lease counted once", d.Next.Attempts, d.Next.EndedToken)
				}
			}}},
		{"in flight past its deadline, no lookup: NEEDS_REVIEW with the evidence", live(submitted(held(intent.ModeExecute), intent.SubmissionInFlight, tok, false, time.Minute)), begin(tok, "sub-2", false, false),
			expect{state: intent.StateNeedsReview, guards: []machine.GuardKind{machine.RecordAt}, show: machine.ShowNext, check: lostTo(intent.StateNeedsReview, true)}},
		{"in flight past its deadline under an older lease, a lookup offered: the newer lease left alone", live(submitted(held(intent.ModeReconcile), intent.SubmissionInFlight, tok-5, true, time.Minute)), begin(tok, "sub-2", false, true),
			expect{state: intent.StateInProgress, guards: []machine.GuardKind{machine.RecordAt}, show: machine.ShowNext, check: lostTo(intent.StateInProgress, false)}},
		{"in doubt: unknown, send nothing", live(submitted(held(intent.ModeReconcile), intent.SubmissionUnknown, tok-5, true, time.Minute)), begin(tok, "sub-2", false, true),
			expect{check: verdictIs(intent.VerdictUnknown, false)}},
		{"in doubt, asked to look up under a live lease: lookup", live(submitted(held(intent.ModeReconcile), intent.SubmissionUnknown, tok-5, true, time.Minute)), begin(tok, "sub-2", true, true),
			expect{check: verdictIs(intent.VerdictLookup, false)}},
		{"in doubt, a lookup under a lapsed lease: refused", lapsed(submitted(held(intent.ModeReconcile), intent.SubmissionUnknown, tok-5, true, time.Minute)), begin(tok, "sub-2", true, true),
			expect{err: intent.ErrInvalidTransition}},
		{"a lookup with nothing in doubt: refused", live(held(intent.ModeReconcile)), begin(tok, "sub-2", true, true), expect{err: intent.ErrInvalidTransition}},
		{"in doubt, absence confirmed since (Release), executed again: forward", live(confirmedAbsent()), begin(tok, "sub-2", false, true),
			expect{state: intent.StateInProgress, guards: forward, show: machine.ShowNextHeld, check: started}},
		{"in doubt, a Release before the loss confirms nothing", live(func() *machine.Record {
			r := held(intent.ModeExecute)
			r.History = append(r.History, intent.Event{Kind: intent.EventReleased, Token: tok - 9, Accepted: true})
			return submitted(r, intent.SubmissionUnknown, tok-3, true, time.Minute)
		}()), begin(tok, "sub-2", false, true), expect{check: verdictIs(intent.VerdictUnknown, false)}},
		{"the upstream refused it in so many words: forward anew", live(submitted(held(intent.ModeExecute), intent.SubmissionRefused, tok, false, time.Minute)), begin(tok, "sub-2", false, false),
			expect{state: intent.StateInProgress, guards: forward, show: machine.ShowNextHeld, check: started}},
		{"it reached nobody: forward anew", live(submitted(held(intent.ModeExecute), intent.SubmissionAbsent, tok, false, time.Minute)), begin(tok, "sub-2", false, false),
			expect{state: intent.StateInProgress, guards: forward, show: machine.ShowNextHeld, check: started}},
		{"one operation too many", live(func() *machine.Record {
			r := held(intent.ModeExecute)
			for i := range intent.MaxSubmissions {
				r.Submissions = append(r.Submissions, intent.Submission{Operation: "op-" + string(rune('a'+i)), State: intent.SubmissionRecorded})
			}
			return r
		}()), begin(tok, "sub-2", false, false), expect{err: intent.ErrInvalid}},
		{"an intent never registered", live(nil), begin(tok, "sub-2", false, false), expect{err: intent.ErrNotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rules.BeginSubmission(tc.v, tc.call, now)
			verify(t, tc.v, d, tc.want)
			if d.Next != nil && tc.v.Rec != nil && len(tc.v.Rec.Submissions) > 0 && &d.Next.Submissions[0] == &tc.v.Rec.Submissions[0] {
				t.Error("the next version shares the view's submissions")
			}
		})
	}
}

func TestRecordSubmission(t *testing.T) {
	write := []machine.GuardKind{machine.RecordAt}
	endsIn := func(st intent.SubmissionState, status int) func(*testing.T, machine.Decision) {
		return func(t *testing.T, d machine.Decision) {
			s := sub(d)
			if s.State != st || !s.EndedAt.Equal(now) || (status != 0) != (s.Response != nil) || (status != 0 && s.Response.Status != status) {
				t.Errorf("submission %+v, want %v with status %d since now", s, st, status)
			}
			if e := last(d); e.Kind != intent.EventSubmissionRecorded || !e.Accepted || e.RequestID != "sub-1" {
				t.Errorf("history entry %+v, want the accepted record of sub-1", e)
			}
			if d.Answer.Submission == nil || d.Answer.Submission.State != st {
				t.Errorf("answer %+v, want the submission", d.Answer.Submission)
			}
		}
	}
	replayed := func(t *testing.T, d machine.Decision) {
		if !d.Answer.Replayed || d.Answer.Submission == nil {
			t.Errorf("answer %+v, want the submission, replayed", d.Answer)
		}
	}
	inFlight := func(m intent.Mode, t fencing.Token, hasLookup bool) *machine.Record {
		return submitted(held(m), intent.SubmissionInFlight, t, hasLookup, time.Minute)
	}
	for _, tc := range []struct {
		name string
		v    *machine.View
		call machine.RecordCall
		want expect
	}{
		{"the upstream's answer: recorded", live(inFlight(intent.ModeExecute, tok, false)), end(tok, "sub-1", intent.OutcomeAnswered),
			expect{state: intent.StateInProgress, guards: write, check: endsIn(intent.SubmissionRecorded, 201)}},
		{"the answer under a lease superseded since: recorded all the same", live(inFlight(intent.ModeReconcile, tok-5, false)), end(tok-5, "sub-1", intent.OutcomeAnswered),
			expect{state: intent.StateInProgress, guards: write, check: endsIn(intent.SubmissionRecorded, 201)}},
		{"the answer after its holder lapsed: recorded", lapsed(inFlight(intent.ModeExecute, tok, false)), end(tok, "sub-1", intent.OutcomeAnswered),
			expect{state: intent.StateInProgress, guards: write, check: endsIn(intent.SubmissionRecorded, 201)}},
		{"the same answer again: replayed, nothing written", live(submitted(held(intent.ModeExecute), intent.SubmissionRecorded, tok, false, time.Minute)), end(tok, "sub-1", intent.OutcomeAnswered),
			expect{check: replayed}},
		{"a definite refusal: refused, may be sent again", live(inFlight(intent.ModeExecute, tok, false)), end(tok, "sub-1", intent.OutcomeRefusedUpstream),
			expect{state: intent.StateInProgress, guards: write, check: endsIn(intent.SubmissionRefused, 201)}},
		{"never sent: absent", live(inFlight(intent.ModeExecute, tok, false)), end(tok, "sub-1", intent.OutcomeNotSent),
			expect{state: intent.StateInProgress, guards: write, check: endsIn(intent.SubmissionAbsent, 0)}},
		{"lost, a lookup offered: UNKNOWN, the attempt counted", live(inFlight(intent.ModeExecute, tok, true)), end(tok, "sub-1", intent.OutcomeLost),
			expect{state: intent.StateUnknown, guards: write, show: machine.ShowNext, shown: intent.StateUnknown, ended: machine.EndedMarkedUnknown, check: func(t *testing.T, d machine.Decision) {
				if s := sub(d); s.State != intent.SubmissionUnknown || s.Error != "read tcp: connection reset by peer" {
					t.Errorf("submission %+v, want unknown, saying what came back", s)
				}
				if e := last(d); e.Kind != intent.EventSubmissionUnknown || !strings.Contains(e.Reason, "connection reset") || !strings.Contains(e.Reason, "sha256 "+sent.BodySHA256) {
					t.Errorf("last entry %+v, want the loss with the evidence", e)
				}
				if d.Answer.Verdict != intent.VerdictUnknown {
					t.Errorf("verdict %v, want UNKNOWN", d.Answer.Verdict)
				}
			}}},
		{"lost at the attempts limit: NEEDS_REVIEW", live(func() *machine.Record {
			r := inFlight(intent.ModeReconcile, tok, true)
			r.Attempts, r.EndedToken = 2, tok-1
			return r
		}()), end(tok, "sub-1", intent.OutcomeLost), expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext, ended: machine.EndedMarkedUnknown, exh: true}},
		{"lost, no lookup: NEEDS_REVIEW, what was sent and when in the escalation", live(inFlight(intent.ModeExecute, tok, false)), end(tok, "sub-1", intent.OutcomeLost),
			expect{state: intent.StateNeedsReview, guards: write, show: machine.ShowNext, shown: intent.StateNeedsReview, check: func(t *testing.T, d machine.Decision) {
				e := last(d)
				for _, want := range []string{"POST /pickups?x=1", "courier", "42 bytes", t0.Format(time.RFC3339Nano), "connection reset", "no lookup"} {
					if e.Kind != intent.EventEscalated || !strings.Contains(e.Reason, want) {
						t.Errorf("escalation %+v, want it to say %q", e, want)
					}
				}
			}}},
		{"lost after the intent completed: the doubt kept, the state too", live(func() *machine.Record {
			return submitted(in(intent.StateCompleted), intent.SubmissionInFlight, tok, false, time.Minute)
		}()), end(tok, "sub-1", intent.OutcomeLost), expect{state: intent.StateCompleted, guards: write, show: machine.ShowNext}},
		{"lost again: replayed", live(submitted(held(intent.ModeExecute), intent.SubmissionUnknown, tok, true, time.Minute)), end(tok, "sub-1", intent.OutcomeLost), expect{check: replayed}},
		{"the answer arrives after the loss was decided: recorded, the state left", live(func() *machine.Record {
			r := submitted(held(intent.ModeExecute), intent.SubmissionUnknown, tok, true, time.Minute)
			r.State = intent.StateUnknown
			return r
		}()), end(tok, "sub-1", intent.OutcomeAnswered), expect{state: intent.StateUnknown, guards: write, check: endsIn(intent.SubmissionRecorded, 201)}},
		{"a lookup found it under the current lease: recorded, looked up", live(submitted(held(intent.ModeReconcile), intent.SubmissionUnknown, tok-5, true, time.Minute)), end(tok, "sub-1", intent.OutcomeFound),
			expect{state: intent.StateInProgress, guards: write, check: func(t *testing.T, d machine.Decision) {
				endsIn(intent.SubmissionRecorded, 201)(t, d)
				if s := sub(d); !s.LookedUp || s.Token != tok-5 {
					t.Errorf("submission %+v, want looked up, still the one sent under %v", s, tok-5)
				}
			}}},
		{"a lookup found nothing: absent", live(submitted(held(intent.ModeReconcile), intent.SubmissionUnknown, tok-5, true, time.Minute)), end(tok, "sub-1", intent.OutcomeNotFound),
			expect{state: intent.StateInProgress, guards: write, check: endsIn(intent.SubmissionAbsent, 0)}},
		{"a lookup under a superseded token: STALE_TOKEN, kept as evidence", live(submitted(held(intent.ModeReconcile), intent.SubmissionUnknown, tok-5, true, time.Minute)), end(tok-2, "sub-1", intent.OutcomeFound),
			expect{err: intent.ErrStaleToken, state: intent.StateInProgress, guards: write}},
		{"a lookup under a lapsed lease: refused", lapsed(submitted(held(intent.ModeReconcile), intent.SubmissionUnknown, tok-5, true, time.Minute)), end(tok, "sub-1", intent.OutcomeNotFound),
			expect{err: intent.ErrInvalidTransition}},
		{"another token than the submission's: refused", live(inFlight(intent.ModeExecute, tok, false)), end(tok-1, "sub-1", intent.OutcomeAnswered), expect{err: intent.ErrInvalid}},
		{"a submission never begun: refused", live(inFlight(intent.ModeExecute, tok, false)), end(tok, "sub-9", intent.OutcomeAnswered), expect{err: intent.ErrInvalid}},
		{"a late answer of a replaced submission: refused, kept as evidence", live(func() *machine.Record {
			r := held(intent.ModeExecute)
			r.History = append(r.History, intent.Event{Kind: intent.EventSubmissionStarted, Token: tok, Accepted: true, RequestID: "sub-0"})
			return submitted(r, intent.SubmissionInFlight, tok, false, time.Minute)
		}()), end(tok, "sub-0", intent.OutcomeAnswered), expect{err: intent.ErrInvalid, state: intent.StateInProgress, guards: write, check: func(t *testing.T, d machine.Decision) {
			if e := last(d); e.Kind != intent.EventSubmissionRecorded || e.Accepted || e.RequestID != "sub-0" {
				t.Errorf("evidence %+v, want the refused record of sub-0", e)
			}
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.RecordSubmission(tc.v, tc.call, now), tc.want)
		})
	}
}

// TestSubmissionsOneEffect walks a worker, a racing worker and a takeover
// through the gateway's decisions as the store would commit them: whatever
// the order, the upstream is told to act once per operation, and every
// later call replays the one answer.
func TestSubmissionsOneEffect(t *testing.T) {
	rec := held(intent.ModeExecute)
	at := rev
	step := func(d machine.Decision) {
		t.Helper()
		if d.Next != nil {
			at++
			rec = commit(d, at)
		}
	}
	forwards := 0
	call := func(tk fencing.Token, id string) machine.Decision {
		v := &machine.View{Key: key, Rec: rec, Rev: at, Fresh: true, Sessions: map[string]int64{holder: holderR}}
		d := rules.BeginSubmission(v, begin(tk, id, false, false), now)
		if d.Err == nil && d.Answer.Verdict == intent.VerdictForward && !d.Answer.Replayed {
			forwards++
		}
		step(d)
		return d
	}
	a := call(tok, "a")
	b := call(tok, "b") // a racing call of the same lease
	if a.Answer.Verdict != intent.VerdictForward || b.Answer.Verdict != intent.VerdictBusy {
		t.Fatalf("verdicts %v, %v: want FORWARD then BUSY", a.Answer.Verdict, b.Answer.Verdict)
	}
	v := &machine.View{Key: key, Rec: rec, Rev: at, Fresh: true, Sessions: map[string]int64{holder: holderR}}
	step(rules.RecordSubmission(v, end(tok, "a", intent.OutcomeAnswered), now))
	for _, id := range []string{"b", "c", "a"} {
		if d := call(tok, id); d.Answer.Verdict != intent.VerdictReplay || string(d.Answer.Submission.Response.Body) != `{"id":"PU-1"}` {
			t.Errorf("%s: verdict %v, want REPLAY of the one answer", id, d.Answer.Verdict)
		}
	}
	if forwards != 1 {
		t.Errorf("%d forwards, want 1", forwards)
	}
}
