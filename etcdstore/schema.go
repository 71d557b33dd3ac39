package etcdstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/machine"
)

// The storage schema: the JSON values intentd keeps in etcd. These types are
// the only ones encoded to or decoded from a stored value, so that renaming
// a field of the domain types (package intent) or of the in-memory record
// cannot change what is on disk. Their field names, their order and their
// omitempty choices are the format every existing data dir holds and every
// replica of a rolling upgrade reads: testdata/records pins them byte for
// byte. Enums are kept as the numbers of the API's enums (plain ints here,
// so that no method of a domain type can change their spelling); tokens in
// fencing's text encoding, which is the tokens' wire format everywhere.
//
// toStored and fromStored are the one place where a record meets its stored
// form. They copy fields and share the rest (params, labels, payloads,
// external refs): no second encoding pass.

// storedRecord is the value of an intent's key.
type storedRecord struct {
	Tenant        string            `json:"tenant"`
	Key           string            `json:"key"`
	State         int               `json:"state"`
	Params        json.RawMessage   `json:"params"`
	ParamsVersion string            `json:"params_version,omitempty"`
	Fingerprint   string            `json:"fingerprint"`
	Labels        map[string]string `json:"labels,omitempty"`
	ParentKey     string            `json:"parent_key,omitempty"`
	Lease         *storedLease      `json:"lease,omitempty"`
	Result        *storedResult     `json:"result,omitempty"`
	Failure       *storedFailure    `json:"failure,omitempty"`
	History       []storedEvent     `json:"history"`
	CreatedAt     time.Time         `json:"created_at"`
	UpdatedAt     time.Time         `json:"updated_at"`
	CompletedAt   time.Time         `json:"completed_at,omitzero"`
	Retention     time.Duration     `json:"retention"`
	RetainUntil   time.Time         `json:"retain_until,omitzero"`
	// Absent in records stored before there was an attempts limit.
	MaxAttempts int           `json:"max_attempts,omitempty"`
	Attempts    int           `json:"attempts,omitempty"`
	EndedToken  fencing.Token `json:"ended_token,omitempty"`
}

// storedLease is a record's current (or last) lease. Token is "0" in the
// write that issued the lease, with its Slot (absent in leases issued
// before there were slots; see decodeRecord).
type storedLease struct {
	Token      fencing.Token `json:"token"`
	Slot       int           `json:"slot,omitempty"`
	Mode       int           `json:"mode"`
	SessionID  string        `json:"session_id"`
	SessionRev int64         `json:"session_rev"`
	Worker     string        `json:"worker,omitempty"`
	RequestID  string        `json:"request_id,omitempty"`
	AcquiredAt time.Time     `json:"acquired_at"`
}

// storedResult is a result; in a history entry it has no payload.
type storedResult struct {
	Payload      []byte            `json:"payload,omitempty"`
	ExternalRefs map[string]string `json:"external_refs,omitempty"`
}

type storedFailure struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// storedEvent is one history entry.
type storedEvent struct {
	Time          time.Time      `json:"time"`
	Kind          int            `json:"kind"`
	Token         fencing.Token  `json:"token,omitempty"`
	Mode          int            `json:"mode,omitempty"`
	SessionID     string         `json:"session_id,omitempty"`
	Worker        string         `json:"worker,omitempty"`
	Accepted      bool           `json:"accepted"`
	Result        *storedResult  `json:"result,omitempty"`
	PayloadSHA256 string         `json:"payload_sha256,omitempty"`
	Failure       *storedFailure `json:"failure,omitempty"`
	Reason        string         `json:"reason,omitempty"`
	Principal     string         `json:"principal,omitempty"`
	ResolvedState int            `json:"resolved_state,omitempty"`
	RequestID     string         `json:"request_id,omitempty"`
	Issued        bool           `json:"issued,omitempty"`
	Channel       string         `json:"channel,omitempty"`
}

// storedTombstone is the value of a tombstone key.
type storedTombstone struct {
	Key         string    `json:"key"`
	State       int       `json:"state"`
	Fingerprint string    `json:"fingerprint"`
	CompletedAt time.Time `json:"completed_at,omitzero"`
	RemovedAt   time.Time `json:"removed_at"`
	Until       time.Time `json:"until"`
}

// sessionRecord is the value of a session key; it holds no domain type, so
// it is its own stored form.
type sessionRecord struct {
	Worker string        `json:"worker"`
	TTL    time.Duration `json:"ttl"`
}

// toStored is a record's stored form.
func toStored(r *machine.Record) *storedRecord {
	s := &storedRecord{
		Tenant:        r.Tenant,
		Key:           r.Key,
		State:         int(r.State),
		Params:        r.Params,
		ParamsVersion: r.ParamsVersion,
		Fingerprint:   r.Fingerprint,
		Labels:        r.Labels,
		ParentKey:     r.ParentKey,
		Result:        toStoredResult(r.Result),
		Failure:       toStoredFailure(r.Failure),
		CreatedAt:     r.CreatedAt,
		UpdatedAt:     r.UpdatedAt,
		CompletedAt:   r.CompletedAt,
		Retention:     r.Retention,
		RetainUntil:   r.RetainUntil,
		MaxAttempts:   r.MaxAttempts,
		Attempts:      r.Attempts,
		EndedToken:    r.EndedToken,
	}
	if l := r.Lease; l != nil {
		s.Lease = &storedLease{Token: l.Token, Slot: l.Slot, Mode: int(l.Mode), SessionID: l.SessionID, SessionRev: l.SessionRev,
			Worker: l.Worker, RequestID: l.RequestID, AcquiredAt: l.AcquiredAt}
	}
	if r.History != nil {
		s.History = make([]storedEvent, len(r.History))
		for i, e := range r.History {
			s.History[i] = storedEvent{
				Time: e.Time, Kind: int(e.Kind), Token: e.Token, Mode: int(e.Mode), SessionID: e.SessionID,
				Worker: e.Worker, Accepted: e.Accepted, Result: toStoredResult(e.Result), PayloadSHA256: e.PayloadSHA256,
				Failure: toStoredFailure(e.Failure), Reason: e.Reason, Principal: e.Principal,
				ResolvedState: int(e.ResolvedState), RequestID: e.RequestID, Issued: e.Issued, Channel: e.Channel,
			}
		}
	}
	return s
}

// fromStored is the record a stored form holds.
func fromStored(s *storedRecord) *machine.Record {
	r := &machine.Record{
		Tenant:        s.Tenant,
		Key:           s.Key,
		State:         intent.State(s.State),
		Params:        s.Params,
		ParamsVersion: s.ParamsVersion,
		Fingerprint:   s.Fingerprint,
		Labels:        s.Labels,
		ParentKey:     s.ParentKey,
		Result:        s.Result.domain(),
		Failure:       s.Failure.domain(),
		CreatedAt:     s.CreatedAt,
		UpdatedAt:     s.UpdatedAt,
		CompletedAt:   s.CompletedAt,
		Retention:     s.Retention,
		RetainUntil:   s.RetainUntil,
		MaxAttempts:   s.MaxAttempts,
		Attempts:      s.Attempts,
		EndedToken:    s.EndedToken,
	}
	if l := s.Lease; l != nil {
		r.Lease = &machine.Lease{Token: l.Token, Slot: l.Slot, Mode: intent.Mode(l.Mode), SessionID: l.SessionID, SessionRev: l.SessionRev,
			Worker: l.Worker, RequestID: l.RequestID, AcquiredAt: l.AcquiredAt}
	}
	if s.History != nil {
		r.History = make([]intent.Event, len(s.History))
		for i, e := range s.History {
			r.History[i] = intent.Event{
				Time: e.Time, Kind: intent.EventKind(e.Kind), Token: e.Token, Mode: intent.Mode(e.Mode), SessionID: e.SessionID,
				Worker: e.Worker, Accepted: e.Accepted, Result: e.Result.domain(), PayloadSHA256: e.PayloadSHA256,
				Failure: e.Failure.domain(), Reason: e.Reason, Principal: e.Principal,
				ResolvedState: intent.State(e.ResolvedState), RequestID: e.RequestID, Issued: e.Issued, Channel: e.Channel,
			}
		}
	}
	return r
}

func toStoredResult(r *intent.Result) *storedResult {
	if r == nil {
		return nil
	}
	return &storedResult{Payload: r.Payload, ExternalRefs: r.ExternalRefs}
}

func (s *storedResult) domain() *intent.Result {
	if s == nil {
		return nil
	}
	return &intent.Result{Payload: s.Payload, ExternalRefs: s.ExternalRefs}
}

func toStoredFailure(f *intent.Failure) *storedFailure {
	if f == nil {
		return nil
	}
	return &storedFailure{Code: f.Code, Message: f.Message}
}

func (s *storedFailure) domain() *intent.Failure {
	if s == nil {
		return nil
	}
	return &intent.Failure{Code: s.Code, Message: s.Message}
}

func encodeRecord(r *machine.Record) ([]byte, error) {
	b, err := json.Marshal(toStored(r))
	if err != nil {
		return nil, fmt.Errorf("etcdstore: encode record: %w", err)
	}
	return b, nil
}

// decodeRecord decodes a stored record and materializes the token of a
// lease issued by this very version (stored as 0, with its slot) from its
// mod revision.
func decodeRecord(b []byte, modRev int64) (*machine.Record, error) {
	var s storedRecord
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: record at revision %d: %v", errCorrupt, modRev, err)
	}
	r := fromStored(&s)
	r.Materialize(modRev)
	return r, nil
}

func encodeTombstone(t *machine.Tombstone) ([]byte, error) {
	b, err := json.Marshal(storedTombstone{Key: t.Key, State: int(t.State), Fingerprint: t.Fingerprint,
		CompletedAt: t.CompletedAt, RemovedAt: t.RemovedAt, Until: t.Until})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: encode tombstone: %w", err)
	}
	return b, nil
}

func decodeTombstone(b []byte) (*machine.Tombstone, error) {
	var s storedTombstone
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return &machine.Tombstone{Key: s.Key, State: intent.State(s.State), Fingerprint: s.Fingerprint,
		CompletedAt: s.CompletedAt, RemovedAt: s.RemovedAt, Until: s.Until}, nil
}

func encodeSession(s sessionRecord) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: encode session: %w", err)
	}
	return b, nil
}

func decodeSession(b []byte) (sessionRecord, error) {
	var s sessionRecord
	if err := json.Unmarshal(b, &s); err != nil {
		return sessionRecord{}, fmt.Errorf("etcdstore: decode session: %w", err)
	}
	return s, nil
}
