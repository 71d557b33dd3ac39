package machine

import (
	"fmt"
	"time"

	"github.com/intentd/intentd/intent"
)

// ReportCall is a fenced report (Complete, MarkUnknown, Release, Fail).
// Report.Children, if any, are valid registrations of the report's tenant
// with ParentKey set to its key.
type ReportCall struct {
	Report    *intent.Report
	Principal string
}

// Report decides a fenced report. It is accepted only under the intent's
// current token (see fence), while the intent is IN_PROGRESS or UNKNOWN: a
// report after the holder's session lapsed, with no newer token issued, is
// the best evidence there is. Under the current token of an intent that
// waits for review it is kept as evidence and refused. A retried report
// that was already applied answers Replayed; Complete retried with another
// result is intent.ErrResultMismatch.
//
// Complete ends in COMPLETED with the result and registers its children in
// the same write (the outbox); Fail ends in FAILED; MarkUnknown in UNKNOWN,
// counting against the attempts limit (see endAttempt); Release, a
// confirmed absence, in PENDING.
func (r Rules) Report(v *View, c ReportCall, now time.Time) Decision {
	rep := c.Report
	if v.Rec == nil {
		return refuse(v.Missing())
	}
	rec := v.Rec
	kind := reportEvent(rep.Kind)
	if rec.hasEvent(kind, rep.Token, true) {
		// Already applied: a retry, or the store's read-back after an
		// ambiguous commit.
		if rep.Kind == intent.ReportComplete && !sameResult(rec.Result, rep.Result) {
			return refuse(fmt.Errorf("%w: %q was completed under token %s with another result", intent.ErrResultMismatch, rep.Key, rep.Token))
		}
		if id := v.HolderUnread(); id != "" {
			return Decision{NeedSession: id} // held again by someone: show whether alive
		}
		d := answer(v.shown())
		d.Answer.Replayed = true
		return d
	}
	ev := intent.Event{Time: now, Kind: kind, Token: rep.Token, Failure: rep.Failure, Reason: rep.Reason, Principal: c.Principal}
	ev.Result, ev.PayloadSHA256 = digest(rep.Result)
	if d, ok := fence(v, rep.Token, "token", ev); !ok {
		return d
	}
	switch {
	case rec.State == intent.StateNeedsReview:
		d := evidence(v, ev)
		d.Err = &intent.TransitionError{Key: rep.Key, State: rec.State, Call: rep.Kind.String(), Intent: rec.ToIntent(v.Rev, HolderGone), Evidence: true}
		return d
	case rec.State == intent.StateCompleted && rep.Kind == intent.ReportComplete:
		return refuse(fmt.Errorf("%w: %q is already completed", intent.ErrResultMismatch, rep.Key))
	case rec.State != intent.StateInProgress && rec.State != intent.StateUnknown:
		return refuse(&intent.TransitionError{Key: rep.Key, State: rec.State, Call: rep.Kind.String(), Intent: rec.ToIntent(v.Rev, HolderGone)})
	}
	next := rec.Clone()
	ev.Accepted = true
	ev.SessionID, ev.Worker = rec.Lease.SessionID, rec.Lease.Worker
	next.appendEvent(ev)
	next.UpdatedAt = now
	var d Decision
	switch rep.Kind {
	case intent.ReportComplete:
		next.State, next.Result = intent.StateCompleted, rep.Result
		next.finalize(now)
		guards, created, err := r.outbox(v, next, rep.Children, c.Principal, now)
		if err != nil {
			return refuse(err)
		}
		d = v.write(next, guards...)
		d.Create = created
	case intent.ReportFail:
		next.State, next.Failure = intent.StateFailed, rep.Failure
		next.finalize(now)
		d = v.write(next)
	case intent.ReportMarkUnknown:
		next.State = intent.StateUnknown
		d = v.write(next)
		d.Ended, d.Exhausted = EndedMarkedUnknown, endAttempt(next, r.MaxAttempts, endedMarkedUnknown, now)
	case intent.ReportRelease:
		next.State = intent.StatePending
		d = v.write(next)
	}
	d.Answer.Show = ShowNext
	return d
}

func reportEvent(k intent.ReportKind) intent.EventKind {
	switch k {
	case intent.ReportComplete:
		return intent.EventCompleted
	case intent.ReportMarkUnknown:
		return intent.EventMarkedUnknown
	case intent.ReportRelease:
		return intent.EventReleased
	default:
		return intent.EventFailed
	}
}

// outbox registers a completing intent's children in the completion's
// write: the guards that keep their keys free, and their records. A child
// that already exists with the same params and parent is left alone; with
// other params, or expired, the completion is refused. The view must have
// read every child (Others).
func (r Rules) outbox(v *View, parent *Record, children []intent.Registration, principal string, now time.Time) ([]Guard, []*Record, error) {
	var guards []Guard
	var created []*Record
	for i, c := range children {
		fp := intent.Fingerprint(c.Params)
		o := v.Others[c.Key]
		if existing := o.Rec; existing != nil {
			if existing.Fingerprint != fp || existing.ParentKey != parent.Key {
				return nil, nil, &intent.FingerprintMismatchError{Key: c.Key, Stored: existing.Fingerprint, Given: fp}
			}
			continue
		}
		if o.Tomb != nil {
			return nil, nil, intent.Invalid(fmt.Sprintf("children[%d].key", i), "%q expired after its retention; register the child under a new key", c.Key)
		}
		// The parent's own guards already cover the parent; add the
		// child's absence and its tombstone's.
		rec := r.record(&c, fp, principal, now)
		rec.History[0].Reason = "registered by the completion of " + parent.Key
		guards = append(guards, Guard{Kind: RecordAt, Key: c.Key, Rev: 0}, Guard{Kind: NoTombstone, Key: c.Key})
		created = append(created, rec)
		parent.appendEvent(intent.Event{Time: now, Kind: intent.EventChildRegistered, Accepted: true, Reason: c.Key, Principal: principal})
	}
	return guards, created, nil
}
