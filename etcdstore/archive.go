package etcdstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// Archive is the cold tier of final intents (issue 26): what the store
// calls of it. Package archive implements it on PostgreSQL; its types
// convert to these one for one (archive.Record(r), ArchivedRecord(r)), and
// etcdstore does not import it, so that a program without an archive does
// not link PostgreSQL's driver. The store never decides anything on what
// the archive does not hold, and every failed call is answered as
// intent.ErrArchiveUnavailable.
type Archive interface {
	// Put stores records, each keyed by tenant and key: an idempotent
	// upsert (a record put twice is one record).
	Put(ctx context.Context, recs []ArchivedRecord) error
	// Get is the record of tenant's key, if the archive holds it.
	Get(ctx context.Context, tenant, key string) (ArchivedRecord, bool, error)
	// Tombstone is the tombstone of tenant's key, if the archive holds
	// one (a record it kept past its retention).
	Tombstone(ctx context.Context, tenant, key string) (tombstones.Entry, bool, error)
	// PutTombstones stores tombstones, idempotently.
	PutTombstones(ctx context.Context, entries []tombstones.Entry) error
	// List is the records of one tenant matching q, in (RegisteredAt, Key)
	// order, after q.After, at most q.Limit of them.
	List(ctx context.Context, q ArchiveQuery) ([]ArchivedRecord, error)
	// Hashes calls fn with the hash (tombstones.HashOf) of every key the
	// archive holds a record or a tombstone of, until fn's first error:
	// what the filter of archived keys loads (archivefilter.go).
	Hashes(ctx context.Context, fn func(tombstones.Hash) error) error
}

// ArchivedRecord is a final intent as the archive keeps it: the columns it
// is found by, and Data, the record's etcd value as it was, byte for byte,
// with Revision, the mod revision it had in etcd. Decoded together they are
// the record etcd held (decodeRecord), so that every answer about it is the
// same before and after its move.
type ArchivedRecord struct {
	Tenant, Key string
	State       intent.State
	Fingerprint string
	Parent      string
	Labels      []intent.Label
	// RegisteredAt orders listings, to the nanosecond, as etcd's indexes.
	RegisteredAt time.Time
	CompletedAt  time.Time
	RetainUntil  time.Time
	Revision     int64
	Data         []byte
}

// ArchiveQuery selects one tenant's archived records: by State, Label and
// Parent when set, after the position After (nil: from the first), at
// most Limit.
type ArchiveQuery struct {
	Tenant string
	State  *intent.State
	Label  *intent.Label
	Parent string
	After  *ArchiveCursor
	Limit  int
}

// ArchiveCursor is a position in an archive listing: registration time,
// then key.
type ArchiveCursor struct {
	RegisteredAt time.Time
	Key          string
}

// archiveTier is what the store keeps of its archive: the archive (nil:
// none) and what it counted.
type archiveTier struct {
	a     Archive
	after time.Duration
	// moved counts records moved to the archive; reads, readErrors and
	// readNanos the archive's lookups and listings, failed ones by kind.
	moved, reads, unavailable, corrupt, readNanos atomic.Int64
	// oldest is the completion time (Unix ns) of the oldest final record
	// etcd held at the archiver's last pass, 0 for none.
	oldest atomic.Int64
	// backfill is the backfill's cursor over the retention index: done
	// once it went through (see archiver.go).
	backfill backfillCursor
	// marked is set once this store saw the cluster marked as using an
	// archive (archivegate.go).
	marked atomic.Bool
	// filter tells keys never archived without asking the archive
	// (archivefilter.go).
	filter archiveFilter
}

// on reports whether the store has an archive.
func (t *archiveTier) on() bool { return t.a != nil }

// archiveUnavailable is the error of a call that had to ask the archive
// and could not: both intent.ErrArchiveUnavailable and
// intent.ErrUnavailable.
func archiveUnavailable(err error) error {
	return fmt.Errorf("%w: %w: %v", intent.ErrArchiveUnavailable, intent.ErrUnavailable, err)
}

// observe counts one archive call that took d and failed with err (nil:
// none), and returns the error to answer.
func (t *archiveTier) observe(d time.Duration, err error) error {
	t.reads.Add(1)
	t.readNanos.Add(int64(d))
	if err != nil {
		t.unavailable.Add(1)
		return archiveUnavailable(err)
	}
	return nil
}

// archiveLookup asks the archive about tenant's key, which etcd does not
// hold: its record (with the revision it had in etcd), or its tombstone,
// or neither. Both are asked at once: a key etcd does not hold is most
// often a new one, of neither, which needs both answers.
func (s *Store) archiveLookup(ctx context.Context, tenant, key string) (*machine.Record, int64, *machine.Tombstone, error) {
	memo, _ := ctx.Value(archiveMemoKey{}).(*archiveMemo)
	if f, ok := memo.get(tenant, key); ok {
		return f.rec, f.rev, f.tomb, nil
	}
	rec, rev, tomb, err := s.askArchive(ctx, tenant, key)
	if err == nil && (rec != nil || tomb != nil) {
		memo.put(tenant, key, archiveFound{rec, rev, tomb})
	}
	return rec, rev, tomb, err
}

// archiveMemoKey carries, in an operation's context (archiveScope), what
// the archive answered about keys it holds.
type archiveMemoKey struct{}

// archiveMemo keeps, for one operation, the keys the archive was found
// to hold (by [2]string{tenant, key}), so that a second lookup of one of
// them (Acquire asks before its optimistic write, then again after the
// read that follows when the key was archived) does not read PostgreSQL
// again. Only what was found: an archived record is final and never
// written again, and a tombstone ends a key for good; "holds nothing" is
// never reused, since a lookup must follow the etcd read it completes (a
// move in between).
type archiveMemo struct{ found sync.Map }

// archiveFound is one key's answer.
type archiveFound struct {
	rec  *machine.Record
	rev  int64
	tomb *machine.Tombstone
}

func (m *archiveMemo) get(tenant, key string) (archiveFound, bool) {
	if m == nil {
		return archiveFound{}, false
	}
	f, ok := m.found.Load([2]string{tenant, key})
	if !ok {
		return archiveFound{}, false
	}
	return f.(archiveFound), true
}

func (m *archiveMemo) put(tenant, key string, f archiveFound) {
	if m != nil {
		m.found.Store([2]string{tenant, key}, f)
	}
}

// askArchive is archiveLookup's reads of the archive.
func (s *Store) askArchive(ctx context.Context, tenant, key string) (*machine.Record, int64, *machine.Tombstone, error) {
	t := &s.archive
	actx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	type tombAnswer struct {
		e   tombstones.Entry
		ok  bool
		err error
	}
	tc := make(chan tombAnswer, 1)
	go func() {
		start := time.Now()
		e, ok, err := t.a.Tombstone(actx, tenant, key)
		tc <- tombAnswer{e, ok, t.observe(time.Since(start), err)}
	}()
	start := time.Now()
	r, ok, err := t.a.Get(actx, tenant, key)
	err = t.observe(time.Since(start), err)
	ta := <-tc
	if err != nil {
		return nil, 0, nil, err
	}
	if ok {
		rec, err := decodeRecord(tenant, key, r.Data, r.Revision)
		if err != nil {
			t.corrupt.Add(1)
			return nil, 0, nil, fmt.Errorf("%w: archived record of %q: %v", errCorrupt, key, err)
		}
		return rec, r.Revision, nil, nil
	}
	if ta.err != nil || !ta.ok {
		if ta.err == nil && archiveLookupHook != nil {
			archiveLookupHook(tenant, key)
		}
		return nil, 0, nil, ta.err
	}
	e := ta.e
	if e.UntilDay <= tombstones.Today(s.cfg.Now()) {
		// Past its retention: the archive drops it with its month, and
		// until then it answers as a dropped one does, nothing (as a
		// packed chunk's expired entry does).
		return nil, 0, nil, nil
	}
	return nil, 0, &machine.Tombstone{Key: key, State: e.State, CompletedAt: e.CompletedAt(), Until: e.Until()}, nil
}

// archiveLookupHook, set by tests, runs when the archive was asked about
// a key and holds nothing of it, before the lookup returns.
var archiveLookupHook func(tenant, key string)

// archivedMark is the entry of View.Spots (opaque to the diagram) that
// marks a view whose record came from the archive.
const archivedMark = "\x00archived"

// fromArchive completes a view of an intent etcd does not hold with what
// the archive holds of it. A record found there is marked (archivedMark):
// it is final and is never written again (frozen).
func (s *Store) fromArchive(ctx context.Context, tenant, key string, v *machine.View) error {
	rec, rev, tomb, err := s.archiveLookup(ctx, tenant, key)
	if err != nil {
		if errors.Is(err, intent.ErrArchiveUnavailable) {
			if stop, ok := ctx.Value(archiveScopeKey{}).(context.CancelCauseFunc); ok {
				stop(err) // the operation ends at once: see archiveScope
			}
		}
		return err
	}
	switch {
	case rec != nil:
		v.Rec, v.Rev = rec, rev
		v.Spots[archivedMark] = machine.TombstoneSpot{}
		s.remember(tenant, key, rec, rev)
	case tomb != nil:
		v.Tomb = tomb
	}
	return nil
}

// othersFromArchive completes v's other intents (a Complete's children)
// that etcd holds nothing of with what the archive holds of them, after
// the read of v (the argument of fromArchive; a child's creation is
// guarded by its chunk as any other). Not for a registration's parent: an
// archived parent cannot satisfy the guard that it exists in etcd, so a
// child registered under an archived parent is refused as without one.
func (s *Store) othersFromArchive(ctx context.Context, tenant string, v *machine.View, keys []string) error {
	if !s.archive.on() {
		return nil
	}
	for _, k := range keys {
		o := v.Others[k]
		if o.Rec != nil || o.Tomb != nil {
			continue
		}
		rec, _, tomb, err := s.archiveLookup(ctx, tenant, k)
		if err != nil {
			if stop, ok := ctx.Value(archiveScopeKey{}).(context.CancelCauseFunc); ok && errors.Is(err, intent.ErrArchiveUnavailable) {
				stop(err)
			}
			return err
		}
		o.Rec, o.Tomb = rec, tomb
		v.Others[k] = o
	}
	return nil
}

// archived reports whether v's record came from the archive.
func archived(v *machine.View) bool {
	_, ok := v.Spots[archivedMark]
	return ok
}

// frozen is decide for a call that may find its record in the archive: an
// archived record is final and never written again, so a decision to write
// it (evidence of a late report) answers without the write.
func frozen(decide decideFunc) decideFunc {
	return func(v *machine.View) machine.Decision {
		d := decide(v)
		if !archived(v) || (!d.Writes() && len(d.Create) == 0) {
			return d
		}
		if d.Err != nil {
			return machine.Decision{Err: d.Err}
		}
		return machine.Decision{Err: &intent.TransitionError{Key: v.Key, State: v.Rec.State, Call: "write", Intent: v.Rec.ToIntent(v.Rev, machine.HolderGone)}}
	}
}

// archivable prepares a transition that may find its record in the
// archive: its decision never writes an archived record (frozen), and an
// archive that cannot be asked ends it at once (archiveScope).
func (s *Store) archivable(ctx context.Context, decide decideFunc) (context.Context, decideFunc, func(error) error) {
	if s.archive.on() {
		decide = frozen(decide)
	}
	ctx, done := s.archiveScope(ctx)
	return ctx, decide, done
}

// archiveScopeKey carries, in an operation's context, the function that
// ends it when the archive cannot be asked.
type archiveScopeKey struct{}

// archiveScope prepares an operation that may ask the archive, with a
// memo of the keys it found there (archiveMemo). The write
// loop retries a failed read until the operation's timeout, which is right
// for etcd (a leader change passes) but not for an archive that is down
// (each retry would wait for it again). A failed archive lookup ends the
// operation at once (fromArchive cancels its context with the error as
// cause), and done answers that error instead of the cancellation.
func (s *Store) archiveScope(ctx context.Context) (context.Context, func(error) error) {
	if !s.archive.on() {
		return ctx, func(err error) error { return err }
	}
	ctx, stop := context.WithCancelCause(ctx)
	ctx = context.WithValue(ctx, archiveScopeKey{}, stop)
	ctx = context.WithValue(ctx, archiveMemoKey{}, &archiveMemo{})
	return ctx, func(err error) error {
		defer stop(nil)
		if err != nil {
			if cause := context.Cause(ctx); errors.Is(cause, intent.ErrArchiveUnavailable) {
				return cause
			}
		}
		return err
	}
}

// ArchiveStats is what the store counted of its archive, for metrics.
type ArchiveStats struct {
	// Enabled is whether the store has an archive; the rest is zero
	// without one.
	Enabled bool
	// Moved counts final records this store moved to the archive.
	Moved int64
	// Reads counts the store's calls that read the archive (a lookup of a
	// key etcd does not hold, a listing's page), ReadTime their total
	// time; Unavailable those that failed (the archive unreachable or
	// slow), Corrupt the records found that did not decode.
	Reads       int64
	ReadTime    time.Duration
	Unavailable int64
	Corrupt     int64
	// OldestFinal is the age of the oldest final record etcd held at the
	// archiver's last pass (zero: none); Lag how far that is past
	// Config.ArchiveAfter (zero: none overdue): it grows while the
	// archive is down or the archiver behind.
	OldestFinal, Lag time.Duration
	// Backfilled is whether this store's archiver went once through
	// every final record of the retention index (records finalized
	// without the archive's index: before it was turned on, or by a
	// replica without it) since it was last elected.
	Backfilled bool
	// FilterReady is whether this replica's filter of archived keys
	// (RunArchiveFilter) is loaded and following the moves; FilterKeys
	// the keys it holds, FilterBytes its memory. FilterRuledOut counts the
	// lookups it answered without the archive, FilterPassed those it sent
	// to the archive while ready (archived keys and its false positives).
	FilterReady                  bool
	FilterKeys, FilterBytes      int64
	FilterRuledOut, FilterPassed int64
}

// ArchiveStats returns what the store counted of its archive.
func (s *Store) ArchiveStats() ArchiveStats {
	t := &s.archive
	if !t.on() {
		return ArchiveStats{}
	}
	out := ArchiveStats{Enabled: true, Moved: t.moved.Load(), Reads: t.reads.Load(), ReadTime: time.Duration(t.readNanos.Load()),
		Unavailable: t.unavailable.Load(), Corrupt: t.corrupt.Load(), Backfilled: t.backfill.isDone(),
		FilterReady: t.filter.ready.Load(), FilterKeys: t.filter.size(), FilterBytes: t.filter.bytes(),
		FilterRuledOut: t.filter.ruledOut.Load(), FilterPassed: t.filter.passed.Load()}
	if o := t.oldest.Load(); o != 0 {
		out.OldestFinal = max(0, s.cfg.Now().Sub(time.Unix(0, o)))
		out.Lag = max(0, out.OldestFinal-t.after)
	}
	return out
}

// archiveHolds reports whether the archive holds tenant's key, a record or
// a tombstone (false without an archive), for a caller that certified the
// key's chunk at mod revision chunkRev: the filter of archived keys
// answers when it can.
func (s *Store) archiveHolds(ctx context.Context, tenant, key string, chunkRev int64) (bool, error) {
	if !s.archive.on() || s.archive.filter.rulesOut(tombstones.HashOf(tenant, key), chunkRev) {
		return false, nil
	}
	rec, _, tomb, err := s.archiveLookup(ctx, tenant, key)
	return rec != nil || tomb != nil, err
}

// mayHaveArchivedChildren reports whether an intent registered at created
// may have children in the archive. A child is registered after its parent
// and moved ArchiveAfter after it became final, so a parent younger than
// that has none there, and a Get of a young intent (most live ones) does
// not ask the archive, nor need it. Half of ArchiveAfter is the bound:
// the rest is room for replicas' clocks to differ.
func (s *Store) mayHaveArchivedChildren(created time.Time) bool {
	return !s.cfg.Now().Before(created.Add(s.archive.after / 2))
}

// archivedChild is a child of an intent with its position (registration
// time, key), for merging children of both tiers.
type archivedChild struct {
	order string
	child intent.Child
}

// archivedChildren lists the first maxChildren children of tenant's key
// that the archive holds.
func (s *Store) archivedChildren(ctx context.Context, tenant, parent string) ([]archivedChild, error) {
	recs, err := s.archiveList(ctx, ArchiveQuery{Tenant: tenant, Parent: parent, Limit: maxChildren})
	if err != nil {
		return nil, err
	}
	out := make([]archivedChild, len(recs))
	for i, r := range recs {
		out[i] = archivedChild{order: position(r.RegisteredAt, r.Key), child: intent.Child{Key: r.Key, State: r.State}}
	}
	return out, nil
}

// mergeChildren merges two lists of children, each in order, into the
// first limit of both in order, a key once (a child moved between the two
// reads is in both).
func mergeChildren(a, b []archivedChild, limit int) []intent.Child {
	all := append(a, b...)
	slices.SortStableFunc(all, func(x, y archivedChild) int { return cmp.Compare(x.order, y.order) })
	seen := make(map[string]bool, len(all))
	var out []intent.Child
	for _, c := range all {
		if len(out) == limit {
			break
		}
		if !seen[c.child.Key] {
			seen[c.child.Key] = true
			out = append(out, c.child)
		}
	}
	return out
}

// archiveList is one archive listing, counted.
func (s *Store) archiveList(ctx context.Context, q ArchiveQuery) ([]ArchivedRecord, error) {
	actx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	recs, err := s.archive.a.List(actx, q)
	if err := s.archive.observe(time.Since(start), err); err != nil {
		return nil, err
	}
	return recs, nil
}

// archiveSlack is how many records an archive listing asks for beyond a
// page: a listing asks from the nanosecond before its position (the
// archive's cursor is a time and a key, a position a time and a key
// compared as bytes) and drops what is not past it.
const archiveSlack = 16

// mergeArchived merges into cands, the next entries of a listing's etcd
// index after position after (in order), the archive's next records of the
// listing, and returns the first limit of both in order, a key once, with
// the archived records (nil for an entry read from etcd) and whether the
// archive had no more. A record moved between the etcd read (at the
// listing's revision) and the archive's is in both, as the same bytes.
func (s *Store) mergeArchived(ctx context.Context, q intent.ListQuery, cands []scanned, after string, limit int) ([]scanned, []*cached, bool, error) {
	aq, ok := archiveQueryOf(q)
	if !ok {
		return cands, make([]*cached, len(cands)), true, nil
	}
	if after != "" {
		ns := int64(binary.BigEndian.Uint64([]byte(after[:8])) ^ (1 << 63))
		aq.After = &ArchiveCursor{RegisteredAt: time.Unix(0, ns).Add(-1)}
	}
	aq.Limit = limit + archiveSlack
	recs, err := s.archiveList(ctx, aq)
	if err != nil {
		return nil, nil, false, err
	}
	type item struct {
		scanned
		rec *cached
	}
	items := make([]item, 0, len(cands)+len(recs))
	for _, c := range cands {
		items = append(items, item{scanned: c})
	}
	for _, r := range recs {
		rec, err := decodeRecord(q.Tenant, r.Key, r.Data, r.Revision)
		if err != nil {
			s.archive.corrupt.Add(1)
			return nil, nil, false, fmt.Errorf("%w: archived record of %q: %v", errCorrupt, r.Key, err)
		}
		if o := position(rec.CreatedAt, r.Key); o > after {
			items = append(items, item{scanned: scanned{order: o, key: r.Key, archived: true}, rec: &cached{rec: rec, rev: r.Revision}})
		}
	}
	// Etcd's entries first among equals: a key in both is taken once.
	slices.SortStableFunc(items, func(a, b item) int { return cmp.Compare(a.order, b.order) })
	seen := make(map[string]bool, len(items))
	outC := make([]scanned, 0, limit)
	outR := make([]*cached, 0, limit)
	cut := false // entries left out past limit continue on the next page
	for _, it := range items {
		if seen[it.key] {
			continue
		}
		seen[it.key] = true
		if len(outC) == limit {
			cut = true
			break
		}
		outC, outR = append(outC, it.scanned), append(outR, it.rec)
	}
	return outC, outR, len(recs) < aq.Limit && !cut, nil
}

// archiveQueryOf is the archive's part of a listing: its tenant, label and
// parent, and its states among the final ones (the archive holds nothing
// else): false when it asks for none of them.
func archiveQueryOf(q intent.ListQuery) (ArchiveQuery, bool) {
	aq := ArchiveQuery{Tenant: q.Tenant, Label: q.Label, Parent: q.ParentKey}
	var finals []intent.State
	for _, st := range []intent.State{intent.StateCompleted, intent.StateFailed, intent.StateCancelled} {
		if len(q.States) == 0 || slices.Contains(q.States, st) {
			finals = append(finals, st)
		}
	}
	switch {
	case len(finals) == 0:
		return aq, false
	case len(finals) == 1 && len(q.States) > 0:
		aq.State = &finals[0]
	}
	return aq, true
}
