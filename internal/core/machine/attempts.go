package machine

import (
	"fmt"
	"time"

	"github.com/intentd/intentd/intent"
)

// A poison intent is one whose workers keep dying on it: each Acquire after
// a lapse is rightly RECONCILE under a higher token, and without a limit the
// intent would be handed out for ever with nobody told. So the machine counts,
// per intent, the attempts that ended without a report of their outcome,
// and past the intent's limit hands it to a human instead.
//
// What counts as an attempt that ended without a report:
//
//   - a lease that lapsed (the holder's session ended, closed or expired,
//     before Complete, Fail, Release or Escalate), whether the janitor's
//     sweep or the next Acquire noticed it;
//   - an accepted MarkUnknown: the worker says it cannot tell.
//
// Each lease counts at most once: a lapse the janitor noted and the late
// MarkUnknown of the same lease are one attempt. What does not count: a
// Release (a confirmed absence is a report; it neither counts nor resets
// the count, so an intent that crashes every worker that executes it still
// reaches the limit through reconcile → Release → execute → lapse), a
// Complete or Fail (final), an Escalate, a reviewer's decision. The count
// lives in the record, so it survives restarts and is the same on every
// replica; a reviewer's Resolve to PENDING sets it back to 0.

// attemptsPrincipal is who the history names for the store's own move of a
// poison intent to NEEDS_REVIEW.
const attemptsPrincipal = "intentd"

// endAttempt is the rule, in one place for every path that sees an attempt
// end (janitor sweep, Acquire after a lapse, MarkUnknown): it counts in
// next that the attempt under next's current lease ended without a report
// (how says in what way, for the reason text), and once the count reaches
// the intent's limit (its MaxAttempts; defaultMax for a record stored
// before records had one) moves next to NEEDS_REVIEW with an escalation
// entry a reviewer can read, and returns true. next is the version being
// written, already in the state the attempt's end left it in (UNKNOWN). It
// is pure: no etcd, no clock but now.
func endAttempt(next *Record, defaultMax int, how string, now time.Time) (exhausted bool) {
	token := next.CurrentToken()
	if token != 0 && token == next.EndedToken {
		return false // this lease's end was counted already
	}
	next.Attempts++
	next.EndedToken = token
	limit := AttemptLimit(next, defaultMax)
	if next.Attempts < limit {
		return false
	}
	next.State, next.UpdatedAt = intent.StateNeedsReview, now
	next.appendEvent(intent.Event{
		Time: now, Kind: intent.EventEscalated, Token: token, Accepted: true, Principal: attemptsPrincipal,
		Reason: fmt.Sprintf("%d attempts ended without a report (the last %s under token %d); max_attempts is %d: find out whether the effect happened, then resolve",
			next.Attempts, how, token, limit),
	})
	return true
}

// AttemptLimit is rec's limit: its own, or defaultMax for a record stored
// before records had one.
func AttemptLimit(rec *Record, defaultMax int) int {
	if rec.MaxAttempts > 0 {
		return rec.MaxAttempts
	}
	return defaultMax
}

// How an attempt ended, for endAttempt's reason text.
const (
	endedLapsed        = "when its lease lapsed"
	endedMarkedUnknown = "marked unknown"
)
