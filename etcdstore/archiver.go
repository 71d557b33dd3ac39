package etcdstore

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// The archiver moves final records from etcd to the archive, as part of
// the janitor's sweep (one replica at a time, but safe when two run: see
// the package doc, "Archive"). A record is due once it has been final for
// Config.ArchiveAfter, or once its retention ended (the archive then
// keeps its tombstone).
//
// Candidates come from the retention index (Xr, both layouts), which
// every version writes in the transaction that makes a record final: its
// entries sort by end of retention, and a record of the default retention
// completed at c sorts at c + DefaultRetention, so the entries up to now −
// ArchiveAfter + DefaultRetention are the due records of the default
// retention or shorter (those of a shorter one not due yet are read and
// left). Records of a longer retention sort later: the backfill, a walk
// over the whole index a bounded number of entries a pass, once after each
// election and then hourly, finds them, and finds every final record of
// an installation that turns its archive on.

// movesPerTxn bounds the records one move transaction deletes: each takes
// its record, its index keys (a few, more with labels) and a compare.
const movesPerTxn = 8

// movesPerRead bounds the records one read of candidates takes: a record
// and its tombstone spot (two ranges) each, well under etcd's 128
// operations.
const movesPerRead = 32

// backfillPerPass bounds the entries of the retention index one pass of
// the backfill examines; backfillEvery is how often it walks the index
// again once through.
const (
	backfillPerPass = 4 * sweepBatch
	backfillEvery   = time.Hour
)

// backfillCursor is where the backfill's walk is: the layout and the key
// after which it continues, and when it last went through.
type backfillCursor struct {
	mu     sync.Mutex
	layout int // index into inBothLayouts' ranges
	after  string
	done   time.Time
}

// restart makes the next pass walk the index from its start.
func (c *backfillCursor) restart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.layout, c.after, c.done = 0, "", time.Time{}
}

func (c *backfillCursor) isDone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.done.IsZero()
}

// moveCand is a record due to move: as read from etcd, value and mod
// revision, with its tombstone spot (the chunk its move rewrites).
type moveCand struct {
	tenant, key string
	rec         *machine.Record
	rev         int64
	value       []byte
	spot        machine.TombstoneSpot
}

// archiveMoveHook, set by tests, runs between a batch's archive write and
// its etcd deletes.
var archiveMoveHook func(cands []moveCand)

// sweepArchive is the archiver's pass: the due records of the retention
// index, and a step of the backfill. It returns how many records it moved.
func (s *Store) sweepArchive(ctx context.Context, now time.Time) (int, error) {
	p := archivePass{s: s, ctx: ctx, now: now}
	bound := now.Add(-s.archive.after + s.cfg.DefaultRetention)
	for _, r := range inBothLayouts(s.keys.retentionsIn) {
		if _, err := s.sweepDuePages(ctx, r, bound, p.page); err != nil {
			p.settle()
			return p.moved, err
		}
	}
	err := s.backfillStep(ctx, &p)
	p.settle()
	return p.moved, err
}

// archivePass is one pass of the archiver: what it moved, and the
// completion of the oldest due record it left in etcd.
type archivePass struct {
	s      *Store
	ctx    context.Context
	now    time.Time
	moved  int
	oldest time.Time
}

// page moves the due records of a page of retention index entries.
func (p *archivePass) page(page []dueEntry) (int, error) {
	n := 0
	for len(page) > 0 {
		part := page[:min(len(page), movesPerRead)]
		page = page[len(part):]
		cands, err := p.s.readMoveCands(p.ctx, part, p.now)
		if err != nil {
			return n, err
		}
		moved, err := p.s.moveCands(p.ctx, cands)
		n += moved
		p.moved += moved
		if moved < len(cands) {
			for _, c := range cands {
				if t := finishedAt(c.rec); p.oldest.IsZero() || t.Before(p.oldest) {
					p.oldest = t // an upper bound of the oldest left: good enough for a lag
				}
			}
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// settle records the lag the pass saw.
func (p *archivePass) settle() {
	if p.oldest.IsZero() {
		p.s.archive.oldest.Store(0)
		return
	}
	p.s.archive.oldest.Store(p.oldest.UnixNano())
}

// backfillStep walks the retention index on from where the backfill is,
// up to backfillPerPass entries, moving what is due.
func (s *Store) backfillStep(ctx context.Context, p *archivePass) error {
	c := &s.archive.backfill
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done.IsZero() && p.now.Sub(c.done) < backfillEvery {
		return nil
	}
	if !c.done.IsZero() {
		c.layout, c.after, c.done = 0, "", time.Time{}
	}
	ranges := inBothLayouts(s.keys.retentionsIn)
	examined := 0
	for c.layout < len(ranges) && examined < backfillPerPass {
		r := ranges[c.layout]
		start := r.prefix
		if c.after != "" {
			start = c.after + "\x00"
		}
		resp, err := s.get(ctx, start, 0, clientv3.WithRange(clientv3.GetPrefixRangeEnd(r.prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(sweepBatch))
		if err != nil {
			return err
		}
		page := dueEntries(r, resp.Kvs)
		if _, err := p.page(page); err != nil {
			return err
		}
		examined += len(resp.Kvs)
		if len(resp.Kvs) > 0 {
			c.after = string(resp.Kvs[len(resp.Kvs)-1].Key)
		}
		if !resp.More {
			c.layout, c.after = c.layout+1, ""
		}
	}
	if c.layout == len(ranges) {
		c.done = p.now
	}
	return nil
}

// due reports whether a final record is due to move at now: final for
// ArchiveAfter, or past its retention.
func (s *Store) due(rec *machine.Record, now time.Time) bool {
	if rec == nil || !rec.State.Final() {
		return false
	}
	return !now.Before(finishedAt(rec).Add(s.archive.after)) || (!rec.RetainUntil.IsZero() && !now.Before(rec.RetainUntil))
}

// finishedAt is when a final record became final: its completion, or for a
// record of an earlier version that has none, its last write.
func finishedAt(rec *machine.Record) time.Time {
	if !rec.CompletedAt.IsZero() {
		return rec.CompletedAt
	}
	return rec.UpdatedAt
}

// readMoveCands reads the records entries name, each with its tombstone
// spot, in one linearizable read, and returns those due at now.
func (s *Store) readMoveCands(ctx context.Context, entries []dueEntry, now time.Time) ([]moveCand, error) {
	ops := make([]clientv3.Op, 0, 3*len(entries))
	for _, e := range entries {
		spot, _ := s.spotOps(e.tenant, e.key, false)
		ops = append(append(ops, clientv3.OpGet(s.keys.intent(e.tenant, e.key))), spot...)
	}
	resp, err := s.readTxn(ctx, 0, ops)
	if err != nil {
		return nil, err
	}
	var out []moveCand
	for i, e := range entries {
		rr := resp.Responses[3*i].GetResponseRange()
		if len(rr.Kvs) == 0 {
			continue // gone: moved or removed meanwhile
		}
		kv := rr.Kvs[0]
		rec, err := decodeRecord(e.tenant, e.key, kv.Value, kv.ModRevision)
		if err != nil {
			s.cfg.Logger.Warn("etcdstore: archiver: a record does not decode; left in etcd", "tenant", e.tenant, "key", e.key, "err", err)
			continue
		}
		if !s.due(rec, now) {
			continue
		}
		_, spot, err := s.decodeSpot(e.tenant, e.key, false, resp.Responses[3*i+1].GetResponseRange(), resp.Responses[3*i+2].GetResponseRange())
		if err != nil {
			return nil, err
		}
		out = append(out, moveCand{tenant: e.tenant, key: e.key, rec: rec, rev: kv.ModRevision, value: kv.Value, spot: spot})
	}
	return out, nil
}

// moveCands moves records: first into the archive (putArchived), then out
// of etcd (dropMoved). It returns how many left etcd.
func (s *Store) moveCands(ctx context.Context, cands []moveCand) (int, error) {
	if len(cands) == 0 {
		return 0, nil
	}
	if err := s.putArchived(ctx, cands); err != nil {
		return 0, err
	}
	if archiveMoveHook != nil {
		archiveMoveHook(cands)
	}
	return s.dropMoved(ctx, cands)
}

// putArchived writes records into the archive, each as etcd holds it: its
// value byte for byte and its mod revision. The archive's write is an
// idempotent upsert, so writing a record again (a pass that failed after
// it, another replica's pass) is harmless.
func (s *Store) putArchived(ctx context.Context, cands []moveCand) error {
	recs := make([]ArchivedRecord, len(cands))
	for i, c := range cands {
		r := c.rec
		recs[i] = ArchivedRecord{Tenant: c.tenant, Key: c.key, State: r.State, Fingerprint: r.Fingerprint, Parent: r.ParentKey,
			RegisteredAt: r.CreatedAt, CompletedAt: finishedAt(r), RetainUntil: r.RetainUntil, Revision: c.rev, Data: c.value}
		for name, value := range r.Labels {
			recs[i].Labels = append(recs[i].Labels, intent.Label{Name: name, Value: value})
		}
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.OperationTimeout)
	defer cancel()
	start := time.Now()
	err := s.archive.a.Put(actx, recs)
	return s.archive.observe(time.Since(start), err)
}

// dropMoved deletes archived records from etcd: the records of one
// tombstone chunk together, in one transaction that compares each record's
// mod revision with the one archived and the chunk's with the one read,
// deletes each record and its index keys, and puts the chunk again as it
// was (none yet: the empty last chunk). The chunk's new mod revision is
// what refuses a registration decided before the move (see the package
// doc, "Archive"). A record changed or gone since is left: a later pass
// reads it again. It returns how many records it deleted.
func (s *Store) dropMoved(ctx context.Context, cands []moveCand) (int, error) {
	groups := map[string][]moveCand{}
	var order []string
	for _, c := range cands {
		if _, ok := groups[c.spot.Place]; !ok {
			order = append(order, c.spot.Place)
		}
		groups[c.spot.Place] = append(groups[c.spot.Place], c)
	}
	n := 0
	for _, place := range order {
		group := groups[place]
		spot := group[0].spot
		for len(group) > 0 {
			part := group[:min(len(group), movesPerTxn)]
			group = group[len(part):]
			moved, next, err := s.dropTogether(ctx, spot, part)
			n += moved
			if err != nil {
				return n, err
			}
			if moved == 0 {
				break // the chunk changed: the rest waits for the next pass
			}
			spot = next // the chunk as this transaction left it
		}
	}
	return n, nil
}

// dropTogether is dropMoved's transaction for records of one chunk, read
// at spot; it returns the chunk's spot as it left it.
func (s *Store) dropTogether(ctx context.Context, spot machine.TombstoneSpot, part []moveCand) (int, machine.TombstoneSpot, error) {
	chunk, err := s.spotChunk(spot)
	if err != nil {
		return 0, spot, err
	}
	value := spot.Value
	if spot.Rev == 0 {
		value = chunk.Value()
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(spot.Place), "=", spot.Rev)}
	var ops []clientv3.Op
	for _, c := range part {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.keys.intent(c.tenant, c.key)), "=", c.rev))
		ops = append(ops, clientv3.OpDelete(s.keys.intent(c.tenant, c.key)))
		ops = s.keys.appendIndexOps(ops, c.rec, nil)
	}
	// The chunk again, and the moved keys for the replicas' filters of
	// archived keys (archivefilter.go), at the same revision.
	ops = append(ops, clientv3.OpPut(spot.Place, string(value)), clientv3.OpPut(s.keys.archiveMoved(), movedValue(part)))
	tctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.kv.Txn(tctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, spot, unavailable(err) // read again by the next pass
	}
	if !resp.Succeeded {
		return 0, spot, nil
	}
	s.chunks.observe(chunk, resp.Header.Revision)
	s.archive.moved.Add(int64(len(part)))
	return len(part), machine.TombstoneSpot{Place: spot.Place, Rev: resp.Header.Revision, Value: value}, nil
}

// dueEntries is the tenant and key of each entry of an end-of-retention
// index r (as sweepDuePages parses them).
func dueEntries(r indexRange, kvs []*mvccpb.KeyValue) []dueEntry {
	page := make([]dueEntry, 0, len(kvs))
	for _, kv := range kvs {
		if e, ok := parseDue(r, string(kv.Key)); ok {
			page = append(page, e)
		}
	}
	return page
}
