package etcdstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// keys builds the etcd keys of the layout in the package doc.
type keys struct{ prefix string }

func (k keys) tenant(tenant string) string         { return k.prefix + "t/" + tenant + "/" }
func (k keys) intents(tenant string) string        { return k.tenant(tenant) + "i/" }
func (k keys) intent(tenant, key string) string    { return k.intents(tenant) + key }
func (k keys) session(tenant, id string) string    { return k.tenant(tenant) + "s/" + id }
func (k keys) tombstone(tenant, key string) string { return k.tenant(tenant) + "z/" + key }

// Index prefixes. An index entry's key ends in the record's order (see
// order); its value is the intent key.
func (k keys) stateIndex(tenant string, st intent.State) string {
	return k.tenant(tenant) + "x/s/" + st.String() + "/"
}

func (k keys) labelIndex(tenant string, l intent.Label) string {
	return k.tenant(tenant) + "x/l/" + url.QueryEscape(l.Name) + "=" + url.QueryEscape(l.Value) + "/"
}

func (k keys) parentIndex(tenant, parent string) string {
	return k.tenant(tenant) + "x/p/" + url.QueryEscape(parent) + "/"
}

// The cluster-wide indexes the janitor scans: intents held per session,
// final intents by end of retention, tombstones by end of retention, and
// intents not final yet by registration time.
func (k keys) unfinished() string { return k.prefix + "x/o/" }
func (k keys) holders() string    { return k.prefix + "x/h/" }
func (k keys) holder(tenant, session string) string {
	return k.holders() + tenant + "/" + session + "/"
}

// reviewQueue indexes, across tenants, the intents in a state that waits
// for a reviewer (UNKNOWN, NEEDS_REVIEW), so that the queue's depth is one
// count-only range; openSessions does the same for sessions (each entry
// lives on its session's lease).
func (k keys) reviewQueue(st intent.State) string { return k.prefix + "x/q/" + st.String() + "/" }
func (k keys) openSessions() string               { return k.prefix + "x/ss/" }
func (k keys) openSession(tenant, id string) string {
	return k.openSessions() + tenant + "/" + id
}

func (k keys) retentions() string     { return k.prefix + "x/r/" }
func (k keys) tombRetentions() string { return k.prefix + "x/zr/" }
func (k keys) election() string       { return k.prefix + "janitor/" }

// installation is the key of the installation's identity (see
// Store.Installation).
func (k keys) installation() string { return k.prefix + "installation" }

// timeKey is a fixed-width, byte-ordered spelling of t.
func timeKey(t time.Time) string { return fmt.Sprintf("%020d", t.UnixNano()) }

// order is where a record sorts in the tenant-scoped indexes: by
// registration time, then key. It never changes over the record's life.
func order(r *record) string { return timeKey(r.CreatedAt) + "/" + r.Key }

// indexKeys lists every index key a record version needs. Transitions put
// the keys the new version gains and delete the ones it loses, in the same
// transaction as the record, so the indexes cannot drift from the records.
func (k keys) indexKeys(r *record) []string {
	if r == nil {
		return nil
	}
	o := order(r)
	out := []string{k.stateIndex(r.Tenant, r.State) + o}
	for name, value := range r.Labels {
		out = append(out, k.labelIndex(r.Tenant, intent.Label{Name: name, Value: value})+o)
	}
	if r.ParentKey != "" {
		out = append(out, k.parentIndex(r.Tenant, r.ParentKey)+o)
	}
	if r.State == intent.StateInProgress && r.Lease != nil && r.Lease.SessionID != "" {
		out = append(out, k.holder(r.Tenant, r.Lease.SessionID)+r.Key)
	}
	if r.State.Final() && !r.RetainUntil.IsZero() {
		out = append(out, k.retentions()+timeKey(r.RetainUntil)+"/"+r.Tenant+"/"+r.Key)
	}
	if !r.State.Final() {
		out = append(out, k.unfinished()+timeKey(r.CreatedAt)+"/"+r.Tenant+"/"+r.Key)
	}
	if r.State == intent.StateUnknown || r.State == intent.StateNeedsReview {
		out = append(out, k.reviewQueue(r.State)+r.Tenant+"/"+o)
	}
	return out
}

// indexOps turns the index difference between two versions into etcd ops.
func (k keys) indexOps(from, to *record) []clientv3.Op {
	old, next := k.indexKeys(from), k.indexKeys(to)
	var ops []clientv3.Op
	for _, key := range old {
		if !slices.Contains(next, key) {
			ops = append(ops, clientv3.OpDelete(key))
		}
	}
	for _, key := range next {
		if !slices.Contains(old, key) {
			ops = append(ops, clientv3.OpPut(key, to.Key))
		}
	}
	return ops
}

// record is an intent as the store works on it; its stored form is
// storedRecord (schema.go).
type record struct {
	Tenant        string
	Key           string
	State         intent.State
	Params        json.RawMessage
	ParamsVersion string
	Fingerprint   string
	Labels        map[string]string
	ParentKey     string
	Lease         *leaseRecord
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
}

// tombstone is what stays of a record removed after its retention; its
// stored form is storedTombstone.
type tombstone struct {
	Key         string
	State       intent.State
	Fingerprint string
	CompletedAt time.Time
	RemovedAt   time.Time
	Until       time.Time
}

func (t *tombstone) expired() error {
	return &intent.ExpiredError{Key: t.Key, State: t.State, Fingerprint: t.Fingerprint, CompletedAt: t.CompletedAt}
}

// leaseRecord is the current (or last) lease of an intent.
type leaseRecord struct {
	// Token is 0 in the write that issued the lease, meaning "the mod
	// revision of this version"; decode fills it in.
	Token     fencing.Token
	Mode      intent.Mode
	SessionID string
	// SessionRev is the create revision of the holder's session key: the
	// holder is alive exactly while that key exists with this revision.
	SessionRev int64
	Worker     string
	RequestID  string
	AcquiredAt time.Time
}

// errCorrupt marks a stored value that does not decode. Retrying cannot
// help, so operations stop at once.
var errCorrupt = errors.New("etcdstore: corrupt record")

// maxHistory bounds an intent's history. Registration, acquisitions and
// accepted reports are a handful per attempt; what can grow without bound
// is evidence from stale workers and heartbeats, which are dropped oldest
// first once the bound is reached.
const maxHistory = 128

// clone returns a deep enough copy of r to build the next version from
// without touching r, which may be shared through the cache.
func (r *record) clone() *record {
	c := *r
	c.Labels = maps.Clone(r.Labels)
	if r.Lease != nil {
		l := *r.Lease
		c.Lease = &l
	}
	c.History = slices.Clone(r.History)
	return &c
}

// appendEvent adds e to the history, dropping the oldest heartbeat or
// stale-evidence entries once maxHistory is reached.
func (r *record) appendEvent(e intent.Event) {
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
func (r *record) finalize(now time.Time) {
	r.CompletedAt = now
	r.RetainUntil = now.Add(r.Retention)
}

// supersede issues a new token that no worker holds: a reviewer's decision
// makes every earlier lease stale. Like grant, the token is this write's
// revision.
func (r *record) supersede(actor string, now time.Time) {
	r.Lease = &leaseRecord{Mode: intent.ModeReview, Worker: actor, AcquiredAt: now}
	r.UpdatedAt = now
}

// hasEvent reports whether the history holds an entry of kind under token
// with the given acceptance: how an operation recognizes its own effect
// when it reads back after an ambiguous commit.
func (r *record) hasEvent(kind intent.EventKind, t fencing.Token, accepted bool) bool {
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
		h := sha256.Sum256(r.Payload)
		sum = hex.EncodeToString(h[:])
	}
	return &intent.Result{ExternalRefs: r.ExternalRefs}, sum
}

func sameResult(a, b *intent.Result) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.ExternalRefs, b.ExternalRefs)
}

// holder is what toIntent is told of the lease holder's session. Under
// holderLive an IN_PROGRESS record reads as held and its lease as Live;
// under holderGone it reads as UNKNOWN (a lapsed lease). In any other state
// the two read the same. A named type rather than a bool, so that every
// call says which it means.
type holder bool

const (
	holderLive holder = true
	holderGone holder = false
)

// toIntent converts a record to the domain type, without its history.
func (r *record) toIntent(modRev int64, h holder) *intent.Intent {
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
	}
	if r.Lease != nil {
		in.Lease = r.Lease.toLease(r.State == intent.StateInProgress && live)
	}
	if r.State == intent.StateInProgress && !live {
		in.State = intent.StateUnknown
	}
	return in
}

// toIntentWithHistory is toIntent with a copy of the history: what Get
// returns.
func (r *record) toIntentWithHistory(modRev int64, h holder) *intent.Intent {
	in := r.toIntent(modRev, h)
	in.History = slices.Clone(r.History)
	return in
}

func (l *leaseRecord) toLease(live bool) *intent.Lease {
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
