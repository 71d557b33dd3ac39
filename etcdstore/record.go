package etcdstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// keys builds the etcd keys of the layout in the package doc.
type keys struct{ prefix string }

func (k keys) tenant(tenant string) string      { return k.prefix + "t/" + tenant + "/" }
func (k keys) intent(tenant, key string) string { return k.tenant(tenant) + "i/" + key }
func (k keys) session(tenant, id string) string { return k.tenant(tenant) + "s/" + id }

// record is an intent as stored in etcd.
type record struct {
	Tenant        string            `json:"tenant"`
	Key           string            `json:"key"`
	State         intent.State      `json:"state"`
	Params        json.RawMessage   `json:"params"`
	ParamsVersion string            `json:"params_version,omitempty"`
	Fingerprint   string            `json:"fingerprint"`
	Labels        map[string]string `json:"labels,omitempty"`
	ParentKey     string            `json:"parent_key,omitempty"`
	Lease         *leaseRecord      `json:"lease,omitempty"`
	Result        *intent.Result    `json:"result,omitempty"`
	Failure       *intent.Failure   `json:"failure,omitempty"`
	History       []intent.Event    `json:"history"`
	CreatedAt     time.Time         `json:"created_at"`
	UpdatedAt     time.Time         `json:"updated_at"`
	CompletedAt   time.Time         `json:"completed_at,omitzero"`
}

// leaseRecord is the current (or last) lease of an intent.
type leaseRecord struct {
	// Token is 0 in the write that issued the lease, meaning "the mod
	// revision of this version"; decode fills it in.
	Token     fencing.Token `json:"token"`
	Mode      intent.Mode   `json:"mode"`
	SessionID string        `json:"session_id"`
	// SessionRev is the create revision of the holder's session key: the
	// holder is alive exactly while that key exists with this revision.
	SessionRev int64     `json:"session_rev"`
	Worker     string    `json:"worker,omitempty"`
	RequestID  string    `json:"request_id,omitempty"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// errCorrupt marks a stored value that does not decode. Retrying cannot
// help, so operations stop at once.
var errCorrupt = errors.New("etcdstore: corrupt record")

// maxHistory bounds an intent's history. Registration, acquisitions and
// accepted reports are a handful per attempt; what can grow without bound
// is evidence from stale workers and heartbeats, which are dropped oldest
// first once the bound is reached.
const maxHistory = 128

func encodeRecord(r *record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: encode record: %w", err)
	}
	return b, nil
}

// decodeRecord decodes a stored record and materializes the token of a
// lease issued by this very version (stored as 0) from its mod revision.
func decodeRecord(b []byte, modRev int64) (*record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: record at revision %d: %v", errCorrupt, modRev, err)
	}
	if r.Lease != nil && r.Lease.Token == 0 {
		r.Lease.Token = fencing.Token(modRev)
		for i := range r.History {
			if r.History[i].Kind == intent.EventAcquired && r.History[i].Token == 0 {
				r.History[i].Token = r.Lease.Token
			}
		}
	}
	return &r, nil
}

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

// hasEvent reports whether the history holds an entry of kind under token
// with the given acceptance: how an operation recognizes its own effect
// when it reads back after an ambiguous commit.
func (r *record) hasEvent(kind intent.EventKind, t fencing.Token, accepted bool) bool {
	return slices.ContainsFunc(r.History, func(e intent.Event) bool {
		return e.Kind == kind && e.Token == t && e.Accepted == accepted
	})
}

func sameResult(a, b *intent.Result) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.ExternalRefs, b.ExternalRefs)
}

// toIntent converts a record to the domain type. live says whether the
// holder's session is alive, which turns a lapsed IN_PROGRESS into UNKNOWN.
func (r *record) toIntent(modRev int64, live bool, withHistory bool) *intent.Intent {
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
	}
	if r.Lease != nil {
		in.Lease = r.Lease.toLease(r.State == intent.StateInProgress && live)
	}
	if r.State == intent.StateInProgress && !live {
		in.State = intent.StateUnknown
	}
	if withHistory {
		in.History = slices.Clone(r.History)
	}
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

// sessionRecord is the value of a session key.
type sessionRecord struct {
	Worker string        `json:"worker"`
	TTL    time.Duration `json:"ttl"`
}
