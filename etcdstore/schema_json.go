package etcdstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// The JSON storage schema: the values every version of intentd before the
// compact format (schema.go) wrote, which existing data dirs still hold
// until each record's next write replaces it. These types are only decoded
// now (decodeRecord, decodeTombstone, by the value's first byte), except
// sessionRecord, which is still written as JSON: there is one per worker,
// not per intent. Their field names and omitempty choices are what is on
// disk: testdata/records pins them byte for byte. Enums are kept as the
// numbers of the API's enums; tokens in fencing's text encoding.
//
// fromStored is the one place where a JSON record meets the record type.
// It copies fields and shares the rest (params, labels, payloads, external
// refs): no second decoding pass.

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

func (s *storedResult) domain() *intent.Result {
	if s == nil {
		return nil
	}
	return &intent.Result{Payload: s.Payload, ExternalRefs: s.ExternalRefs}
}

func (s *storedFailure) domain() *intent.Failure {
	if s == nil {
		return nil
	}
	return &intent.Failure{Code: s.Code, Message: s.Message}
}

func decodeJSONRecord(b []byte) (*machine.Record, error) {
	var s storedRecord
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return fromStored(&s), nil
}

func decodeJSONTombstone(b []byte) (*machine.Tombstone, error) {
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
