package machine

import (
	"fmt"
	"slices"
	"time"

	"github.com/intentd/intentd/intent"
)

// EscalateCall is an Escalate, by a worker (under its token) or a reviewer
// (zero token). Principal is who the history names.
type EscalateCall struct {
	Escalation *intent.Escalation
	Principal  string
}

// Escalate decides a move to NEEDS_REVIEW. Under a worker's token it is
// fenced like a report (see fence). A reviewer may escalate a PENDING or
// UNKNOWN intent, or one whose holder lapsed (guarded by the holder still
// being gone); an intent under a live lease needs Force, and then the
// lease's token is superseded. Escalating an intent that already waits for
// review changes nothing; a final intent is refused.
func (r Rules) Escalate(v *View, c EscalateCall, now time.Time) Decision {
	e := c.Escalation
	if v.Rec == nil {
		return refuse(v.Missing())
	}
	rec := v.Rec
	ev := intent.Event{Time: now, Kind: intent.EventEscalated, Token: e.Token, Reason: e.Reason, Principal: c.Principal}
	if e.Token != 0 {
		if d, ok := fence(v, e.Token, "token", ev); !ok {
			return d
		}
	}
	live, guards := undecided(v)
	switch {
	case rec.State == intent.StateNeedsReview:
		return answer(rec.ToIntent(v.Rev, HolderGone))
	case rec.State.Final():
		return refuse(&intent.TransitionError{Key: e.Key, State: rec.State, Call: "Escalate", Intent: rec.ToIntent(v.Rev, HolderGone)})
	case e.Token != 0 && rec.State != intent.StateInProgress && rec.State != intent.StateUnknown:
		return refuse(&intent.TransitionError{Key: e.Key, State: rec.State, Call: "Escalate", Intent: rec.ToIntent(v.Rev, HolderGone)})
	case e.Token == 0 && live && !e.Force:
		return refuse(leaseHeld(rec))
	}
	next := rec.Clone()
	if e.Token == 0 {
		ev.Token = rec.CurrentToken()
		if live {
			next.supersede(e.Actor, now)
			ev.Token, ev.Issued = 0, true
		}
	}
	ev.Accepted = true
	next.appendEvent(ev)
	next.State, next.UpdatedAt = intent.StateNeedsReview, now
	d := v.write(next, guards...)
	d.Answer.Show = ShowNext
	return d
}

// ResolveCall is a reviewer's Resolve. Principal is who the history names.
type ResolveCall struct {
	Resolution *intent.Resolution
	Principal  string
}

// Resolve decides a reviewer's decision on a NEEDS_REVIEW or UNKNOWN
// intent (or one whose holder lapsed; one under a live lease needs Force).
// Every decision issues a new token, so reports under any earlier lease
// are stale from then on; a decision of PENDING starts a fresh attempts
// count. A retry with the same RequestID answers the intent as it is now,
// without deciding again (Replayed), whatever happened since.
//
// With ExpectedToken, the decision holds only while that is still the
// intent's current token: the reviewer decided on what they saw, and if
// another decision or a new lease came in between, the decision is refused
// as stale (a *intent.StaleTokenError naming the current token). Unlike a
// worker's report (see fence) the reviewer held no lease, so nothing is
// kept as evidence, and any other token is as stale as an older one.
func (r Rules) Resolve(v *View, c ResolveCall, now time.Time) Decision {
	res := c.Resolution
	if v.Rec == nil {
		return refuse(v.Missing())
	}
	rec := v.Rec
	if i := slices.IndexFunc(rec.History, func(e intent.Event) bool {
		return e.Kind == intent.EventResolved && res.RequestID != "" && e.RequestID == res.RequestID
	}); i >= 0 {
		// A retry (or the store's read-back after an ambiguous commit):
		// never decide twice, whatever happened since.
		if e := rec.History[i]; e.ResolvedState != res.Decision || e.Principal != c.Principal {
			return refuse(intent.Invalid("request_id", "%q was used for another decision", res.RequestID))
		}
		d := answer(v.shown())
		d.Answer.Replayed = true
		return d
	}
	live, guards := undecided(v)
	switch {
	case res.ExpectedToken != 0 && res.ExpectedToken != rec.CurrentToken():
		return refuse(stale(v, res.ExpectedToken))
	case live && !res.Force:
		return refuse(leaseHeld(rec))
	case rec.State != intent.StateNeedsReview && rec.State != intent.StateUnknown && rec.State != intent.StateInProgress:
		return refuse(&intent.TransitionError{Key: res.Key, State: rec.State, Call: "Resolve", Intent: rec.ToIntent(v.Rev, HolderGone)})
	}
	next := rec.Clone()
	next.supersede(res.Actor, now)
	ev := intent.Event{
		Time: now, Kind: intent.EventResolved, Accepted: true, Issued: true,
		Principal: c.Principal, Reason: res.Reason, ResolvedState: res.Decision, Failure: res.Failure,
		RequestID: res.RequestID, Channel: res.Channel,
	}
	ev.Result, ev.PayloadSHA256 = digest(res.Result)
	next.appendEvent(ev)
	next.State = res.Decision
	switch res.Decision {
	case intent.StatePending:
		// Confirmed absent by a human: the next attempts start a fresh
		// count (see endAttempt).
		next.Attempts = 0
	case intent.StateCompleted:
		next.Result = res.Result
	case intent.StateFailed:
		next.Failure = res.Failure
	}
	if next.State.Final() {
		next.finalize(now)
	}
	d := v.write(next, guards...)
	d.Answer.Show = ShowNext
	return d
}

// CancelCall is an approver's Cancel. Principal is who the history names.
type CancelCall struct {
	Cancellation *intent.Cancellation
	Principal    string
}

// Cancel decides the withdrawal of a PENDING intent: CANCELLED is final.
// Cancelling a cancelled intent again changes nothing; any other state is
// refused.
func (r Rules) Cancel(v *View, c CancelCall, now time.Time) Decision {
	cn := c.Cancellation
	if v.Rec == nil {
		return refuse(v.Missing())
	}
	rec := v.Rec
	switch rec.State {
	case intent.StateCancelled:
		return answer(rec.ToIntent(v.Rev, HolderGone))
	case intent.StatePending:
	default:
		return refuse(&intent.TransitionError{Key: cn.Key, State: rec.State, Call: "Cancel", Intent: v.shown()})
	}
	next := rec.Clone()
	next.appendEvent(intent.Event{Time: now, Kind: intent.EventCancelled, Token: rec.CurrentToken(), Accepted: true, Principal: c.Principal, Reason: cn.Reason})
	next.State, next.UpdatedAt = intent.StateCancelled, now
	next.finalize(now)
	d := v.write(next)
	d.Answer.Show = ShowNext
	return d
}

// undecided is how a reviewer's call sees an intent's lease: whether the
// intent is held by a live worker, and if its holder lapsed, the guard
// that keeps it lapsed until the write.
func undecided(v *View) (live bool, guards []Guard) {
	if v.Rec.State != intent.StateInProgress {
		return false, nil
	}
	if v.HolderAlive() {
		return true, nil
	}
	return false, []Guard{holderGone(v.Rec.Lease)}
}

func leaseHeld(rec *Record) error {
	return fmt.Errorf("%w: %q is held by worker %q; pass force to supersede its lease", intent.ErrLeaseHeld, rec.Key, rec.Lease.Worker)
}
