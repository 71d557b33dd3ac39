package machine

import (
	"time"

	"github.com/intentd/intentd/intent"
)

// noteLapse records in next that its holder's session lapsed before a
// report: next becomes UNKNOWN, or NEEDS_REVIEW when that was one attempt
// too many (exhausted; see endAttempt). It returns the guard that makes
// the write conditional on the holder still being gone.
func (r Rules) noteLapse(next *Record, principal string, now time.Time) (gone Guard, exhausted bool) {
	l := next.Lease
	next.appendEvent(intent.Event{Time: now, Kind: intent.EventLeaseLapsed, Token: l.Token, SessionID: l.SessionID, Worker: l.Worker, Accepted: true, Principal: principal})
	next.State, next.UpdatedAt = intent.StateUnknown, now
	exhausted = endAttempt(next, r.MaxAttempts, endedLapsed, now)
	return holderGone(next.Lease), exhausted
}

// janitorPrincipal is who the history names for the janitor's changes.
const janitorPrincipal = "janitor"

// MarkLapsed decides the janitor's marking of an IN_PROGRESS intent whose
// holder, session, lapsed: UNKNOWN (or NEEDS_REVIEW, past its attempts
// limit), provided the holder is still gone when the write applies. An
// intent no longer held by that session, or held alive, is left alone.
func (r Rules) MarkLapsed(v *View, session string, now time.Time) Decision {
	rec := v.Rec
	if rec == nil || rec.State != intent.StateInProgress || rec.Lease.SessionID != session || v.HolderAlive() {
		return Decision{}
	}
	next := rec.Clone()
	gone, exhausted := r.noteLapse(next, janitorPrincipal, now)
	d := v.write(next, gone)
	d.Ended, d.Exhausted = EndedLapsedAtSweep, exhausted
	return d
}

// Remove decides the removal of a final record whose retention ended: the
// record goes and a tombstone (its key, final state and completion) stays,
// kept for TombstoneRetention; a Register or Acquire of the key is EXPIRED
// from then on. A record gone already, not final, or not due is left
// alone. The store writes the tombstone where the view's spot for the key
// says, guarded by that spot being unchanged.
func (r Rules) Remove(v *View, now time.Time) Decision {
	rec := v.Rec
	if rec == nil || !rec.State.Final() || now.Before(rec.RetainUntil) {
		return Decision{}
	}
	return Decision{
		Guards: []Guard{{Kind: RecordAt, Key: v.Key, Rev: v.Rev}},
		Tombstone: &Tombstone{Key: rec.Key, State: rec.State, Fingerprint: rec.Fingerprint, CompletedAt: rec.CompletedAt,
			RemovedAt: now, Until: now.Add(r.TombstoneRetention)},
	}
}
