package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/intentd/intentd/etcdstore/tombstones"
)

// The archive filter: which keys the archive may hold, kept in memory by
// every replica (RunArchiveFilter), so that a key etcd does not hold is
// known to be new without asking the archive. A new registration is then
// one etcd write, as without an archive, and it succeeds while the
// archive is down.
//
// It is exact where it answers: it says "never archived" only of a key
// whose tombstone chunk the caller read, or certified, at mod revision r,
// and only while it holds every key moved at a revision up to r. A move
// rewrites the chunk of each key it moves (dropTogether), so every move of
// the key is at or below r; the move's transaction also writes the moved
// keys' hashes under archiveMoved, which the filter watches, and upTo is
// the revision up to which it applied every such write (from the watch's
// events and progress notifications). Its start is a load of every key the
// archive holds, after reading archiveMoved's revision and before watching
// from the next one: a move at or below that revision wrote the archive
// before it. A key the filter lets through (one archived, or one of its
// false positives) is asked of the archive as before; so is every key
// while the filter is loading, lags, or its watch failed.
//
// It only grows: keys whose tombstones the archive dropped stay in it as
// false positives until the replica restarts.

// archiveMoved is the key each move transaction writes: the hashes
// (tombstones.HashOf) of the keys it moves, 16 bytes each.
func (k keys) archiveMoved() string { return k.prefix + "cluster/archive-moved" }

// movedValue is archiveMoved's value for the records of a move.
func movedValue(part []moveCand) string {
	b := make([]byte, 0, len(part)*len(tombstones.Hash{}))
	for _, c := range part {
		h := tombstones.HashOf(c.tenant, c.key)
		b = append(b, h[:]...)
	}
	return string(b)
}

// archiveFilter is a replica's filter of archived keys: Bloom filters of
// growing capacity, each with filterFalsePositives, the newest taking the
// keys added; a key may be archived if any of them may hold it.
type archiveFilter struct {
	mu     sync.RWMutex
	blooms []*bloom.BloomFilter
	// room is how many more keys the newest filter takes at its rate.
	room uint
	keys uint
	// ready is set once the filter holds every key archived up to upTo.
	ready atomic.Bool
	upTo  atomic.Int64
	// nudge asks etcd for the watch's progress (nil: no watch).
	nudge     atomic.Pointer[func()]
	lastNudge atomic.Int64
	// ruledOut counts the lookups the filter answered, passed those it
	// sent to the archive while ready.
	ruledOut, passed atomic.Int64
}

const (
	// filterFirstKeys is the first filter's capacity; each next one has
	// twice the previous one's.
	filterFirstKeys = 1 << 16
	// filterFalsePositives is each filter's rate of false positives at
	// its capacity: a key the archive never held is asked of it with
	// about this chance per filter (about 14 bits a key).
	filterFalsePositives = 0.001
	// nudgeEvery bounds how often a lagging filter asks for progress.
	nudgeEvery = 2 * time.Millisecond
)

// reset empties the filter; it is not ready until loaded again, and
// covers no revision until then (a reload's load and watch start from a
// revision of their own). Under the lock, which rulesOut holds from its
// first check to its last: no lookup sees it half reset.
func (f *archiveFilter) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready.Store(false)
	f.upTo.Store(0)
	f.blooms, f.room, f.keys = nil, 0, 0
}

// add adds the key of hash h.
func (f *archiveFilter) add(h tombstones.Hash) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.room == 0 {
		n := uint(filterFirstKeys) << len(f.blooms)
		f.blooms = append(f.blooms, bloom.NewWithEstimates(n, filterFalsePositives))
		f.room = n
	}
	f.blooms[len(f.blooms)-1].Add(h[:])
	f.room--
	f.keys++
}

// addMoved adds the keys of an archiveMoved value.
func (f *archiveFilter) addMoved(v []byte) error {
	size := len(tombstones.Hash{})
	if len(v)%size != 0 {
		return fmt.Errorf("%w: %d bytes of moved keys' hashes", errCorrupt, len(v))
	}
	for ; len(v) > 0; v = v[size:] {
		f.add(tombstones.Hash(v[:size]))
	}
	return nil
}

// advance records that the filter holds every key moved up to rev.
func (f *archiveFilter) advance(rev int64) {
	for {
		at := f.upTo.Load()
		if rev <= at || f.upTo.CompareAndSwap(at, rev) {
			return
		}
	}
}

// rulesOut reports whether the key of hash h was never archived, for a
// caller that read, or certified, the key's chunk at mod revision rev;
// false when the filter cannot tell (see the package's filter doc).
func (f *archiveFilter) rulesOut(h tombstones.Hash, rev int64) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.ready.Load() || rev <= 0 {
		return false
	}
	if f.upTo.Load() < rev {
		f.askProgress()
		return false
	}
	for _, b := range f.blooms {
		if b.Test(h[:]) {
			f.passed.Add(1)
			return false
		}
	}
	f.ruledOut.Add(1)
	return true
}

// askProgress asks etcd, at most every nudgeEvery, to tell the filter's
// watch how far it is: a chunk rewritten without a move (the janitor's)
// leaves the filter behind its revision until then.
func (f *archiveFilter) askProgress() {
	nudge := f.nudge.Load()
	now := time.Now().UnixNano()
	last := f.lastNudge.Load()
	if nudge == nil || now-last < int64(nudgeEvery) || !f.lastNudge.CompareAndSwap(last, now) {
		return
	}
	go (*nudge)()
}

// size is how many keys the filter holds.
func (f *archiveFilter) size() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return int64(f.keys)
}

// bytes is the filter's memory: its bits.
func (f *archiveFilter) bytes() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var n int64
	for _, b := range f.blooms {
		n += int64(b.Cap() / 8)
	}
	return n
}

// RunArchiveFilter keeps this replica's filter of archived keys (see the
// package doc, "Archive"), until ctx ends: without it every key etcd does
// not hold is asked of the archive. It loads the filter from the archive
// and follows the moves in etcd; on a failure (the archive unreachable
// while loading, the watch compacted or closed) it starts again after
// retry, asking the archive meanwhile. report, when set, is called with
// each failure.
func (s *Store) RunArchiveFilter(ctx context.Context, retry time.Duration, report func(error)) {
	if !s.archive.on() {
		return
	}
	f := &s.archive.filter
	for {
		err := s.keepArchiveFilter(ctx)
		f.reset()
		f.nudge.Store(nil)
		if ctx.Err() != nil {
			return
		}
		if report != nil {
			report(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// archiveFilterHook, set by tests, runs before the filter applies each
// answer of its watch (a pointer: a test sets it while filters run).
var archiveFilterHook atomic.Pointer[func()]

// errWatchClosed is keepArchiveFilter's error when etcd closed its watch.
var errWatchClosed = errors.New("etcdstore: the archive filter's watch closed")

// keepArchiveFilter loads the filter and keeps it until ctx ends or
// something fails.
func (s *Store) keepArchiveFilter(ctx context.Context) error {
	f := &s.archive.filter
	f.reset()
	gctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	resp, err := s.kv.Get(gctx, s.keys.archiveMoved(), clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		return unavailable(err)
	}
	from := resp.Header.Revision
	// A watch stream of its own (the metadata names it), so that a
	// progress request is answered on this watch alone, whatever other
	// watches on the client lag.
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(metadata.AppendToOutgoingContext(ctx, "intentd-watch", "archive-filter")))
	loaded := make(chan error, 1)
	defer func() {
		stop()
		if loaded != nil {
			<-loaded // no add after this returns
		}
	}()
	wch := s.watcher.Watch(wctx, s.keys.archiveMoved(), clientv3.WithRev(from+1))
	nudge := func() { _ = s.watcher.RequestProgress(wctx) }
	f.nudge.Store(&nudge)
	go func() {
		loaded <- s.archive.a.Hashes(wctx, func(h tombstones.Hash) error {
			f.add(h)
			return nil
		})
	}()
	for {
		select {
		case err := <-loaded:
			if err != nil {
				return archiveUnavailable(err)
			}
			loaded = nil
			f.advance(from)
			f.ready.Store(true)
		case wr, ok := <-wch:
			if !ok {
				return errWatchClosed
			}
			if hook := archiveFilterHook.Load(); hook != nil {
				(*hook)()
			}
			if err := wr.Err(); err != nil {
				return unavailable(err)
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.PUT {
					if err := f.addMoved(ev.Kv.Value); err != nil {
						return err
					}
				}
				f.advance(ev.Kv.ModRevision)
			}
			if wr.IsProgressNotify() {
				f.advance(wr.Header.Revision)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
