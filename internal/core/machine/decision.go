package machine

import (
	"time"

	"github.com/intentd/intentd/intent"
)

// Rules are the store's settings the state diagram reads.
type Rules struct {
	// DefaultRetention is how long a final record is kept when its
	// registration names no retention.
	DefaultRetention time.Duration
	// TombstoneRetention is how long the tombstone of a removed record is
	// kept.
	TombstoneRetention time.Duration
	// MaxAttempts is the attempts limit of a registration that names none,
	// and of a record stored before records had one (see endAttempt).
	MaxAttempts int
}

// Decision is what a decide function decided: plain data, so that the
// store can turn it into one etcd transaction, and so that several
// decisions on distinct intents could share one.
type Decision struct {
	// Guards are the conditions the decision relies on, to be checked
	// atomically with its writes; the first is always that the record is
	// still at the view's revision. Empty when nothing is written.
	Guards []Guard
	// Next is the record's next version, nil when the record is not
	// written. Evidence (a refused report kept in the history) is a Next
	// with Err set.
	Next *Record
	// Create holds other records of the tenant created by the same write
	// (a Complete's outbox children); Guards keep their keys free.
	Create []*Record
	// Tombstone, when set, removes the record and leaves this in its place
	// (the end of its retention). Next is then nil.
	Tombstone *Tombstone
	// Err is the refusal to answer, after Next (the evidence) is written if
	// there is one. Refusals are the errors of package intent, which the
	// server maps to statuses in its one table.
	Err error
	// Answer is what the call answers when Err is nil.
	Answer Answer
	// NeedSession, when set, is the one thing decided: read that session
	// into the view, then decide again. Only a report, which decides from
	// the record alone, asks for it, and only for its rare answers that
	// show whether a holder is alive.
	NeedSession string
	// Ended says whether the decision ends an attempt without a report, and
	// how; Exhausted that this was one attempt too many and the intent goes
	// to NEEDS_REVIEW. The store counts both once the write committed.
	Ended     Ended
	Exhausted bool
}

// Writes reports whether the decision writes anything.
func (d *Decision) Writes() bool { return d.Next != nil || d.Tombstone != nil }

// Issues reports whether the decision's write issues a lease: its token is
// left to the write (see Record.Materialize), and the store gives it a
// Slot.
func (d *Decision) Issues() bool {
	return d.Next != nil && d.Next.Lease != nil && d.Next.Lease.Token == 0
}

// Finish is the decision's answer once its writes committed at revision
// rev, committed being Next as a reader now sees it (tokens materialized).
func (d *Decision) Finish(committed *Record, rev int64) Answer {
	a := d.Answer
	a.Written = true
	switch a.Show {
	case ShowNext:
		a.Intent = committed.ToIntent(rev, HolderGone)
	case ShowNextHeld:
		a.Intent = committed.ToIntent(rev, HolderLive)
	}
	return a
}

// Answer is what a call answers.
type Answer struct {
	// Intent is the intent the answer shows, as decided; with Show set it
	// is the committed next version, which exists only once written (its
	// revision, and the token of a lease it issued): Finish fills it in.
	Intent *intent.Intent
	Show   Show
	// Outcome is Acquire's outcome; Lease tells that the caller (EXECUTE,
	// RECONCILE) or the holder (IN_PROGRESS) holds Intent.Lease; Fresh that
	// this very call issued it.
	Outcome intent.Outcome
	Lease   bool
	Fresh   bool
	// Created is Register's: this call created the record (or its earlier
	// attempt did, recognized by request id).
	Created bool
	// Replayed is true when the call had been applied already (a retried
	// report or decision): nothing changed.
	Replayed bool
	// Written is true when the decision wrote (set by Finish).
	Written bool
	// Verdict and Submission are BeginSubmission's and RecordSubmission's
	// (submission.go): what the gateway is to do, and the operation's
	// submission it is about.
	Verdict    intent.SubmissionVerdict
	Submission *intent.Submission
}

// Show is which version of the record an answer shows.
type Show int

const (
	// ShowDecided shows Answer.Intent as the decision made it.
	ShowDecided Show = iota
	// ShowNext shows the committed next version, no live holder.
	ShowNext
	// ShowNextHeld shows the committed next version held by the caller.
	ShowNextHeld
)

// Ended is how a decision ends an attempt without a report (see
// endAttempt), for the store's counters.
type Ended int

const (
	EndedNone Ended = iota
	// EndedMarkedUnknown: an accepted MarkUnknown.
	EndedMarkedUnknown
	// EndedLapsedAtAcquire and EndedLapsedAtSweep: a lapsed lease, noticed
	// by an Acquire of the intent or by the janitor's sweep.
	EndedLapsedAtAcquire
	EndedLapsedAtSweep
)

// Guard is one condition a decision relies on. Keys are intent keys of the
// decision's tenant.
type Guard struct {
	Kind GuardKind
	// Key is the intent the guard is about (RecordAt, NoTombstone, Exists).
	Key string
	// Session is the session the guard is about (SessionAlive,
	// SessionGone).
	Session string
	// Rev is a mod revision (RecordAt; 0: the record is absent) or a
	// session key's create revision (SessionAlive, SessionGone).
	Rev int64
}

// GuardKind is what a Guard requires.
type GuardKind int

const (
	// RecordAt: intent Key's record is still at mod revision Rev (absent
	// for 0): nobody changed it since the view was read.
	RecordAt GuardKind = iota + 1
	// SessionAlive: Session exists with create revision Rev.
	SessionAlive
	// SessionGone: Session does not exist with create revision Rev (it
	// lapsed, or was closed).
	SessionGone
	// NoTombstone: intent Key has no tombstone: nothing was written at its
	// tombstone's spot (View.Spots) since the view read it.
	NoTombstone
	// Exists: intent Key's record exists.
	Exists
)

// write is the decision to write next over the view's record, guarded by
// the view's revision and guards.
func (v *View) write(next *Record, guards ...Guard) Decision {
	return Decision{Next: next, Guards: append([]Guard{{Kind: RecordAt, Key: v.Key, Rev: v.Rev}}, guards...)}
}

// answer is a decision to write nothing and answer in.
func answer(in *intent.Intent) Decision { return Decision{Answer: Answer{Intent: in}} }

// refuse is a decision to write nothing and refuse with err.
func refuse(err error) Decision { return Decision{Err: err} }

// holderGone is the guard that keeps a lapsed holder lapsed until the write
// applies: its session no longer exists with the recorded revision.
func holderGone(l *Lease) Guard {
	return Guard{Kind: SessionGone, Session: l.SessionID, Rev: l.SessionRev}
}
