package machine_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// TestSubmissionsOnRandomWalks walks the gateway's two calls among every
// other call of the diagram (the random walks of TestInvariantsOnRandomWalks),
// with current, stale and never-issued tokens, lapsed holders, racing
// submissions, lost answers, late answers, lookups and deadlines passing,
// and holds each step to what the gateway promises:
//
//   - a FORWARD never starts while another submission of the operation is
//     in flight before its deadline, nor after one whose effect may have
//     happened (recorded, or unknown with no absence confirmed since);
//   - a recorded answer never changes, and a REPLAY answers it;
//   - a superseded token changes no submission;
//   - only a live holder of the current token starts one.
func TestSubmissionsOnRandomWalks(t *testing.T) {
	const walks, steps = 400, 400
	forwards, replays := 0, 0
	over := map[string]bool{} // what fresh forwards followed: none, REFUSED, ABSENT, UNKNOWN
	for seed := range uint64(walks) {
		w := newWorld(seed + 1000)
		ids := 0
		for i := range steps {
			name, decide := w.step()
			if w.rnd.IntN(2) == 0 {
				name, decide = w.submissionStep(&ids)
			}
			if decide == nil {
				continue
			}
			where := fmt.Sprintf("walk %d step %d %s", seed, i, name)
			v := w.view(false)
			before := v.Rec
			if before != nil {
				before = before.Clone()
			}
			d := decide(v)
			if d.NeedSession != "" {
				t.Fatalf("%s: asked for session %q of a view that read every session", where, d.NeedSession)
			}
			checkDecision(t, where, w, before, d)
			if after := checkSubmission(t, where, w, before, d); after != "" {
				over[after] = true
			}
			if d.Answer.Verdict == intent.VerdictForward && !d.Answer.Replayed && d.Err == nil {
				forwards++
			}
			if d.Answer.Verdict == intent.VerdictReplay {
				replays++
			}
			if d.Writes() && w.guarded(t, where, d, false) {
				w.apply(d)
			}
			checkWorld(t, where, w, before)
		}
	}
	t.Logf("%d forwards (after %v), %d replays", forwards, over, replays)
	if forwards < walks/4 || replays < walks/4 || len(over) != 4 {
		t.Errorf("%d forwards (after %v) and %d replays in %d walks: the walks do not reach the gateway's paths", forwards, over, replays, walks)
	}
}

// submissionStep is a random call of the gateway: a BeginSubmission (a
// lookup, sometimes), the RecordSubmission of the operation's submission
// with a random outcome, or time passing beyond a deadline.
func (w *world) submissionStep(ids *int) (string, func(*machine.View) machine.Decision) {
	var sub *intent.Submission
	if w.rec != nil {
		for i := range w.rec.Submissions {
			if w.rec.Submissions[i].Operation == op {
				sub = &w.rec.Submissions[i]
			}
		}
	}
	switch n := w.rnd.IntN(10); {
	case w.rec != nil && w.rec.State == intent.StatePending && sub != nil && n < 5:
		// Executed again after a confirmed absence, by a live worker: the
		// path on which a lost submission may be sent anew.
		c := acquireBy(fmt.Sprintf("again-%d", *ids), nil)
		id := w.open()
		c.Session = machine.Session{ID: id, Rev: w.sessions[id], Worker: "w-" + id}
		c.Req.SessionID = id
		return "Acquire", func(v *machine.View) machine.Decision { return rules.Acquire(v, c, w.now) }
	case n < 4:
		*ids++
		c := begin(w.token(), fmt.Sprintf("sub-%d", *ids), w.rnd.IntN(4) == 0, w.rnd.IntN(2) == 0)
		if sub != nil && w.rnd.IntN(5) == 0 {
			c.Start.ID, c.Start.Token = sub.ID, sub.Token // a read-back of its own
		}
		return "BeginSubmission", func(v *machine.View) machine.Decision { return rules.BeginSubmission(v, c, w.now) }
	case n < 8 && sub != nil:
		outcomes := []intent.SubmissionOutcome{intent.OutcomeAnswered, intent.OutcomeRefusedUpstream, intent.OutcomeLost, intent.OutcomeNotSent, intent.OutcomeFound, intent.OutcomeNotFound}
		o := outcomes[w.rnd.IntN(len(outcomes))]
		tk := sub.Token
		if o == intent.OutcomeFound || o == intent.OutcomeNotFound || w.rnd.IntN(6) == 0 {
			tk = w.token()
		}
		c := end(tk, sub.ID, o)
		c.End.Response = &intent.UpstreamResponse{Status: 201, Body: []byte(fmt.Sprintf(`{"n":%d}`, w.rnd.IntN(1000))), BodyBytes: 9}
		if o == intent.OutcomeLost || o == intent.OutcomeNotSent || o == intent.OutcomeNotFound {
			c.End.Response = nil
		}
		return "RecordSubmission", func(v *machine.View) machine.Decision { return rules.RecordSubmission(v, c, w.now) }
	default:
		w.now = w.now.Add(time.Duration(w.rnd.IntN(3)) * 20 * time.Second) // deadlines are 30s
		return "", nil
	}
}

// checkSubmission holds one decision of any call, made from a view whose
// record was prev, to the gateway's promises. For a fresh FORWARD it
// returns what the operation's submission was before ("none", or its
// state).
func checkSubmission(t *testing.T, where string, w *world, prev *machine.Record, d machine.Decision) string {
	t.Helper()
	was := func(r *machine.Record) *intent.Submission {
		if r == nil {
			return nil
		}
		for i := range r.Submissions {
			if r.Submissions[i].Operation == op {
				return &r.Submissions[i]
			}
		}
		return nil
	}
	old, next := was(prev), was(d.Next)
	if errors.Is(d.Err, intent.ErrStaleToken) && d.Next != nil && !sameSubmissions(prev, d.Next) {
		t.Fatalf("%s: a stale call changed the submissions", where)
	}
	if old != nil && old.State == intent.SubmissionRecorded && d.Next != nil {
		if next == nil || next.ID != old.ID || next.State != intent.SubmissionRecorded || !bytes.Equal(next.Response.Body, old.Response.Body) {
			t.Fatalf("%s: a recorded answer changed: %+v → %+v", where, old, next)
		}
	}
	if d.Answer.Verdict == intent.VerdictReplay && (old == nil || old.State != intent.SubmissionRecorded || !bytes.Equal(d.Answer.Submission.Response.Body, old.Response.Body)) {
		t.Fatalf("%s: a replay of %+v, the record holding %+v", where, d.Answer.Submission, old)
	}
	if d.Answer.Verdict != intent.VerdictForward || d.Answer.Replayed || d.Err != nil {
		return ""
	}
	// A fresh FORWARD.
	if prev.State != intent.StateInProgress || w.sessions[prev.Lease.SessionID] != prev.Lease.SessionRev || next.Token != prev.CurrentToken() {
		t.Fatalf("%s: a forward on a %v intent, holder alive %t, under %v (current %v)", where, prev.State, w.sessions[prev.Lease.SessionID] == prev.Lease.SessionRev, next.Token, prev.CurrentToken())
	}
	if old == nil {
		return "none"
	}
	switch old.State {
	case intent.SubmissionRefused, intent.SubmissionAbsent:
	case intent.SubmissionUnknown:
		if !confirmedSince(prev, old.ID) {
			t.Fatalf("%s: forwarded after submission %s was lost, with no absence confirmed since", where, old.ID)
		}
	default:
		t.Fatalf("%s: forwarded over a submission %v", where, old.State)
	}
	return old.State.String()
}

// confirmedSince reports whether an accepted Release or reviewer's PENDING
// follows the loss of submission id in rec's history.
func confirmedSince(rec *machine.Record, id string) bool {
	lost := -1
	for i, e := range rec.History {
		if e.Kind == intent.EventSubmissionUnknown && e.RequestID == id {
			lost = i
		}
	}
	for i := lost + 1; lost >= 0 && i < len(rec.History); i++ {
		if e := rec.History[i]; e.Accepted && (e.Kind == intent.EventReleased || (e.Kind == intent.EventResolved && e.ResolvedState == intent.StatePending)) {
			return true
		}
	}
	return false
}

func sameSubmissions(a, b *machine.Record) bool {
	if len(a.Submissions) != len(b.Submissions) {
		return false
	}
	for i := range a.Submissions {
		x, y := a.Submissions[i], b.Submissions[i]
		if x.ID != y.ID || x.State != y.State || x.Token != y.Token {
			return false
		}
	}
	return true
}
