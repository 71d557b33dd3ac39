package machine

import (
	"time"

	"github.com/intentd/intentd/intent"
)

// Session is the caller's worker session, as the store knows it.
type Session struct {
	ID string
	// Rev is the create revision of the session's key: the session is
	// alive exactly while its key exists with this revision.
	Rev    int64
	Worker string
}

// AcquireCall is an Acquire: the worker of Session asks what it may do.
type AcquireCall struct {
	Req     *intent.AcquireRequest
	Session Session
	// Fingerprint is the one the caller expects: Req.Register's params',
	// else Req.ExpectedFingerprint; empty for none.
	Fingerprint string
	Principal   string
}

// Acquire decides an Acquire. Only a PENDING intent yields EXECUTE; an
// UNKNOWN one (reported so, or its holder's session lapsed) yields
// RECONCILE; each under a new lease whose token is the write's revision,
// guarded by the caller's session being alive. An intent held by a live
// session answers IN_PROGRESS with the holder's lease, or, to a retry of
// the call that issued it (same session and request id), that lease again.
// A lapsed holder's attempt counts against the intent's attempts limit
// (see endAttempt): past it the intent goes to NEEDS_REVIEW instead of
// being handed out again. Final and NEEDS_REVIEW intents are replayed; a
// tombstone is EXPIRED; an absent intent is registered in the same write
// when the call carries a registration.
func (r Rules) Acquire(v *View, c AcquireCall, now time.Time) Decision {
	sess, req := c.Session, c.Req
	if !v.alive(sess.ID, sess.Rev) {
		return refuse(intent.ErrSessionNotFound)
	}
	rec := v.Rec
	switch {
	case rec == nil && v.Tomb != nil:
		t := v.Tomb
		d := answer(&intent.Intent{Tenant: req.Tenant, Key: req.Key, State: t.State, Fingerprint: t.Fingerprint, CompletedAt: t.CompletedAt})
		d.Answer.Outcome = intent.OutcomeExpired
		return d
	case rec == nil && req.Register == nil:
		return refuse(&intent.NotFoundError{Key: req.Key})
	case rec == nil:
		next, guards, err := r.newRecord(v, req.Register, c.Fingerprint, c.Principal, now)
		if err != nil {
			return refuse(err)
		}
		return r.grant(v, next, intent.ModeExecute, c, now, guards...)
	case c.Fingerprint != "" && c.Fingerprint != rec.Fingerprint:
		return refuse(&intent.FingerprintMismatchError{Key: req.Key, Stored: rec.Fingerprint, Given: c.Fingerprint})
	case rec.State == intent.StateInProgress && v.HolderAlive():
		l := rec.Lease
		d := answer(rec.ToIntent(v.Rev, HolderLive))
		d.Answer.Outcome, d.Answer.Lease = intent.OutcomeInProgress, true
		if l.SessionID == sess.ID && l.RequestID == req.RequestID {
			// A retry of the call that issued this lease, or the store's
			// read-back after its commit was ambiguous.
			d.Answer.Outcome = modeOutcome(l.Mode)
		}
		return d
	case rec.State == intent.StateInProgress:
		// The holder's session lapsed: the outcome of its attempt is
		// unknown. Reconcile under a new token, provided the holder is
		// still gone when the write applies.
		next := rec.Clone()
		gone, exhausted := r.noteLapse(next, "", now)
		if exhausted {
			// Too many attempts ended so: a human decides, and nobody is
			// handed the intent again.
			d := v.write(next, gone)
			d.Ended, d.Exhausted = EndedLapsedAtAcquire, true
			d.Answer = Answer{Show: ShowNext, Outcome: replayOutcome(next.State)}
			return d
		}
		d := r.grant(v, next, intent.ModeReconcile, c, now, gone)
		d.Ended = EndedLapsedAtAcquire
		return d
	case rec.State == intent.StateUnknown:
		return r.grant(v, rec.Clone(), intent.ModeReconcile, c, now)
	case rec.State == intent.StatePending:
		return r.grant(v, rec.Clone(), intent.ModeExecute, c, now)
	}
	return replay(v)
}

// grant issues a lease on next to the caller's session: the decision to
// write it, guarded by the session being alive. The token is left 0: it
// is derived from the revision of the write (see Materialize).
func (r Rules) grant(v *View, next *Record, mode intent.Mode, c AcquireCall, now time.Time, guards ...Guard) Decision {
	sess := c.Session
	next.State = intent.StateInProgress
	next.Lease = &Lease{
		Mode:       mode,
		SessionID:  sess.ID,
		SessionRev: sess.Rev,
		Worker:     sess.Worker,
		RequestID:  c.Req.RequestID,
		AcquiredAt: now,
	}
	next.UpdatedAt = now
	next.appendEvent(intent.Event{Time: now, Kind: intent.EventAcquired, Mode: mode, SessionID: sess.ID, Worker: sess.Worker, Accepted: true, Issued: true, Principal: c.Principal})
	d := v.write(next, append(guards, Guard{Kind: SessionAlive, Session: sess.ID, Rev: sess.Rev})...)
	d.Answer = Answer{Show: ShowNextHeld, Outcome: modeOutcome(mode), Lease: true, Fresh: true}
	return d
}

// ReplayFinal answers an Acquire from a remembered record, without etcd:
// a final record never changes state or result, so until its retention
// ends (then it may be gone) it is replayed from memory. The caller's
// session is not checked: nothing is issued to it. ok is false when the
// record is not final or may be gone: ask etcd (Acquire).
func ReplayFinal(v *View, fingerprint string, now time.Time) (d Decision, ok bool) {
	if !v.Rec.State.Final() || !now.Before(v.Rec.RetainUntil) {
		return Decision{}, false
	}
	if fingerprint != "" && fingerprint != v.Rec.Fingerprint {
		return refuse(&intent.FingerprintMismatchError{Key: v.Key, Stored: v.Rec.Fingerprint, Given: fingerprint}), true
	}
	return replay(v), true
}

// replay answers Acquire for an intent no one may act on now.
func replay(v *View) Decision {
	d := answer(v.Rec.ToIntent(v.Rev, HolderGone))
	d.Answer.Outcome = replayOutcome(v.Rec.State)
	return d
}

func replayOutcome(st intent.State) intent.Outcome {
	switch st {
	case intent.StateCompleted:
		return intent.OutcomeCompleted
	case intent.StateFailed:
		return intent.OutcomeFailed
	case intent.StateCancelled:
		return intent.OutcomeCancelled
	}
	return intent.OutcomeNeedsReview
}

func modeOutcome(m intent.Mode) intent.Outcome {
	if m == intent.ModeReconcile {
		return intent.OutcomeReconcile
	}
	return intent.OutcomeExecute
}
