package machine

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/intentd/intentd/intent"
)

// The fencing gateway's two decisions (DESIGN.md, "The fencing gateway").
// A worker's side-effecting HTTP call reaches an upstream only through
// BeginSubmission's Forward, which is the check of the worker's token and
// the record that the submission started, in one write: the record's
// revision guards it, so no other lease, report or submission can come in
// between. The record keeps each operation's latest submission; what
// RecordSubmission learns of it (the answer, its loss, a lookup's finding)
// is kept there before the gateway answers the worker.
//
// What an operation's latest submission means for the next one, under the
// intent's current token:
//
//   - none, or one that did nothing upstream (refused by the upstream in
//     so many words, never sent, or found absent by a lookup): Forward, a
//     new submission;
//   - Recorded: Replay its answer, whatever the intent's state; nothing is
//     sent again;
//   - InFlight: Busy until its deadline, after which nobody will record it:
//     it is unknown from then on (see lose);
//   - Unknown: nothing is sent (Unknown), but a Lookup may ask the
//     upstream; once the absence was confirmed after it (a reconciler's
//     Release, a reviewer's PENDING) it is as good as absent.
//
// A superseded token is refused STALE_TOKEN and kept as evidence (fence),
// before any of this: a stale worker learns nothing of the operation.

// gatewayPrincipal is who the history names for what the gateway's
// records decide on their own (a move to NEEDS_REVIEW).
const gatewayPrincipal = "intentd-gateway"

// BeginCall is a BeginSubmission. Principal is the worker the gateway
// calls for.
type BeginCall struct {
	Start     *intent.SubmissionStart
	Principal string
}

// BeginSubmission decides whether the gateway may send a request of an
// operation upstream under the caller's token (see the rules above). A
// Forward writes the new in-flight submission, guarded by the record's
// revision and the holder's session being alive: only a live lease starts
// an effect. A retried BeginSubmission of the same id is answered as it
// was (Replayed).
func (r Rules) BeginSubmission(v *View, c BeginCall, now time.Time) Decision {
	st := c.Start
	if v.Rec == nil {
		return refuse(v.Missing())
	}
	rec := v.Rec
	at, sub := rec.submission(st.Operation)
	ev := intent.Event{Time: now, Kind: intent.EventSubmissionStarted, Token: st.Token, Principal: c.Principal,
		RequestID: st.ID, Reason: sentText(st.ID, st.Operation, &st.Request)}
	if sub != nil && sub.ID == st.ID && sub.Token == st.Token && !st.Lookup && sub.State == intent.SubmissionInFlight && now.Before(sub.Deadline) {
		// This very submission, begun already: the store's read-back
		// after an ambiguous commit, or a retry. Its check was made when
		// it was written; a newer token issued since changes nothing.
		if id := v.HolderUnread(); id != "" {
			return Decision{NeedSession: id}
		}
		d := verdict(v, intent.VerdictForward, sub)
		d.Answer.Replayed = true
		return d
	}
	if d, ok := fence(v, st.Token, "token", ev); !ok {
		return d
	}
	if id := v.HolderUnread(); id != "" {
		return Decision{NeedSession: id}
	}
	if sub != nil {
		switch {
		case sub.State == intent.SubmissionRecorded:
			return verdict(v, intent.VerdictReplay, sub)
		case sub.State == intent.SubmissionInFlight && !now.Before(sub.Deadline):
			next := rec.Clone()
			d := r.lose(v, next, at, fmt.Sprintf("no answer was recorded by its deadline %s: the gateway that sent it stopped or lost touch", sub.Deadline.Format(time.RFC3339Nano)), now)
			d.Answer.Verdict = intent.VerdictUnknown
			return d
		case sub.State == intent.SubmissionInFlight:
			return verdict(v, intent.VerdictBusy, sub)
		case sub.State == intent.SubmissionUnknown && !absenceConfirmed(rec, sub):
			if !st.Lookup {
				return verdict(v, intent.VerdictUnknown, sub)
			}
			if d, ok := holding(v, "BeginSubmission"); !ok {
				return d
			}
			return verdict(v, intent.VerdictLookup, sub)
		}
	}
	if st.Lookup {
		return refuse(&intent.TransitionError{Key: st.Key, State: rec.State, Call: "a lookup of operation " + st.Operation + ", which nothing left in doubt,", Intent: v.shown()})
	}
	if d, ok := holding(v, "BeginSubmission"); !ok {
		if rec.State == intent.StateNeedsReview {
			// Kept as evidence, like a report on an intent that waits
			// for review.
			e := evidence(v, ev)
			e.Err = &intent.TransitionError{Key: st.Key, State: rec.State, Call: "BeginSubmission", Intent: v.shown(), Evidence: true}
			return e
		}
		return d
	}
	if sub == nil && len(rec.Submissions) >= intent.MaxSubmissions {
		return refuse(intent.Invalid("operation", "intent %q has submitted %d operations through the gateway, the most one intent may", st.Key, len(rec.Submissions)))
	}
	s := intent.Submission{
		Operation: st.Operation, ID: st.ID, Token: st.Token, State: intent.SubmissionInFlight,
		Request: st.Request, HasLookup: st.HasLookup, StartedAt: now, Deadline: now.Add(st.Timeout),
	}
	next := rec.Clone()
	next.putSubmission(at, s)
	ev.Accepted = true
	ev.SessionID, ev.Worker = rec.Lease.SessionID, rec.Lease.Worker
	next.appendEvent(ev)
	next.UpdatedAt = now
	d := v.write(next, Guard{Kind: SessionAlive, Session: rec.Lease.SessionID, Rev: rec.Lease.SessionRev})
	d.Answer.Show = ShowNextHeld
	d.Answer.Verdict = intent.VerdictForward
	d.Answer.Submission = &next.Submissions[slices.IndexFunc(next.Submissions, func(x intent.Submission) bool { return x.Operation == st.Operation })]
	return d
}

// holding is whether the caller, holding the current token, holds a live
// lease on an intent IN_PROGRESS: what starting an effect, or asking the
// upstream about one, needs. The view must have read the holder. When ok
// is false, d is the refusal.
func holding(v *View, call string) (d Decision, ok bool) {
	rec := v.Rec
	switch {
	case rec.State == intent.StateInProgress && v.HolderAlive():
		return Decision{}, true
	case rec.State == intent.StateInProgress:
		return refuse(&intent.TransitionError{Key: rec.Key, State: intent.StateUnknown, Call: call + " after the lease lapsed", Intent: v.shown()}), false
	}
	return refuse(&intent.TransitionError{Key: rec.Key, State: rec.State, Call: call, Intent: v.shown()}), false
}

// verdict is the decision to write nothing and tell the gateway what to do
// about sub.
func verdict(v *View, what intent.SubmissionVerdict, sub *intent.Submission) Decision {
	d := answer(v.shown())
	s := *sub
	d.Answer.Verdict, d.Answer.Submission = what, &s
	return d
}

// RecordCall is a RecordSubmission. Principal is the worker the gateway
// calls for.
type RecordCall struct {
	End       *intent.SubmissionEnd
	Principal string
}

// RecordSubmission keeps what the gateway learned of submission End.ID:
//
//   - the forward's own outcomes (Answered, RefusedUpstream, Lost,
//     NotSent) under the token the submission was begun under, whatever
//     happened to the lease since: what the upstream did is the truth the
//     record must hold. An answer that arrives after the submission was
//     given up as unknown is still kept (Recorded), the intent's state
//     left as it is; a lost answer is the submission's loss (see lose);
//   - a lookup's outcomes (Found, NotFound) under the caller's token,
//     fenced like a report: only the current lease settles a doubt.
//
// An outcome recorded already is answered again (Replayed); one that
// contradicts what is recorded changes nothing. An outcome of a
// submission the record no longer keeps (another submission of the
// operation replaced it) is refused and kept as evidence: it may tell a
// reviewer that an effect happened.
func (r Rules) RecordSubmission(v *View, c RecordCall, now time.Time) Decision {
	e := c.End
	if v.Rec == nil {
		return refuse(v.Missing())
	}
	rec := v.Rec
	at, sub := rec.submission(e.Operation)
	ev := intent.Event{Time: now, Kind: intent.EventSubmissionRecorded, Token: e.Token, Principal: c.Principal,
		RequestID: e.ID, Reason: answerText(e)}
	lookup := e.Outcome == intent.OutcomeFound || e.Outcome == intent.OutcomeNotFound
	if lookup {
		if d, ok := fence(v, e.Token, "token", ev); !ok {
			return d
		}
		if id := v.HolderUnread(); id != "" {
			return Decision{NeedSession: id}
		}
	}
	if sub == nil || sub.ID != e.ID {
		if slices.ContainsFunc(rec.History, func(h intent.Event) bool {
			return h.Kind == intent.EventSubmissionStarted && h.Accepted && h.RequestID == e.ID
		}) && !rec.hasEventWithID(intent.EventSubmissionRecorded, e.ID) {
			// A late outcome of a submission another one replaced:
			// evidence.
			d := evidence(v, ev)
			d.Err = intent.Invalid("submission_id", "submission %q of operation %q was replaced by a later one; its outcome is kept as evidence", e.ID, e.Operation)
			return d
		}
		return refuse(intent.Invalid("submission_id", "intent %q keeps no submission %q of operation %q", e.Key, e.ID, e.Operation))
	}
	if !lookup && sub.Token != e.Token {
		return refuse(intent.Invalid("token", "submission %q was begun under token %s, not %s", e.ID, sub.Token, e.Token))
	}
	next := rec.Clone()
	s := *sub
	s.EndedAt = now
	switch e.Outcome {
	case intent.OutcomeAnswered, intent.OutcomeRefusedUpstream:
		if sub.State != intent.SubmissionInFlight && sub.State != intent.SubmissionUnknown {
			return recorded(v, sub)
		}
		if sub.State == intent.SubmissionUnknown {
			ev.Reason += " (after it was given up as unknown)"
		}
		s.State, s.Response, s.Error = intent.SubmissionRecorded, e.Response, ""
		if e.Outcome == intent.OutcomeRefusedUpstream {
			s.State = intent.SubmissionRefused
		}
	case intent.OutcomeNotSent:
		if sub.State != intent.SubmissionInFlight {
			return recorded(v, sub)
		}
		s.State, s.Error = intent.SubmissionAbsent, e.Error
	case intent.OutcomeLost:
		if sub.State != intent.SubmissionInFlight {
			return recorded(v, sub)
		}
		d := r.lose(v, next, at, e.Error, now)
		d.Answer.Verdict = intent.VerdictUnknown
		return d
	case intent.OutcomeFound, intent.OutcomeNotFound:
		if sub.State != intent.SubmissionUnknown {
			return recorded(v, sub)
		}
		if d, ok := holding(v, "RecordSubmission (lookup)"); !ok {
			return d
		}
		if e.Outcome == intent.OutcomeFound {
			s.State, s.Response, s.LookedUp = intent.SubmissionRecorded, e.Response, true
		} else {
			s.State, s.Error = intent.SubmissionAbsent, e.Error
		}
	default:
		return refuse(intent.Invalid("outcome", "%v is no outcome", e.Outcome))
	}
	next.putSubmission(at, s)
	ev.Accepted = true
	next.appendEvent(ev)
	next.UpdatedAt = now
	d := v.write(next)
	d.Answer.Submission = &next.Submissions[at]
	return d
}

// recorded answers a RecordSubmission whose submission already has its
// outcome: nothing changes.
func recorded(v *View, sub *intent.Submission) Decision {
	s := *sub
	return Decision{Answer: Answer{Submission: &s, Replayed: true}}
}

// lose decides, in next (a clone of v's record), that the submission at
// index at lost its answer after the request may have reached the
// upstream, for the reason why: it is Unknown, never sent again by
// anyone, and the history keeps what was sent, when, and what came back
// instead. If the intent is still undecided:
//
//   - with no lookup at the upstream, nobody but a person can tell whether
//     the effect happened: the intent goes to NEEDS_REVIEW with that
//     evidence (the articles' rule);
//   - with one, the lease the submission was sent under ends as with
//     MarkUnknown (counted against the attempts limit, see endAttempt):
//     the intent is UNKNOWN, and the next Acquire reconciles through the
//     lookup. A newer lease, if one was issued meanwhile, is left alone:
//     its holder learns of the doubt from its own BeginSubmission.
func (r Rules) lose(v *View, next *Record, at int, why string, now time.Time) Decision {
	s := next.Submissions[at]
	s.State, s.EndedAt, s.Error = intent.SubmissionUnknown, now, why
	next.Submissions[at] = s
	evidence := lostText(&s)
	next.appendEvent(intent.Event{Time: now, Kind: intent.EventSubmissionUnknown, Token: s.Token, Accepted: true,
		Principal: gatewayPrincipal, RequestID: s.ID, Reason: evidence})
	next.UpdatedAt = now
	var d Decision
	switch {
	case next.State.Final() || next.State == intent.StateNeedsReview:
		d = v.write(next)
	case !s.HasLookup:
		next.State = intent.StateNeedsReview
		next.appendEvent(intent.Event{Time: now, Kind: intent.EventEscalated, Token: next.CurrentToken(), Accepted: true, Principal: gatewayPrincipal,
			Reason: clip(evidence+"; the upstream offers no lookup: find out whether the effect happened, then resolve", maxReasonText)})
		d = v.write(next)
	case next.State == intent.StateInProgress && next.CurrentToken() == s.Token:
		next.State = intent.StateUnknown
		d = v.write(next)
		d.Ended, d.Exhausted = EndedMarkedUnknown, endAttempt(next, r.MaxAttempts, "lost its gateway answer", now)
	default:
		d = v.write(next)
	}
	d.Answer.Show = ShowNext
	d.Answer.Submission = &next.Submissions[at]
	return d
}

// absenceConfirmed reports whether, after sub was given up as unknown, the
// effect's absence was confirmed: a reconciler's accepted Release, or a
// reviewer's decision of PENDING. Only those make an intent PENDING again
// (DESIGN.md, "States"), so a later execution may submit the operation
// anew. The history is read from its end back to sub's loss; a history
// that no longer holds the loss confirms nothing.
func absenceConfirmed(rec *Record, sub *intent.Submission) bool {
	confirmed := false
	for i := len(rec.History) - 1; i >= 0; i-- {
		e := rec.History[i]
		switch {
		case e.Kind == intent.EventSubmissionUnknown && e.RequestID == sub.ID:
			return confirmed
		case e.Accepted && (e.Kind == intent.EventReleased || (e.Kind == intent.EventResolved && e.ResolvedState == intent.StatePending)):
			confirmed = true
		}
	}
	return false
}

// submission is the index and the latest submission of operation op, or
// the index a new one goes to and nil.
func (r *Record) submission(op string) (int, *intent.Submission) {
	for i := range r.Submissions {
		if r.Submissions[i].Operation == op {
			return i, &r.Submissions[i]
		}
	}
	return len(r.Submissions), nil
}

// putSubmission stores s at index at (appending when at is past the end).
// r must be a clone: the slice is its own.
func (r *Record) putSubmission(at int, s intent.Submission) {
	if at == len(r.Submissions) {
		r.Submissions = append(r.Submissions, s)
		return
	}
	r.Submissions[at] = s
}

// hasEventWithID reports whether the history holds an accepted entry of
// kind with request id id.
func (r *Record) hasEventWithID(kind intent.EventKind, id string) bool {
	return slices.ContainsFunc(r.History, func(e intent.Event) bool {
		return e.Kind == kind && e.Accepted && e.RequestID == id
	})
}

// maxReasonText bounds the history text a submission's entries carry, the
// limit a reason has in a request.
const maxReasonText = 1024

// sentText is what a history entry says was sent: the submission, its
// operation, the request line, and the body's size and digest.
func sentText(id, op string, q *intent.SubmittedRequest) string {
	return clip(fmt.Sprintf("submission %q of operation %s: %s %s to upstream %q, body %d bytes (sha256 %s)",
		clip(id, 128), op, q.Method, clip(q.Target, 256), q.Upstream, q.BodyBytes, q.BodySHA256), maxReasonText)
}

// answerText is what a history entry says came back.
func answerText(e *intent.SubmissionEnd) string {
	var b strings.Builder
	fmt.Fprintf(&b, "submission %q of operation %s: %s", clip(e.ID, 128), e.Operation, strings.ToLower(e.Outcome.String()))
	if e.Response != nil {
		fmt.Fprintf(&b, ", status %d, body %d bytes", e.Response.Status, e.Response.BodyBytes)
	}
	if e.Error != "" {
		fmt.Fprintf(&b, ": %s", e.Error)
	}
	return clip(b.String(), maxReasonText)
}

// lostText is the evidence a lost submission leaves for a reviewer: what
// was sent, when, under which token, and what came back instead.
func lostText(s *intent.Submission) string {
	return clip(fmt.Sprintf("%s; sent at %s under token %s; no answer: %s",
		sentText(s.ID, s.Operation, &s.Request), s.StartedAt.UTC().Format(time.RFC3339Nano), s.Token, s.Error), maxReasonText)
}

// clip cuts s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
