package machine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// Record is an intent as the store works on it; its stored form is the
// store's business (etcdstore's schema.go).
type Record struct {
	Tenant        string
	Key           string
	State         intent.State
	Params        json.RawMessage
	ParamsVersion string
	Fingerprint   string
	Labels        map[string]string
	ParentKey     string
	Lease         *Lease
	Result        *intent.Result
	Failure       *intent.Failure
	History       []intent.Event
	CreatedAt     time.Time
	UpdatedAt     time.Time
	CompletedAt   time.Time
	// Retention is how long the record is kept once final; RetainUntil is
	// set when it becomes final.
	Retention   time.Duration
	RetainUntil time.Time
	// MaxAttempts is how many attempts may end without a report before the
	// intent goes to NEEDS_REVIEW, fixed at registration (0 in records
	// stored before there was a limit: the store's default applies).
	// Attempts counts them, and EndedToken is the token of the last one
	// counted, so that one lease never counts twice (see endAttempt).
	MaxAttempts int
	Attempts    int
	EndedToken  fencing.Token
	// Action, Identity and Summary are the registration's (see
	// intent.Registration): fixed at registration, like MaxAttempts, and
	// empty in records stored before registrations carried them.
	Action   string
	Identity json.RawMessage
	Summary  string
	// Submissions are the latest submission of each operation sent
	// through the fencing gateway (submission.go), at most
	// intent.MaxSubmissions.
	Submissions []intent.Submission
	// IndexLayout is the store's layout of the index entries of the
	// version read (a store's concern, so that a record's next write can
	// move them to the current one); a decision copies it and never reads
	// it.
	IndexLayout int
}

// Lease is the current (or last) lease of an intent.
type Lease struct {
	// Token is 0 in the write that issued the lease, meaning "derived
	// from the mod revision of this version and Slot" (see Materialize).
	Token fencing.Token
	// Slot is set by the store in the write that issues the lease: 1 to
	// TokenSlots, unique among the leases issued by its etcd transaction.
	// 0 with token 0 is a lease issued before transactions were shared
	// (its token is the bare revision). Materialize clears it.
	Slot      int
	Mode      intent.Mode
	SessionID string
	// SessionRev is the create revision of the holder's session key: the
	// holder is alive exactly while that key exists with this revision.
	SessionRev int64
	Worker     string
	RequestID  string
	AcquiredAt time.Time
}

// Tombstone is what stays of a record removed after its retention: enough
// to refuse a late retry of its key, and to say how the intent ended and
// when. The store keeps it packed (etcdstore/tombstones): the state, the
// completion to the second and the end of its retention to the day;
// tombstones of earlier versions also held the fingerprint and the moment
// of removal, which packed ones leave empty.
type Tombstone struct {
	Key         string
	State       intent.State
	Fingerprint string
	CompletedAt time.Time
	RemovedAt   time.Time
	Until       time.Time
}

// Expired is the refusal of a call on the key a tombstone holds.
func (t *Tombstone) Expired() error {
	return &intent.ExpiredError{Key: t.Key, State: t.State, Fingerprint: t.Fingerprint, CompletedAt: t.CompletedAt}
}

// maxHistory bounds an intent's history. Registration, acquisitions and
// accepted reports are a handful per attempt; what can grow without bound
// is evidence from stale workers and heartbeats, which are dropped oldest
// first once the bound is reached.
const maxHistory = 128

// Clone returns a deep enough copy of r to build the next version from
// without touching r, which may be shared through the store's cache.
func (r *Record) Clone() *Record {
	c := *r
	c.Labels = maps.Clone(r.Labels)
	if r.Lease != nil {
		l := *r.Lease
		c.Lease = &l
	}
	c.History = slices.Clone(r.History)
	c.Submissions = slices.Clone(r.Submissions)
	return &c
}

// TokenSlots is how many leases one etcd revision can issue: the writes of
// several intents share one transaction (the store's group commit), so a
// token is revision × TokenSlots + the issuing write's position in it.
const TokenSlots = 128

// Materialize fills in the tokens of a version that issued a lease: the
// issuing write stores token 0 and its Slot, because it cannot know its
// revision rev before etcd applies it. The token is rev × TokenSlots +
// Slot - 1, so tokens strictly increase over every lease issued: revisions
// do, and within one revision the slots differ. A lease stored before
// there were slots (Slot 0) has the bare revision as its token, as it was
// issued; every later revision r' > rev gives tokens of at least
// r' × TokenSlots > rev, so an old token stays below every new one.
func (r *Record) Materialize(rev int64) {
	if r.Lease == nil || r.Lease.Token != 0 {
		return
	}
	r.Lease.Token, r.Lease.Slot = TokenAt(rev, r.Lease.Slot), 0
	for i := range r.History {
		if r.History[i].Issued && r.History[i].Token == 0 {
			r.History[i].Token = r.Lease.Token
		}
	}
}

// TokenAt is the token of a lease issued at revision rev in slot (see
// Materialize).
func TokenAt(rev int64, slot int) fencing.Token {
	if slot == 0 {
		return fencing.Token(rev)
	}
	return fencing.Token(rev)*TokenSlots + fencing.Token(slot-1)
}

// CurrentToken is the newest token issued for the intent, 0 if none.
func (r *Record) CurrentToken() fencing.Token {
	if r.Lease == nil {
		return 0
	}
	return r.Lease.Token
}

// appendEvent adds e to the history, dropping the oldest heartbeat or
// stale-evidence entries once maxHistory is reached.
func (r *Record) appendEvent(e intent.Event) {
	r.History = append(r.History, e)
	for len(r.History) > maxHistory {
		drop := slices.IndexFunc(r.History, func(e intent.Event) bool {
			return e.Kind == intent.EventHeartbeat || !e.Accepted
		})
		if drop < 0 {
			drop = 1 // keep the registration entry
		}
		r.History = slices.Delete(r.History, drop, drop+1)
	}
}

// finalize stamps a record entering a final state with when it may be
// removed.
func (r *Record) finalize(now time.Time) {
	r.CompletedAt = now
	r.RetainUntil = now.Add(r.Retention)
}

// supersede issues a new token that no worker holds: a reviewer's decision
// makes every earlier lease stale. Like grant, the token is this write's
// revision.
func (r *Record) supersede(actor string, now time.Time) {
	r.Lease = &Lease{Mode: intent.ModeReview, Worker: actor, AcquiredAt: now}
	r.UpdatedAt = now
}

// hasEvent reports whether the history holds an entry of kind under token
// with the given acceptance: how a call recognizes its own effect when the
// store reads back after an ambiguous commit.
func (r *Record) hasEvent(kind intent.EventKind, t fencing.Token, accepted bool) bool {
	return slices.ContainsFunc(r.History, func(e intent.Event) bool {
		return e.Kind == kind && e.Token == t && e.Accepted == accepted
	})
}

// digest is what a history entry keeps of a result: its external refs, and
// the SHA-256 of its payload instead of the payload.
func digest(r *intent.Result) (*intent.Result, string) {
	if r == nil {
		return nil, ""
	}
	sum := ""
	if len(r.Payload) > 0 {
		sum = PayloadDigest(r.Payload)
	}
	return &intent.Result{ExternalRefs: r.ExternalRefs}, sum
}

// PayloadDigest is a result payload's digest as history entries hold it:
// its SHA-256, in lowercase hex.
func PayloadDigest(p []byte) string {
	h := sha256.Sum256(p)
	return hex.EncodeToString(h[:])
}

func sameResult(a, b *intent.Result) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.ExternalRefs, b.ExternalRefs)
}

// Holder is what ToIntent is told of the lease holder's session. Under
// HolderLive an IN_PROGRESS record reads as held and its lease as Live;
// under HolderGone it reads as UNKNOWN (a lapsed lease). In any other state
// the two read the same. A named type rather than a bool, so that every
// call says which it means.
type Holder bool

// The two ways a holder's session can be.
const (
	HolderLive Holder = true
	HolderGone Holder = false
)

// ToIntent converts a record read at mod revision modRev to the domain
// type, without its history.
func (r *Record) ToIntent(modRev int64, h Holder) *intent.Intent {
	live := bool(h)
	in := &intent.Intent{
		Tenant:        r.Tenant,
		Key:           r.Key,
		State:         r.State,
		Params:        r.Params,
		ParamsVersion: r.ParamsVersion,
		Fingerprint:   r.Fingerprint,
		Labels:        r.Labels,
		ParentKey:     r.ParentKey,
		Result:        r.Result,
		Failure:       r.Failure,
		CreatedAt:     r.CreatedAt,
		UpdatedAt:     r.UpdatedAt,
		CompletedAt:   r.CompletedAt,
		Revision:      modRev,
		Retention:     r.Retention,
		RetainUntil:   r.RetainUntil,
		Attempts:      r.Attempts,
		MaxAttempts:   r.MaxAttempts,
		Action:        r.Action,
		Identity:      r.Identity,
		Summary:       r.Summary,
	}
	if r.Lease != nil {
		in.Lease = r.Lease.toLease(r.State == intent.StateInProgress && live)
	}
	if r.State == intent.StateInProgress && !live {
		in.State = intent.StateUnknown
	}
	return in
}

// ToIntentWithHistory is ToIntent with a copy of the history: what Get
// returns.
func (r *Record) ToIntentWithHistory(modRev int64, h Holder) *intent.Intent {
	in := r.ToIntent(modRev, h)
	in.History = slices.Clone(r.History)
	return in
}

func (l *Lease) toLease(live bool) *intent.Lease {
	return &intent.Lease{
		Token:      l.Token,
		Mode:       l.Mode,
		SessionID:  l.SessionID,
		Worker:     l.Worker,
		RequestID:  l.RequestID,
		AcquiredAt: l.AcquiredAt,
		Live:       live,
	}
}
