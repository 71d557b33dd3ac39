package etcdstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// Page sizes of List.
const (
	DefaultPageSize = 50
	MaxPageSize     = 100
	// scanBudget bounds how many index entries one page may examine when a
	// filter is not served by the index it scans (a state filter on a label
	// listing); a page may then come back short, with a next page token.
	scanBudget = 10 * MaxPageSize
)

// pageToken continues a listing: every page reads revision Rev, after the
// index position After (see position: bytes, so JSON carries them in
// base64). Tokens of earlier versions held the position in the decimal
// layout, as text, in Decimal; they continue as before.
type pageToken struct {
	Rev     int64  `json:"r"`
	After   []byte `json:"p,omitempty"`
	Decimal string `json:"a,omitempty"`
}

// decodePageToken is the revision and position a token continues from.
func decodePageToken(s string) (rev int64, after string, err error) {
	if s == "" {
		return 0, "", nil
	}
	var t pageToken
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	after = string(t.After)
	if err == nil && t.Decimal != "" {
		var e scanned
		var ok bool
		if e, ok = scannedEntry(indexRange{layout: layoutDecimal}, t.Decimal, nil); !ok {
			err = errors.New("not a position")
		}
		after = e.order
	}
	if err != nil || t.Rev <= 0 || (after != "" && len(after) < 8) { // a position is 8 bytes and a key
		return 0, "", intent.Invalid("page_token", "not a token this server issued")
	}
	return t.Rev, after, nil
}

func (t pageToken) String() string {
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

var allStates = []intent.State{
	intent.StatePending, intent.StateInProgress, intent.StateUnknown, intent.StateCompleted,
	intent.StateFailed, intent.StateNeedsReview, intent.StateCancelled,
}

// matches reports whether a record passes a filter.
func matches(r *machine.Record, f *intent.Filter) bool {
	if len(f.States) > 0 && !slices.Contains(f.States, r.State) {
		return false
	}
	if f.Label != nil && r.Labels[f.Label.Name] != f.Label.Value {
		return false
	}
	return f.ParentKey == "" || r.ParentKey == f.ParentKey
}

// scanned is an index entry: its position (see position) and the intent
// it names.
type scanned struct {
	order string
	key   string
	// archived is set for a record the archive holds (List merges them
	// in, archive.go): it is not read from etcd.
	archived bool
}

// List returns one page of a tenant's intents matching the filter, oldest
// registration first. It reads one index — the label's, the parent's, or
// the states' — from just after the previous page, so its cost follows the
// page, not the number of stored intents. Every page of a listing reads the
// revision of its first page: pages are stable and complete whatever
// changes meanwhile. A token whose revision etcd compacted away is a
// *intent.CompactedError: list again from the first page.
func (s *Store) List(ctx context.Context, q intent.ListQuery) (*intent.Page, error) {
	size := q.PageSize
	switch {
	case size == 0:
		size = DefaultPageSize
	case size < 0 || size > MaxPageSize:
		return nil, intent.Invalid("page_size", "%d is outside [1, %d]", size, MaxPageSize)
	}
	rev, after, err := decodePageToken(q.PageToken)
	if err != nil {
		return nil, err
	}
	// Each index in both layouts (see keys.go): a record's entries are
	// in one of them, and both sort by position.
	var ranges []indexRange
	switch {
	case q.Label != nil:
		ranges = inBothLayouts(func(l int) string { return s.keys.labelIndexIn(l, q.Tenant, *q.Label) })
	case q.ParentKey != "":
		ranges = inBothLayouts(func(l int) string { return s.keys.parentIndexIn(l, q.Tenant, q.ParentKey) })
	default:
		states := q.States
		if len(states) == 0 {
			states = allStates
		}
		for _, st := range states {
			for _, r := range inBothLayouts(func(l int) string { return s.keys.stateIndexIn(l, q.Tenant, st) }) {
				if !slices.Contains(ranges, r) {
					ranges = append(ranges, r)
				}
			}
		}
	}

	page := &intent.Page{}
	examined, exhausted := 0, false
	for len(page.Intents) < size && examined < scanBudget && !exhausted {
		var cands []scanned
		var err error
		cands, rev, exhausted, err = s.scanIndex(ctx, ranges, after, rev, size)
		if err != nil {
			return nil, err
		}
		var moved []*cached
		if s.archive.on() {
			// The archive's next records too, merged by position: one
			// cursor across both tiers (archive.go).
			var done bool
			if cands, moved, done, err = s.mergeArchived(ctx, q, cands, after, size); err != nil {
				return nil, err
			}
			exhausted = exhausted && done
			if len(cands) == 0 && !exhausted {
				break // nothing to consume: a short page, and a token
			}
		}
		recs, err := s.readRecords(ctx, q.Tenant, cands, rev)
		if err != nil {
			return nil, err
		}
		for i, m := range moved {
			if m != nil {
				recs[i] = m
			}
		}
		for i, c := range cands {
			if len(page.Intents) == size {
				exhausted = false
				break
			}
			after = c.order
			examined++
			if r := recs[i]; r != nil && matches(r.rec, &q.Filter) {
				page.Intents = append(page.Intents, r.rec.ToIntent(r.rev, machine.HolderLive))
			}
		}
	}
	if err := s.settleLiveness(ctx, q.Tenant, page.Intents, rev); err != nil {
		return nil, err
	}
	page.Revision = rev
	if !exhausted {
		page.NextPageToken = pageToken{Rev: rev, After: []byte(after)}.String()
	}
	return page, nil
}

// scanIndex reads up to limit entries of each range past position after
// (from the start when empty), every range in one transaction (one round
// trip, one revision: rev, 0 for now), and returns the first limit of
// them merged by position, the revision read, and whether every range was
// read to its end. Each range gave at most limit entries: the first limit
// of the merge are the next ones in order, whatever lies beyond.
func (s *Store) scanIndex(ctx context.Context, ranges []indexRange, after string, rev int64, limit int) ([]scanned, int64, bool, error) {
	reads := make([]clientv3.Op, len(ranges))
	for i, r := range ranges {
		start := r.prefix
		if after != "" {
			start = r.prefix + positionIn(r.layout, after) + "\x00"
		}
		opts := []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(r.prefix)), clientv3.WithLimit(int64(limit))}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		reads[i] = clientv3.OpGet(start, opts...)
	}
	resp, err := s.readTxn(ctx, rev, reads)
	if err != nil {
		return nil, rev, false, err
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	var entries []scanned
	exhausted := true
	for i, r := range ranges {
		rr := resp.Responses[i].GetResponseRange()
		exhausted = exhausted && !rr.More
		for _, kv := range rr.Kvs {
			if e, ok := scannedEntry(r, string(kv.Key[len(r.prefix):]), kv.Value); ok {
				entries = append(entries, e)
			}
		}
	}
	slices.SortFunc(entries, func(a, b scanned) int { return cmp.Compare(a.order, b.order) })
	if len(entries) > limit {
		entries, exhausted = entries[:limit], false
	}
	return entries, rev, exhausted, nil
}

// get is a range read at rev (0: now), with compaction made plain.
func (s *Store) get(ctx context.Context, key string, rev int64, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.kv.Get(ctx, key, opts...)
	if err != nil {
		return nil, readErr(err, rev)
	}
	return resp, nil
}

// readTxn runs reads (at rev, 0: now) in one transaction, with compaction
// made plain.
func (s *Store) readTxn(ctx context.Context, rev int64, reads []clientv3.Op) (*clientv3.TxnResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.kv.Txn(rctx).Then(reads...).Commit()
	if err != nil {
		return nil, readErr(err, rev)
	}
	return resp, nil
}

// readRecords reads the records an index scan named, at rev, in one
// transaction; an entry whose record is gone is nil.
func (s *Store) readRecords(ctx context.Context, tenant string, cands []scanned, rev int64) ([]*cached, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	ops := make([]clientv3.Op, len(cands))
	for i, c := range cands {
		ops[i] = clientv3.OpGet(s.keys.intent(tenant, c.key), clientv3.WithRev(rev), clientv3.WithCountOnly())
		if !c.archived {
			ops[i] = clientv3.OpGet(s.keys.intent(tenant, c.key), clientv3.WithRev(rev))
		}
	}
	resp, err := s.readTxn(ctx, rev, ops)
	if err != nil {
		return nil, err
	}
	out := make([]*cached, len(cands))
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		rec, err := decodeRecord(tenant, cands[i].key, kvs[0].Value, kvs[0].ModRevision)
		if err != nil {
			return nil, err
		}
		out[i] = &cached{rec: rec, rev: kvs[0].ModRevision}
	}
	return out, nil
}

// settleLiveness reads, at rev, the sessions holding the listed IN_PROGRESS
// intents, and reports those whose holder lapsed as UNKNOWN, as Get does.
func (s *Store) settleLiveness(ctx context.Context, tenant string, ins []*intent.Intent, rev int64) error {
	var held []*intent.Intent
	var ops []clientv3.Op
	for _, in := range ins {
		if in.State == intent.StateInProgress && in.Lease != nil && in.Lease.SessionID != "" {
			held = append(held, in)
			ops = append(ops, clientv3.OpGet(s.keys.session(tenant, in.Lease.SessionID), clientv3.WithRev(rev), clientv3.WithCountOnly()))
		}
	}
	if len(ops) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.kv.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		return readErr(err, rev)
	}
	for i, r := range resp.Responses {
		if r.GetResponseRange().Count == 0 {
			held[i].State, held[i].Lease.Live = intent.StateUnknown, false
		}
	}
	return nil
}

// watchStreamKey is the metadata that gives each watch its own stream.
const watchStreamKey = "intentd-watch"

// Watch streams changes to one intent (q.Key) or to a tenant's intents
// matching q's filter, from q.StartRevision (0: from now), calling send for
// each until ctx ends, send fails, or the watch breaks. With
// q.NotifyCreated the first event says the watch is established (Created),
// before any change. A start revision
// etcd compacted away is a *intent.CompactedError, never a silent gap. The
// watch requires an etcd leader, so a partitioned member cannot leave it
// hanging. An IN_PROGRESS intent whose holder lapsed shows as UNKNOWN once
// the janitor sweeps it.
func (s *Store) Watch(ctx context.Context, q intent.WatchQuery, send func(intent.WatchEvent) error) error {
	records := s.keys.intents(q.Tenant)
	key := records
	opts := []clientv3.OpOption{clientv3.WithPrevKV()}
	filter := q.Filter
	if q.Key != "" {
		key += q.Key
		filter = intent.Filter{}
	} else {
		opts = append(opts, clientv3.WithPrefix())
	}
	if q.StartRevision > 0 {
		opts = append(opts, clientv3.WithRev(q.StartRevision))
	}
	// The created notification carries etcd's revision at once, so that a
	// watch on an etcd whose revision went back is refused before it waits
	// for events (a watch from a future revision would just wait).
	opts = append(opts, clientv3.WithCreatedNotify())
	before, err := s.floor.admit()
	if err != nil {
		return err
	}
	// Each watch goes on a gRPC stream of its own. The etcd client puts
	// every watch whose context carries the same metadata on one shared
	// stream, which stays on the member it was opened on: when that member
	// stalls, the steering sends new calls elsewhere, but the shared stream,
	// and every watch added to it, would hang until gRPC's keepalive gives
	// up on the connection (10 s and more), and a worker waiting for
	// another's lease would wait out its whole wait. A stream of its own is
	// opened on a member the client uses now, and closes with the watch.
	wctx := metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), watchStreamKey, strconv.FormatUint(s.watches.Add(1), 10))
	wctx, cancel := context.WithCancel(wctx)
	defer cancel()
	for resp := range s.watcher.Watch(wctx, key, opts...) {
		if resp.CompactRevision != 0 {
			return &intent.CompactedError{Requested: q.StartRevision, Compacted: resp.CompactRevision}
		}
		if err := resp.Err(); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return unavailable(err)
		}
		// One watch stream's headers only grow, except when the client
		// resumes it on another member: hold each to the floor at the
		// start and to the stream's own highest, and confirm a lower one.
		if err := s.confirmFloor(ctx, before, resp.Header); err != nil {
			return err
		}
		before = max(before, resp.Header.GetRevision())
		if resp.Created && q.NotifyCreated {
			if err := send(intent.WatchEvent{Created: true, Revision: watchedAfter(q.StartRevision, resp.Header.GetRevision())}); err != nil {
				return err
			}
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE && s.archive.on() {
				// With an archive, a record leaves etcd only by its move
				// to the archive (archiver.go), which is no transition:
				// watchers see nothing of it.
				continue
			}
			e, ok, err := watchEvent(q.Tenant, string(ev.Kv.Key[len(records):]), ev, &filter)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if err := send(e); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return unavailable(errors.New("etcd closed the watch"))
}

// watchedAfter is the revision a watch reports the changes after, as its
// created notification says: start-1 for a watch from start, and etcd's
// revision at creation for a watch from now (etcd starts such a watch at
// its revision + 1, read before the watch was registered, so a change that
// committed meanwhile may still follow with a revision at or below).
func watchedAfter(start, created int64) int64 {
	if start > 0 {
		return start - 1
	}
	return created
}

// watchEvent turns an etcd event on the record of tenant's intent key into
// a WatchEvent, if it passes the filter.
func watchEvent(tenant, key string, ev *clientv3.Event, f *intent.Filter) (intent.WatchEvent, bool, error) {
	if ev.Type == mvccpb.DELETE {
		if ev.PrevKv == nil {
			return intent.WatchEvent{}, false, nil
		}
		prev, err := decodeRecord(tenant, key, ev.PrevKv.Value, ev.PrevKv.ModRevision)
		if err != nil || !matches(prev, f) {
			return intent.WatchEvent{}, false, err
		}
		return intent.WatchEvent{Deleted: true, Revision: ev.Kv.ModRevision, Intent: &intent.Intent{
			Tenant: prev.Tenant, Key: prev.Key, State: prev.State, Fingerprint: prev.Fingerprint, CompletedAt: prev.CompletedAt,
		}}, true, nil
	}
	rec, err := decodeRecord(tenant, key, ev.Kv.Value, ev.Kv.ModRevision)
	if err != nil || !matches(rec, f) {
		return intent.WatchEvent{}, false, err
	}
	return intent.WatchEvent{Revision: ev.Kv.ModRevision, Intent: rec.ToIntent(ev.Kv.ModRevision, machine.HolderLive)}, true, nil
}

// Depths is how many intents wait in the review queue, by state, and how
// many worker sessions are open, across every tenant of the installation.
type Depths struct {
	Unknown, NeedsReview, Sessions int64
	// Final is the final records etcd holds (their retention index, both
	// layouts): with an archive, those not moved yet.
	Final int64
}

// Depths counts the review queue, the open sessions and the final records
// with count-only ranges in one linearizable read: etcd counts index keys
// without sending them, so the cost follows the counts, not the store.
// Records that entered UNKNOWN or NEEDS_REVIEW before the store kept the
// cross-tenant queue index are counted once they change state again; an
// IN_PROGRESS intent whose holder lapsed counts as UNKNOWN once an Acquire
// or the janitor records the lapse.
func (s *Store) Depths(ctx context.Context) (Depths, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	count := func(prefix string) clientv3.Op {
		return clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	}
	resp, err := s.kv.Txn(ctx).Then(
		count(s.keys.reviewQueue(intent.StateUnknown)),
		count(s.keys.reviewQueue(intent.StateNeedsReview)),
		count(s.keys.openSessions()),
		count(s.keys.retentionsIn(layoutCompact)),
		count(s.keys.retentionsIn(layoutDecimal)),
	).Commit()
	if err != nil {
		return Depths{}, unavailable(err)
	}
	n := func(i int) int64 { return resp.Responses[i].GetResponseRange().Count }
	return Depths{Unknown: n(0), NeedsReview: n(1), Sessions: n(2), Final: n(3) + n(4)}, nil
}
