package etcdstore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/intentd/intentd/etcdstore/internal/storagepb"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// The storage format: what intentd keeps in etcd for an intent. A record,
// or a tombstone of an earlier version (this one packs tombstones: package
// tombstones), is one format byte, then its value:
//
//   - formatCompact (0x02): the protobuf of package storagepb's message
//     (proto/storage/v1/storage.proto), the format this version writes; a
//     record's tenant and key are its etcd key's, not repeated in the value;
//   - formatCompressed (0x03): a record in a final state, whose 0x02 value
//     is stored compressed (zstd) when that saves at least a sixteenth of it
//     (storedValue): what is retained longest is what is kept smallest;
//   - formatCompact1 (0x01): the same message with the tenant and key in
//     it (a tombstone's key), which the previous version wrote;
//   - '{': JSON (schema_json.go), the format earlier versions wrote.
//
// Existing data dirs hold the older formats until a record's next write
// replaces it.
//
// The compact format spends bytes where bbolt is charged for them: no field
// names, varints, a fingerprint and digests as bytes rather than hex,
// session ids as numbers, times as nanoseconds after the record's creation,
// and nothing the record holds twice: not the history entry that issued the
// current lease, nor the accepted completion's external refs and payload
// digest (the result's), nor a fingerprint that is its params' digest, nor
// an end of retention that is the completion's time plus the retention.
// testdata/records pins every format byte for byte (the .pb2, .pb and
// .json files).
//
// A record's times are stored to the nanosecond and read back in UTC, as
// instants (the JSON kept the writer's zone offset; nothing reads it).
//
// toCompact and fromCompact are the one place where a record meets its
// stored form. They copy fields and share the rest (params, labels,
// payloads, external refs).

// formatCompact is the first byte of a compact record or tombstone this
// version writes, formatCompressed of a final record it compresses
// (compress.go); formatCompact1, of one of the previous version. JSON
// starts with '{'.
const (
	formatCompressed byte = 0x03
	formatCompact    byte = 0x02
	formatCompact1   byte = 0x01
)

// marshal is deterministic, so that a value's bytes follow from the record
// alone (map order included): the golden files pin them.
var marshal = proto.MarshalOptions{Deterministic: true}

// encodeRecord is r's stored value, without its tenant and key: they are
// its etcd key's (see decodeRecord).
func encodeRecord(r *machine.Record) ([]byte, error) {
	m, err := toCompact(r)
	if err == nil {
		// The record's write puts its index entries in the compact layout
		// (indexOps), whatever layout it was read in.
		m.Tenant, m.Key, m.IndexLayout = "", "", layoutCompact
		var b []byte
		if b, err = marshal.MarshalAppend([]byte{formatCompact}, m); err == nil {
			return b, nil
		}
	}
	return nil, fmt.Errorf("etcdstore: encode record: %w", err)
}

// decodeRecord decodes a record stored, in any format, under the etcd key
// of tenant and key (which a value in the current format does not hold),
// and materializes the token of a lease issued by this very version (stored
// as 0, with its slot) from its mod revision.
func decodeRecord(tenant, key string, b []byte, modRev int64) (*machine.Record, error) {
	return decodeRecordOf(tenant, key, b, modRev, false)
}

// decodeReplayRecord is decodeRecord without the record's history and
// submissions, which an answer to a replay does not carry: for a replay
// that missed the cache (replayRead), decoding them was a third of the
// record's decode and of the bytes it allocated (docs/PERFORMANCE.md,
// "Replays beyond the cache", "Fourth pass"). What it returns must not be
// cached as the record, nor decided on but by machine.ReplayFinal.
func decodeReplayRecord(tenant, key string, b []byte, modRev int64) (*machine.Record, error) {
	return decodeRecordOf(tenant, key, b, modRev, true)
}

func decodeRecordOf(tenant, key string, b []byte, modRev int64, replay bool) (*machine.Record, error) {
	var r *machine.Record
	var err error
	owned := false // whether b is this call's own, to change in place
	if len(b) > 0 && b[0] == formatCompressed {
		buf := plainBuffers.Get().(*[]byte)
		defer putPlainBuffer(buf)
		if *buf, err = decompressRecord(*buf, b); err != nil {
			return nil, fmt.Errorf("%w: record at revision %d: %v", errCorrupt, modRev, err)
		}
		b, owned = *buf, true
	}
	if len(b) > 0 && (b[0] == formatCompact || b[0] == formatCompact1) {
		body := b[1:]
		if replay {
			body = withoutHistory(body, owned)
		}
		var m storagepb.Record
		if err = proto.Unmarshal(body, &m); err == nil {
			if b[0] == formatCompact {
				m.Tenant, m.Key = tenant, key
			}
			r = fromCompact(&m)
		}
	} else if r, err = decodeJSONRecord(b); err == nil && replay {
		r.History, r.Submissions = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: record at revision %d: %v", errCorrupt, modRev, err)
	}
	r.Materialize(modRev)
	return r, nil
}

// asCommitted turns r, the record a write just committed at revision rev,
// into what a reader decodes from its value, without decoding it: a commit
// used to decode its own write, after the transaction and before the answer
// (a compressed final record costs the most, whose digests decoding also
// computes again; see docs/PERFORMANCE.md, "A commit no longer decodes its
// own write"). r must be the caller's own (a
// decision's Next, built from a Clone) and is changed in place. What the
// stored form changes, and only that: times come back in UTC, without a
// monotonic reading (UTC drops it); the index entries are in the layout
// this version writes; a lease issued by the write gets its token. Fields
// stored empty and read back nil (labels, a payload, external refs) may
// stay empty: nothing tells nil from empty. The store's tests compare it
// with decodeRecord on every commit they make (export_test.go).
func asCommitted(r *machine.Record, rev int64) *machine.Record {
	eachTime(r, func(t *time.Time) { *t = t.UTC() })
	r.IndexLayout = layoutCompact
	r.Materialize(rev)
	return r
}

// eachTime calls f with each time r holds: its own, its lease's and its
// history's.
func eachTime(r *machine.Record, f func(*time.Time)) {
	for _, t := range [...]*time.Time{&r.CreatedAt, &r.UpdatedAt, &r.CompletedAt, &r.RetainUntil} {
		f(t)
	}
	if r.Lease != nil {
		f(&r.Lease.AcquiredAt)
	}
	for i := range r.History {
		f(&r.History[i].Time)
	}
	eachSubmissionTime(r.Submissions, f)
}

// encodeTombstone is t's stored value in the format the previous version
// wrote, a key each, without its key (its etcd key's). This version packs
// tombstones instead (packed.go); the golden files pin this format, which
// decodeTombstone still reads.
func encodeTombstone(t *machine.Tombstone) ([]byte, error) {
	var c times
	m := &storagepb.Tombstone{State: int32(t.State), RemovedAt: c.epoch(t.RemovedAt)}
	m.Fingerprint, m.FingerprintText = hexBytes(t.Fingerprint)
	c.base = t.RemovedAt
	m.CompletedAt, m.Until = c.since(t.CompletedAt), c.since(t.Until)
	if c.err != nil {
		return nil, fmt.Errorf("etcdstore: encode tombstone: %w", c.err)
	}
	b, err := marshal.MarshalAppend([]byte{formatCompact}, m)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: encode tombstone: %w", err)
	}
	return b, nil
}

// decodeTombstone decodes the tombstone of key, in any format (the
// current one does not hold the key).
func decodeTombstone(key string, b []byte) (*machine.Tombstone, error) {
	if len(b) == 0 || (b[0] != formatCompact && b[0] != formatCompact1) {
		return decodeJSONTombstone(b)
	}
	var m storagepb.Tombstone
	if err := proto.Unmarshal(b[1:], &m); err != nil {
		return nil, err
	}
	if b[0] == formatCompact {
		m.Key = key
	}
	removed := fromEpoch(m.RemovedAt)
	return &machine.Tombstone{Key: m.Key, State: intent.State(m.State), Fingerprint: hexString(m.Fingerprint, m.FingerprintText),
		CompletedAt: after(removed, m.CompletedAt), RemovedAt: removed, Until: after(removed, m.Until)}, nil
}

// toCompact is a record's stored form.
func toCompact(r *machine.Record) (*storagepb.Record, error) {
	c := times{base: r.CreatedAt}
	m := &storagepb.Record{
		Tenant:        r.Tenant,
		Key:           r.Key,
		State:         int32(r.State),
		Params:        r.Params,
		ParamsVersion: r.ParamsVersion,
		Labels:        r.Labels,
		ParentKey:     r.ParentKey,
		Result:        toCompactResult(r.Result),
		Failure:       toCompactFailure(r.Failure),
		CreatedAt:     c.epoch(r.CreatedAt),
		UpdatedAt:     c.since(r.UpdatedAt),
		CompletedAt:   c.since(r.CompletedAt),
		Retention:     int64(r.Retention),
		RetainUntil:   c.since(r.RetainUntil),
		MaxAttempts:   int32(r.MaxAttempts),
		Attempts:      int32(r.Attempts),
		EndedToken:    uint64(r.EndedToken),
		Action:        r.Action,
		Identity:      r.Identity,
		Summary:       r.Summary,
	}
	if r.Fingerprint != "" && r.Fingerprint == intent.Fingerprint(r.Params) {
		m.FingerprintOfParams = true
	} else {
		m.Fingerprint, m.FingerprintText = hexBytes(r.Fingerprint)
	}
	if !r.RetainUntil.IsZero() && !r.CompletedAt.IsZero() && r.RetainUntil.Equal(r.CompletedAt.Add(r.Retention)) {
		m.RetainUntil, m.RetainFromCompletion = nil, true
	}
	resultDigest := ""
	if r.Result != nil && len(r.Result.Payload) > 0 {
		resultDigest = machine.PayloadDigest(r.Result.Payload)
	}
	l := r.Lease
	if l != nil {
		m.Lease = &storagepb.Lease{Token: uint64(l.Token), Slot: int32(l.Slot), Mode: int32(l.Mode), SessionRev: l.SessionRev,
			Worker: l.Worker, RequestId: l.RequestID, AcquiredAt: c.since(l.AcquiredAt)}
		m.Lease.Session, m.Lease.SessionText = sessionNumber(l.SessionID)
	}
	if len(r.History) > 0 {
		m.History = make([]*storagepb.Event, len(r.History))
	}
	for i := range r.History {
		e := &r.History[i]
		s := &storagepb.Event{Kind: int32(e.Kind), Accepted: e.Accepted, Failure: toCompactFailure(e.Failure),
			Reason: e.Reason, Principal: e.Principal, ResolvedState: int32(e.ResolvedState), Issued: e.Issued, Channel: e.Channel}
		byHolder := l != nil && e.Token == l.Token && e.SessionID == l.SessionID && e.Worker == l.Worker
		likeLease := byHolder && e.Time.Equal(l.AcquiredAt) && e.Mode == l.Mode
		switch {
		case likeLease && e.RequestID == l.RequestID:
			s.OfLease = true
		case likeLease:
			s.LikeLease, s.RequestId = true, e.RequestID
		case byHolder && e.Token != 0:
			s.ByHolder, s.Time, s.Mode, s.RequestId = true, c.since(e.Time), int32(e.Mode), e.RequestID
		default:
			s.Time, s.Token, s.Mode, s.Worker, s.RequestId = c.since(e.Time), uint64(e.Token), int32(e.Mode), e.Worker, e.RequestID
			s.Session, s.SessionText = sessionNumber(e.SessionID)
		}
		if res := e.Result; res != nil && len(res.Payload) == 0 && r.Result != nil && len(res.ExternalRefs) > 0 &&
			maps.Equal(res.ExternalRefs, r.Result.ExternalRefs) {
			s.RefsOfResult = true
		} else {
			s.Result = toCompactResult(res)
		}
		if resultDigest != "" && e.PayloadSHA256 == resultDigest {
			s.DigestOfResult = true
		} else {
			s.PayloadSha256, s.PayloadSha256Text = hexBytes(e.PayloadSHA256)
		}
		m.History[i] = s
	}
	m.Submissions = toCompactSubmissions(r.Submissions, &c)
	if c.err != nil {
		return nil, c.err
	}
	return m, nil
}

// fromCompact is the record a stored form holds.
func fromCompact(m *storagepb.Record) *machine.Record {
	created := fromEpoch(m.CreatedAt)
	r := &machine.Record{
		Tenant:        m.Tenant,
		Key:           m.Key,
		State:         intent.State(m.State),
		Params:        m.Params,
		ParamsVersion: m.ParamsVersion,
		Fingerprint:   hexString(m.Fingerprint, m.FingerprintText),
		Labels:        m.Labels,
		ParentKey:     m.ParentKey,
		Result:        fromCompactResult(m.Result),
		Failure:       fromCompactFailure(m.Failure),
		CreatedAt:     created,
		UpdatedAt:     after(created, m.UpdatedAt),
		CompletedAt:   after(created, m.CompletedAt),
		Retention:     time.Duration(m.Retention),
		RetainUntil:   after(created, m.RetainUntil),
		MaxAttempts:   int(m.MaxAttempts),
		Attempts:      int(m.Attempts),
		EndedToken:    fencing.Token(m.EndedToken),
		IndexLayout:   int(m.IndexLayout),
		Action:        m.Action,
		Identity:      m.Identity,
		Summary:       m.Summary,
	}
	if m.FingerprintOfParams {
		r.Fingerprint = intent.Fingerprint(r.Params)
	}
	if m.RetainFromCompletion && !r.CompletedAt.IsZero() {
		r.RetainUntil = r.CompletedAt.Add(r.Retention)
	}
	resultDigest := "" // computed for the first entry that shares it
	if l := m.Lease; l != nil {
		r.Lease = &machine.Lease{Token: fencing.Token(l.Token), Slot: int(l.Slot), Mode: intent.Mode(l.Mode), SessionID: sessionString(l.Session, l.SessionText),
			SessionRev: l.SessionRev, Worker: l.Worker, RequestID: l.RequestId, AcquiredAt: after(created, l.AcquiredAt)}
	}
	if len(m.History) > 0 {
		r.History = make([]intent.Event, len(m.History))
	}
	for i, s := range m.History {
		e := intent.Event{Kind: intent.EventKind(s.Kind), Accepted: s.Accepted, Result: fromCompactResult(s.Result),
			PayloadSHA256: hexString(s.PayloadSha256, s.PayloadSha256Text), Failure: fromCompactFailure(s.Failure),
			Reason: s.Reason, Principal: s.Principal, ResolvedState: intent.State(s.ResolvedState), Issued: s.Issued, Channel: s.Channel}
		switch l := r.Lease; {
		case s.OfLease && l != nil:
			e.Time, e.Token, e.Mode, e.SessionID, e.Worker, e.RequestID = l.AcquiredAt, l.Token, l.Mode, l.SessionID, l.Worker, l.RequestID
		case s.LikeLease && l != nil:
			e.Time, e.Token, e.Mode, e.SessionID, e.Worker, e.RequestID = l.AcquiredAt, l.Token, l.Mode, l.SessionID, l.Worker, s.RequestId
		case s.ByHolder && l != nil:
			e.Time, e.Token, e.Mode, e.SessionID, e.Worker, e.RequestID = after(created, s.Time), l.Token, intent.Mode(s.Mode), l.SessionID, l.Worker, s.RequestId
		default:
			e.Time, e.Token, e.Mode, e.Worker, e.RequestID = after(created, s.Time), fencing.Token(s.Token), intent.Mode(s.Mode), s.Worker, s.RequestId
			e.SessionID = sessionString(s.Session, s.SessionText)
		}
		if s.RefsOfResult && r.Result != nil {
			// Shared, as the completion that wrote it shared it (see
			// machine's digest).
			e.Result = &intent.Result{ExternalRefs: r.Result.ExternalRefs}
		}
		if s.DigestOfResult {
			if resultDigest == "" && r.Result != nil && len(r.Result.Payload) > 0 {
				resultDigest = machine.PayloadDigest(r.Result.Payload)
			}
			e.PayloadSHA256 = resultDigest
		}
		r.History[i] = e
	}
	r.Submissions = fromCompactSubmissions(m.Submissions, created)
	return r
}

func toCompactResult(r *intent.Result) *storagepb.Result {
	if r == nil {
		return nil
	}
	return &storagepb.Result{Payload: r.Payload, ExternalRefs: r.ExternalRefs}
}

func fromCompactResult(r *storagepb.Result) *intent.Result {
	if r == nil {
		return nil
	}
	return &intent.Result{Payload: r.Payload, ExternalRefs: r.ExternalRefs}
}

func toCompactFailure(f *intent.Failure) *storagepb.Failure {
	if f == nil {
		return nil
	}
	return &storagepb.Failure{Code: f.Code, Message: f.Message}
}

func fromCompactFailure(f *storagepb.Failure) *intent.Failure {
	if f == nil {
		return nil
	}
	return &intent.Failure{Code: f.Code, Message: f.Message}
}

// times spells a value's times: nanoseconds since the epoch (epoch), or
// since base (since); nil for the zero time. Nanoseconds since the epoch
// reach from 1678 to 2262: a time outside is an error, kept in err, rather
// than a wrong time on disk.
type times struct {
	base time.Time
	err  error
}

var errTimeRange = errors.New("a time outside the years 1678 to 2261")

func (c *times) epoch(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	if y := t.Year(); y < 1678 || y > 2261 {
		c.err = fmt.Errorf("%w: %v", errTimeRange, t)
		return nil
	}
	n := t.UnixNano()
	return &n
}

func (c *times) since(t time.Time) *int64 {
	p := c.epoch(t)
	if p != nil && !c.base.IsZero() {
		*p -= c.base.UnixNano()
	}
	return p
}

func fromEpoch(n *int64) time.Time {
	if n == nil {
		return time.Time{}
	}
	return time.Unix(0, *n).UTC()
}

// after is the time d nanoseconds after base (after the epoch when base
// is zero); the zero time when d is nil.
func after(base time.Time, d *int64) time.Time {
	if d == nil {
		return time.Time{}
	}
	if base.IsZero() {
		return fromEpoch(d)
	}
	return base.Add(time.Duration(*d))
}

// hexBytes is s as bytes when s is lowercase hex (a SHA-256 digest, as
// fingerprints and payload digests are), else s as text.
func hexBytes(s string) ([]byte, string) {
	if s == "" || len(s)%2 != 0 {
		return nil, s
	}
	b, err := hex.DecodeString(s)
	if err != nil || hex.EncodeToString(b) != s {
		return nil, s
	}
	return b, ""
}

func hexString(b []byte, text string) string {
	if len(b) > 0 {
		return hex.EncodeToString(b)
	}
	return text
}

// sessionNumber is a session id as the number it spells (sessionID's hex
// of an etcd lease id), else as text.
func sessionNumber(id string) (uint64, string) {
	if n, err := strconv.ParseUint(id, 16, 64); err == nil && n != 0 && strconv.FormatUint(n, 16) == id {
		return n, ""
	}
	return 0, id
}

func sessionString(n uint64, text string) string {
	if n != 0 {
		return strconv.FormatUint(n, 16)
	}
	return text
}
