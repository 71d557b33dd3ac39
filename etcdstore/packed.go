package etcdstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/internal/core/machine"
)

// Packed tombstones (the package doc, "Tombstones"): the store's side of
// package tombstones. A key's spot (machine.TombstoneSpot) is the chunk
// that covers its hash, as read: its etcd key, its mod revision (0 when
// there is no chunk at all) and its value. Reading a key's spot also
// reads the key's tombstone of an earlier version (keys.tombstone), which
// is read alongside until the janitor removes it at the end of its own
// retention.

// spotOps reads tenant's key's spots: its tombstone of an earlier version,
// and the chunk that covers its hash, the first chunk whose upper bound is
// not below it: a range from its hash, limit 1. etcd counts every key of a
// range, limit or not, and reads the value of one more key than the limit
// (to say whether there are more), so the range ends, when bounded is set
// and the store knows the chunks there, at the chunk it knows to cover the
// hash: a lookup reads one chunk, not two. A bounded read that finds no
// chunk knew wrong (a merge took that chunk into the next: errStaleBound):
// read again without the bound.
// It returns whether it bounded the range.
func (s *Store) spotOps(tenant, key string, bounded bool) ([]clientv3.Op, bool) {
	h := tombstones.HashOf(tenant, key)
	end := s.keys.chunksEnd()
	hi, ok := s.chunks.rangeEnd(h)
	if ok && bounded {
		end = s.keys.chunk(hi) + "\x00"
	}
	return []clientv3.Op{
		clientv3.OpGet(s.keys.tombstone(tenant, key)),
		clientv3.OpGet(s.keys.chunk(h), clientv3.WithRange(end), clientv3.WithLimit(1)),
	}, ok && bounded
}

// errStaleBound is a bounded read of a spot that found no chunk: what the
// store knew of the chunks there was out of date.
var errStaleBound = errors.New("etcdstore: the chunks were not where the store knew them")

// decodeSpot is the tombstone of tenant's key (nil: none) and its spot,
// from the answers to spotOps (bounded: as it said).
func (s *Store) decodeSpot(tenant, key string, bounded bool, old, chunk *pb.RangeResponse) (*machine.Tombstone, machine.TombstoneSpot, error) {
	h := tombstones.HashOf(tenant, key)
	if bounded && len(chunk.GetKvs()) == 0 {
		return nil, machine.TombstoneSpot{}, errStaleBound
	}
	c, spot, err := s.chunkSpot(chunk)
	if err == nil && !c.Covers(h) {
		err = fmt.Errorf("%w: tombstone chunk %s does not cover %s", errCorrupt, spot.Place, h)
	}
	if err != nil {
		return nil, spot, err
	}
	if kvs := old.GetKvs(); len(kvs) > 0 {
		t, err := decodeTombstone(key, kvs[0].Value)
		if err != nil {
			return nil, spot, fmt.Errorf("%w: tombstone of %q: %v", errCorrupt, key, err)
		}
		return t, spot, nil
	}
	if e, ok := c.Find(h); ok {
		return &machine.Tombstone{Key: key, State: e.State, CompletedAt: e.CompletedAt(), Until: e.Until()}, spot, nil
	}
	return nil, spot, nil
}

// chunkSpot is the chunk a range of spotOps read, and its spot: none read
// is the empty chunk of every hash, of revision 0 (no chunk at all). The
// store learns the chunk (chunkMap).
func (s *Store) chunkSpot(r *pb.RangeResponse) (tombstones.Chunk, machine.TombstoneSpot, error) {
	spot := machine.TombstoneSpot{Place: s.keys.chunk(tombstones.Last)}
	c := tombstones.Chunk{Hi: tombstones.Last}
	if kvs := r.GetKvs(); len(kvs) > 0 {
		hi, err := tombstones.ParseHash(strings.TrimPrefix(string(kvs[0].Key), s.keys.chunks()))
		if err == nil {
			c, err = tombstones.ReadChunk(hi, kvs[0].Value)
		}
		if err != nil {
			return c, spot, fmt.Errorf("%w: tombstone chunk %s: %v", errCorrupt, kvs[0].Key, err)
		}
		spot = machine.TombstoneSpot{Place: string(kvs[0].Key), Rev: kvs[0].ModRevision, Value: kvs[0].Value}
	}
	// Each version of a chunk is checked whole once, when the store first
	// reads it (a binary search of entries out of order could miss one).
	if !s.chunks.knows(c, spot.Rev) {
		if err := c.Check(); err != nil {
			return c, spot, fmt.Errorf("%w: tombstone chunk %s: %v", errCorrupt, spot.Place, err)
		}
		s.chunks.observe(c, spot.Rev)
	}
	return c, spot, nil
}

// spotCompares are the compares of a NoTombstone guard on key: no
// tombstone of an earlier version, and the chunk of its spot unchanged
// (what etcd holds there is what the view read). A view without the key's
// spot gets a compare that always fails, so that the write loop reads it.
func (s *Store) spotCompares(tenant string, v *machine.View, key string) []clientv3.Cmp {
	spot, ok := v.Spots[key]
	if !ok {
		spot = machine.TombstoneSpot{Place: s.keys.chunk(tombstones.Last), Rev: -1}
	}
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(s.keys.tombstone(tenant, key)), "=", 0),
		clientv3.Compare(clientv3.ModRevision(spot.Place), "=", spot.Rev),
	}
}

// packed is a tombstone's write: the compare that the chunk is as read,
// the puts of the chunks that replace it, and those chunks.
type packed struct {
	cmp    clientv3.Cmp
	ops    []clientv3.Op
	chunks []tombstones.Chunk
	// dropped counts the entries dropped as expired on the way.
	dropped int
}

// pack is the write that adds t, the tombstone of tenant's key v.Key, to
// the chunk of its spot: the chunk rewritten with it (split in two when
// full), entries past their retention dropped. A view without the key's
// spot gets a compare that always fails (the write loop reads it then).
func (s *Store) pack(tenant string, v *machine.View, t *machine.Tombstone) (packed, error) {
	spot, ok := v.Spots[v.Key]
	if !ok {
		return packed{cmp: clientv3.Compare(clientv3.ModRevision(s.keys.chunk(tombstones.Last)), "=", -1)}, nil
	}
	c, err := s.spotChunk(spot)
	if err != nil {
		return packed{}, err
	}
	e := tombstones.NewEntry(tenant, v.Key, t.State, t.CompletedAt, t.Until)
	out := tombstones.Rechunk([]tombstones.Chunk{c}, []tombstones.Entry{e}, tombstones.Today(s.cfg.Now()))
	p := packed{cmp: clientv3.Compare(clientv3.ModRevision(spot.Place), "=", spot.Rev), chunks: out, dropped: c.Len() + 1}
	for _, o := range out {
		p.ops = append(p.ops, clientv3.OpPut(s.keys.chunk(o.Hi), string(o.Value())))
		p.dropped -= o.Len()
	}
	return p, nil
}

// spotChunk is the chunk a spot read: none yet is the empty chunk of every
// hash.
func (s *Store) spotChunk(spot machine.TombstoneSpot) (tombstones.Chunk, error) {
	if spot.Rev == 0 {
		return tombstones.Chunk{Hi: tombstones.Last}, nil
	}
	hi, err := tombstones.ParseHash(strings.TrimPrefix(spot.Place, s.keys.chunks()))
	if err != nil {
		return tombstones.Chunk{}, fmt.Errorf("%w: tombstone chunk %s: %v", errCorrupt, spot.Place, err)
	}
	c, err := tombstones.ParseChunk(hi, spot.Value)
	if err != nil {
		return tombstones.Chunk{}, fmt.Errorf("%w: tombstone chunk %s: %v", errCorrupt, spot.Place, err)
	}
	return c, nil
}

// certifiedSpot is the spot of tenant's key when the store can tell
// without reading that the key has no tombstone (see chunkMap.certify): a
// registration then writes at once, guarded by that spot.
func (s *Store) certifiedSpot(tenant, key string) (machine.TombstoneSpot, bool) {
	hi, rev, ok := s.chunks.certify(tombstones.HashOf(tenant, key))
	if !ok {
		return machine.TombstoneSpot{}, false
	}
	return machine.TombstoneSpot{Place: s.keys.chunk(hi), Rev: rev}, true
}

// removalsPerTxn bounds the records removeTogether takes in one
// transaction.
const removalsPerTxn = 16

// removeDue removes the final records of page that are due at now.
// Records whose tombstones go into one chunk the store knows are removed
// together (removeTogether): a janitor catching up on many removals
// rewrites a chunk once per page rather than once per record (each
// rewrite is a new version of the chunk, kept as etcd's history until
// compaction). The others, and those a group could not take, are removed
// one by one (remove).
func (s *Store) removeDue(ctx context.Context, page []dueEntry, now time.Time) (int, error) {
	groups := map[tombstones.Hash][]dueEntry{}
	var order []tombstones.Hash
	var alone []dueEntry
	for _, e := range page {
		hi, ok := s.chunks.rangeOf(tombstones.HashOf(e.tenant, e.key))
		if !ok {
			alone = append(alone, e)
			continue
		}
		if _, seen := groups[hi]; !seen {
			order = append(order, hi)
		}
		groups[hi] = append(groups[hi], e)
	}
	n := 0
	for _, hi := range order {
		for g := groups[hi]; len(g) > 0; g = g[min(len(g), removalsPerTxn):] {
			if len(g) == 1 {
				alone = append(alone, g[0])
				break
			}
			done, left, err := s.removeTogether(ctx, g[:min(len(g), removalsPerTxn)], now)
			n += done
			if err != nil {
				return n, err
			}
			alone = append(alone, left...)
		}
	}
	for _, e := range alone {
		done, err := s.remove(ctx, e.tenant, e.key, now)
		if err != nil {
			return n, err
		}
		if done {
			n++
		}
	}
	return n, nil
}

// removeTogether removes the due records of group, whose tombstones the
// store expects in one chunk, in one transaction: each record's removal
// decided by machine.Remove and compared as read, the chunk compared as
// read and rewritten once with all their tombstones. It returns how many it
// removed, and those left for remove: the records the chunk read turns out
// not to cover, those past what one transaction holds, and all of them
// when a compare failed.
func (s *Store) removeTogether(ctx context.Context, group []dueEntry, now time.Time) (int, []dueEntry, error) {
	spotOps, bounded := s.spotOps(group[0].tenant, group[0].key, true)
	ops := []clientv3.Op{spotOps[1]}
	for _, e := range group {
		ops = append(ops, clientv3.OpGet(s.keys.intent(e.tenant, e.key)))
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	read, err := s.kv.Txn(rctx).Then(ops...).Commit()
	cancel()
	if err != nil {
		return 0, nil, classify(err, false).err
	}
	chunk := read.Responses[0].GetResponseRange()
	if bounded && len(chunk.GetKvs()) == 0 {
		return 0, group, nil // the chunks moved: one by one, each read unbounded if need be
	}
	c, spot, err := s.chunkSpot(chunk)
	if err != nil {
		return 0, nil, err
	}
	var cmps []clientv3.Cmp
	var writes []clientv3.Op
	var adds []tombstones.Entry
	var taken, left []dueEntry
	for i, e := range group {
		kvs := read.Responses[1+i].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue // removed already
		}
		if !c.Covers(tombstones.HashOf(e.tenant, e.key)) {
			left = append(left, e)
			continue
		}
		rec, rev, err := decodeAt(e.tenant, e.key, kvs[0])
		if err != nil {
			return 0, nil, err
		}
		d := s.rules.Remove(&machine.View{Key: e.key, Rec: rec, Rev: rev, Fresh: true}, now)
		t := d.Tombstone
		if t == nil {
			continue // not final, or not due by this replica's clock
		}
		k := s.keys.intent(e.tenant, e.key)
		ops := s.keys.appendIndexOps([]clientv3.Op{clientv3.OpDelete(k)}, rec, nil)
		if len(writes)+len(ops)+3 > maxTxnOps { // 3: the chunk split in two at most, and room
			left = append(left, e)
			continue
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", rev))
		writes = append(writes, ops...)
		adds = append(adds, tombstones.NewEntry(e.tenant, e.key, t.State, t.CompletedAt, t.Until))
		taken = append(taken, e)
	}
	if len(taken) == 0 {
		return 0, left, nil
	}
	out := tombstones.Rechunk([]tombstones.Chunk{c}, adds, tombstones.Today(s.cfg.Now()))
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(spot.Place), "=", spot.Rev))
	dropped := c.Len() + len(adds)
	for _, o := range out {
		writes = append(writes, clientv3.OpPut(s.keys.chunk(o.Hi), string(o.Value())))
		dropped -= o.Len()
	}
	tctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	resp, err := s.kv.Txn(tctx).If(cmps...).Then(writes...).Commit()
	cancel()
	if err != nil {
		// Applied or not, the next pass reads again: a record gone is
		// done.
		return 0, nil, classify(err, false).err
	}
	if !resp.Succeeded {
		s.stats.conflicts.Add(1)
		return 0, append(left, taken...), nil
	}
	for _, e := range taken {
		s.records.Remove(cacheKey(e.tenant, e.key))
	}
	for _, o := range out {
		s.chunks.observe(o, resp.Header.Revision)
	}
	s.stats.commits.Add(1)
	s.stats.tombstonesDropped.Add(int64(dropped))
	return len(taken), left, nil
}

// LearnTombstones reads every chunk of packed tombstones into what the
// store knows of them (their ranges, mod revisions and filters), so that a
// registration of a new key by Acquire needs no read first. RunJanitor
// does it when it starts; a store that does not know a key's chunk reads
// it with the registration instead, and knows it from then on.
func (s *Store) LearnTombstones(ctx context.Context) error {
	start := s.keys.chunks()
	for {
		resp, err := s.get(ctx, start, 0, clientv3.WithRange(s.keys.chunksEnd()), clientv3.WithLimit(32))
		if err != nil {
			return err
		}
		if start == s.keys.chunks() && len(resp.Kvs) == 0 {
			s.chunks.observe(tombstones.Chunk{Hi: tombstones.Last}, 0) // no tombstone at all
		}
		for _, kv := range resp.Kvs {
			c, err := s.chunkOf(kv.Key, kv.Value)
			if err != nil {
				return err
			}
			s.chunks.observe(c, kv.ModRevision)
		}
		if !resp.More {
			s.chunks.trim()
			s.learntOnce.Do(func() { close(s.learnt) })
			return nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// TombstonesLearnt is closed once the store has learnt every chunk of
// packed tombstones (LearnTombstones, which RunJanitor calls as it
// starts): the last of what a start reads through.
func (s *Store) TombstonesLearnt() <-chan struct{} { return s.learnt }

// rewritesPerSweep bounds the chunks one janitor pass rewrites: an entry
// may stay a day past its end anyway.
const rewritesPerSweep = 16

// sweepChunks continues the janitor's walk over the chunks the store knows
// (LearnTombstones; the janitor writes every chunk there is, and learns
// what it writes), from where the previous pass ended, in memory: a chunk
// holding entries past their day is read and rewritten without them, and a
// chunk (not the last) with fewer than tombstones.MinEntries left is
// merged into its right neighbour (split again, evenly, when the two are
// too many for one). A chunk that needs neither is not read. Each rewrite
// compares the chunks it replaces, so that it never undoes a removal's
// write; one that loses waits for the next pass. It returns the entries
// dropped.
func (s *Store) sweepChunks(ctx context.Context, now time.Time) (int, error) {
	today := tombstones.Today(now)
	s.walk.Lock()
	defer s.walk.Unlock()
	due, next := s.chunks.due(s.walk.after, today, rewritesPerSweep)
	s.walk.after = next
	dropped := 0
	for _, k := range due {
		keys := []string{s.keys.chunk(k.hi)}
		if k.merge {
			keys = append(keys, s.keys.chunk(k.next))
		}
		ops := make([]clientv3.Op, len(keys))
		for i, key := range keys {
			ops[i] = clientv3.OpGet(key)
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		read, err := s.kv.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return dropped, classify(err, false).err
		}
		var run []tombstones.Chunk
		var kvs []*mvccpb.KeyValue
		for _, r := range read.Responses {
			got := r.GetResponseRange().GetKvs()
			if len(got) == 0 {
				break // gone since: the map learns it from its next read
			}
			c, err := s.chunkOf(got[0].Key, got[0].Value)
			if err != nil {
				return dropped, err
			}
			if len(run) > 0 && c.Lo != run[len(run)-1].Hi {
				break // not the neighbour any more
			}
			run, kvs = append(run, c), append(kvs, got[0])
		}
		if len(run) == 0 || len(run) < len(keys) && run[0].Expiring(today) == 0 {
			continue
		}
		d, err := s.rechunk(ctx, run, kvs, today)
		if err != nil {
			return dropped, err
		}
		dropped += d
	}
	return dropped, nil
}

// chunkOf parses a chunk as read from etcd.
func (s *Store) chunkOf(key, value []byte) (tombstones.Chunk, error) {
	hi, err := tombstones.ParseHash(strings.TrimPrefix(string(key), s.keys.chunks()))
	if err != nil {
		return tombstones.Chunk{}, fmt.Errorf("%w: tombstone chunk %s: %v", errCorrupt, key, err)
	}
	c, err := tombstones.ParseChunk(hi, value)
	if err != nil {
		return tombstones.Chunk{}, fmt.Errorf("%w: tombstone chunk %s: %v", errCorrupt, key, err)
	}
	return c, nil
}

// rechunk replaces the adjacent chunks run, read as kvs, by what
// tombstones.Rechunk makes of them on day today, comparing that each is
// as read; it returns the entries dropped (none when the compare failed).
func (s *Store) rechunk(ctx context.Context, run []tombstones.Chunk, kvs []*mvccpb.KeyValue, today uint16) (int, error) {
	out := tombstones.Rechunk(run, nil, today)
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	before, after := 0, 0
	kept := map[string]bool{}
	for _, o := range out {
		k := s.keys.chunk(o.Hi)
		kept[k] = true
		ops = append(ops, clientv3.OpPut(k, string(o.Value())))
		after += o.Len()
	}
	for i, kv := range kvs {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		if !kept[string(kv.Key)] {
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
		before += run[i].Len()
	}
	tctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.kv.Txn(tctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, classify(err, false).err // the next pass tries again
	}
	if !resp.Succeeded {
		return 0, nil
	}
	for _, o := range out {
		s.chunks.observe(o, resp.Header.Revision)
	}
	return before - after, nil
}

// walkCursor is where the janitor's walk over the chunks is: after the
// chunk of that upper bound (the zero hash: from the first).
type walkCursor struct {
	sync.Mutex
	after tombstones.Hash
}

// chunkMap is what the store knows of the tombstone chunks, so that a new
// key can be registered without reading its chunk first (the package doc,
// "Tombstones"): for each chunk it read or wrote, its range, its mod
// revision then, and a filter of its hashes. It grows with the chunks, and
// with the tombstones only by their filters' bits (tombstones.FilterBits
// a tombstone).
type chunkMap struct {
	mu sync.RWMutex
	// known is sorted by upper bound; the ranges never overlap.
	known []knownChunk
}

// knownChunk is one chunk as the store last saw it.
type knownChunk struct {
	lo, hi tombstones.Hash
	// rev is the chunk's mod revision; 0 for no chunk at all (no
	// tombstone yet: the whole range, the last chunk absent).
	rev    int64
	filter tombstones.Filter
	// entries is how many it holds, firstDay the earliest UntilDay among
	// them (what the janitor's walk looks at).
	entries  int32
	firstDay uint16
}

func before(a, b tombstones.Hash) bool { return bytes.Compare(a[:], b[:]) < 0 }

// observe records c as read, or written, at mod revision rev, unless the
// map knows a newer version of part of its range. Whatever changes which
// chunk covers a hash rewrites every chunk involved (a split, a merge), so
// of two overlapping chunks the one of the higher mod revision is the
// newer, and what it overlaps is gone.
func (m *chunkMap) observe(c tombstones.Chunk, rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// The known chunks whose range meets (c.Lo, c.Hi]: from the first
	// whose upper bound is above c.Lo, while their lower bound is below
	// c.Hi.
	from := sort.Search(len(m.known), func(i int) bool { return before(c.Lo, m.known[i].hi) })
	to := from
	for ; to < len(m.known) && before(m.known[to].lo, c.Hi); to++ {
		if k := m.known[to]; k.rev > rev || (k.rev == rev && k.lo == c.Lo && k.hi == c.Hi) {
			return // known newer, or known already
		}
	}
	k := knownChunk{lo: c.Lo, hi: c.Hi, rev: rev, filter: tombstones.NewFilter(c), entries: int32(c.Len()), firstDay: c.FirstDay()}
	m.known = slices.Replace(m.known, from, to, k)
}

// dueChunk is a chunk the janitor's walk rewrites: by its upper bound,
// with its right neighbour's when it is to be merged into it.
type dueChunk struct {
	hi, next tombstones.Hash
	merge    bool
}

// due returns up to limit known chunks after the one of upper bound after
// that hold entries expired on day today, or (but the last) fewer than
// tombstones.MinEntries, and where to go on from; it looks at a bounded
// number of chunks, at most each once, going on from the first after the
// last.
func (m *chunkMap) due(after tombstones.Hash, today uint16, limit int) ([]dueChunk, tombstones.Hash) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	const looks = 4096
	var out []dueChunk
	i := sort.Search(len(m.known), func(i int) bool { return before(after, m.known[i].hi) })
	for n := 0; n < min(looks, len(m.known)) && len(out) < limit; n, i = n+1, i+1 {
		if i == len(m.known) {
			i = 0
		}
		k := &m.known[i]
		after = k.hi
		if k.rev == 0 {
			continue
		}
		small := k.hi != tombstones.Last && k.entries < tombstones.MinEntries
		if small && i+1 < len(m.known) && m.known[i+1].lo == k.hi {
			out = append(out, dueChunk{hi: k.hi, next: m.known[i+1].hi, merge: true})
			i, n = i+1, n+1 // the neighbour goes with it
			after = m.known[i].hi
			continue
		}
		if k.entries > 0 && k.firstDay <= today {
			out = append(out, dueChunk{hi: k.hi})
		}
	}
	return out, after
}

// knows reports whether the map holds c's version of rev.
func (m *chunkMap) knows(c tombstones.Chunk, rev int64) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := sort.Search(len(m.known), func(i int) bool { return !before(m.known[i].hi, c.Hi) })
	return i < len(m.known) && m.known[i].hi == c.Hi && m.known[i].lo == c.Lo && m.known[i].rev == rev
}

// certify returns where a write relies on h having no tombstone: the upper
// bound of the known chunk that covers h and the mod revision at which
// its filter rules h out. It reports false when the map cannot tell: no
// known chunk covers h, or its filter lets h through (h's entry, or a
// false positive).
func (m *chunkMap) certify(h tombstones.Hash) (tombstones.Hash, int64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := sort.Search(len(m.known), func(i int) bool { return !before(m.known[i].hi, h) })
	if i == len(m.known) {
		return tombstones.Hash{}, 0, false
	}
	k := &m.known[i]
	covers := (k.lo == tombstones.Hash{} || before(k.lo, h))
	if !covers || k.filter.MayContain(h) {
		return tombstones.Hash{}, 0, false
	}
	return k.hi, k.rev, true
}

// rangeEnd is where a read of the chunk that covers h may end: the upper
// bound of the known chunk that covers h. False when no known chunk covers
// h, or the map knows that there is no chunk at all.
func (m *chunkMap) rangeEnd(h tombstones.Hash) (tombstones.Hash, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := sort.Search(len(m.known), func(i int) bool { return !before(m.known[i].hi, h) })
	if i == len(m.known) || m.known[i].rev == 0 || !(m.known[i].lo == tombstones.Hash{} || before(m.known[i].lo, h)) {
		return tombstones.Hash{}, false
	}
	return m.known[i].hi, true
}

// rangeOf is the upper bound of the known chunk that covers h, whatever its
// filter says.
func (m *chunkMap) rangeOf(h tombstones.Hash) (tombstones.Hash, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := sort.Search(len(m.known), func(i int) bool { return !before(m.known[i].hi, h) })
	if i == len(m.known) || !(m.known[i].lo == tombstones.Hash{} || before(m.known[i].lo, h)) {
		return tombstones.Hash{}, false
	}
	return m.known[i].hi, true
}

// trim gives back what growing the map left unused (learning every chunk
// grows it an append at a time).
func (m *chunkMap) trim() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.known = slices.Clone(m.known)
}

// usage is how many chunks the map knows, and their filters' bytes.
func (m *chunkMap) usage() (chunks, bytes int64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, k := range m.known {
		bytes += int64(k.filter.Bytes())
	}
	return int64(len(m.known)), bytes
}

// StoreTombstones writes the chunks of set into etcd under prefix, in
// place of every chunk etcd holds there: what this version's janitor
// would have written had it removed the set's entries one by one, in the
// order the set was given them (save the revisions). A benchmark or a
// sizing test seeds a store with it instead of running each intent through
// the API and the janitor; set must hold every packed tombstone etcd
// holds already.
func StoreTombstones(ctx context.Context, kv clientv3.KV, prefix string, set *tombstones.Set) error {
	k := keys{prefix}
	var ops []clientv3.Op
	size := 0
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		tctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := kv.Txn(tctx).Then(ops...).Commit()
		ops, size = ops[:0], 0
		return err
	}
	for _, c := range set.Chunks() {
		v := c.Value()
		if len(ops) == 64 || size+len(v) > maxTxnBytes/2 {
			if err := flush(); err != nil {
				return err
			}
		}
		ops = append(ops, clientv3.OpPut(k.chunk(c.Hi), string(v)))
		size += len(v)
	}
	return flush()
}
