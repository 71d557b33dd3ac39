package machine

import "github.com/intentd/intentd/intent"

// View is what one decision about an intent is made from: its record as
// the store read it, and what the store read with it.
type View struct {
	// Key is the intent's key (its record may be absent).
	Key string
	// Rec is the record, nil when absent; Rev is its mod revision, 0 when
	// absent. Every write a decision makes is guarded by Rev.
	Rec *Record
	Rev int64
	// Fresh is false when the view came from the store's cache or was
	// assumed (an optimistic register-and-acquire): the store must then
	// confirm a refusal, or a decision to write nothing, on a fresh read;
	// a write is guarded by its compares anyway.
	Fresh bool
	// Tomb is the record's tombstone, when it was removed after retention.
	Tomb *Tombstone
	// Spots is where the store looked for the tombstones of the keys it
	// read (the record's, when absent, and the others'), by key: opaque
	// to the diagram, which never reads it. The store turns a NoTombstone
	// guard into compares of the key's spot, and writes a tombstone
	// (Decision.Tombstone) into the record's.
	Spots map[string]TombstoneSpot
	// Sessions holds the sessions read with the record: id → the create
	// revision of the session's key, 0 when it was read and is absent. A
	// session not in the map was not read.
	Sessions map[string]int64
	// Others holds other intents of the tenant read with the record (a
	// parent, a Complete's children), by key. An intent not in the map was
	// not read.
	Others map[string]Other
}

// TombstoneSpot is where the store keeps, or would keep, a key's
// tombstone, as it read it: a place of its own naming, its version then (0:
// absent) and what it held. Nothing written there since means the key
// gained no tombstone since.
type TombstoneSpot struct {
	Place string
	Rev   int64
	Value []byte
}

// Other is another intent as read with a view.
type Other struct {
	Rec  *Record    // nil: absent
	Tomb *Tombstone // nil: no tombstone
}

// alive reports whether session id exists with create revision rev in the
// view (false when it was not read).
func (v *View) alive(id string, rev int64) bool {
	r, read := v.Sessions[id]
	return read && r != 0 && r == rev
}

// HolderAlive reports whether the record's lease holder is alive, as far as
// the view read (a holder session not read counts as gone).
func (v *View) HolderAlive() bool {
	l := v.Rec.Lease
	return l != nil && v.alive(l.SessionID, l.SessionRev)
}

// holder is HolderAlive in ToIntent's terms.
func (v *View) holder() Holder { return Holder(v.HolderAlive()) }

// HolderUnread is the session to read before the record can be shown as
// it is: the holder of an IN_PROGRESS record whose session the view did not
// read. Empty when nothing is missing (or there is no record).
func (v *View) HolderUnread() string {
	if v.Rec == nil {
		return ""
	}
	l := v.Rec.Lease
	if v.Rec.State != intent.StateInProgress || l == nil {
		return ""
	}
	if _, read := v.Sessions[l.SessionID]; read {
		return ""
	}
	return l.SessionID
}

// shown is the record as an answer shows it: an IN_PROGRESS record whose
// holder lapsed reads as UNKNOWN, its lease not live.
func (v *View) shown() *intent.Intent { return v.Rec.ToIntent(v.Rev, v.holder()) }

// Missing explains an absent record: expired (a tombstone remains) or
// never registered.
func (v *View) Missing() error {
	if v.Tomb != nil {
		return v.Tomb.Expired()
	}
	return &intent.NotFoundError{Key: v.Key}
}
