package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/run/embedetcd"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// A replay of a final record the cache no longer holds costs one read of
// the record and nothing else: no registration tried (a write that must
// fail), no transaction at all; it answers what a replay from memory
// answers, remembers the record again, and the next replay is from memory.
// A hint that turns out wrong (the record gone, or not final) costs that
// read and leaves the answer to the whole path.
func TestReplayOfAFinalRecordOutOfTheCacheReadsItOnce(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(readPathName(local), func(t *testing.T) { testReplayReadsOnce(t, local) })
	}
}

func testReplayReadsOnce(t *testing.T, local bool) {
	cli, cfg, localReads := withReadPath(t, DefaultConfig(), local)
	var reads, writes atomic.Int64
	cfg.ObserveTxn = func(write bool, _ time.Duration) {
		if write {
			writes.Add(1)
		} else {
			reads.Add(1)
		}
	}
	s, sess := storeWithSession(t, cli, cfg)
	s.KeepsAnswers()
	ctx := context.Background()
	const key = "out-of-the-cache"
	happyPath(t, s, cli, key, sess.ID)
	c, ok := s.cachedEntry("default", key)
	if !ok {
		t.Fatal("the completed record is not cached")
	}
	fromMemory, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "first", ExpectedFingerprint: c.rec.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	// A retry as a worker sends it: with its registration.
	params := c.rec.Params
	retry := intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "again",
		Register: &intent.Registration{Tenant: "default", Key: key, Params: params, RequestID: "reg-" + key}}

	for round := range 3 {
		forget(s, "default", key) // as a full cache forgets
		stats, reads0, writes0, local0 := s.Stats(), reads.Load(), writes.Load(), localReads.Load()
		a, err := s.Acquire(ctx, retry)
		if err != nil {
			t.Fatalf("round %d: replay out of the cache: %v", round, err)
		}
		if got, want := localReads.Load()-local0, int64(b2i(local)); got != want {
			t.Errorf("round %d: %d reads of the member in this process, want %d", round, got, want)
		}
		if a.Outcome != intent.OutcomeCompleted || a.Lease != nil || a.Intent.Revision != fromMemory.Intent.Revision ||
			string(a.Intent.Result.Payload) != string(fromMemory.Intent.Result.Payload) || string(a.Intent.Params) != string(fromMemory.Intent.Params) {
			t.Errorf("round %d: %+v (intent %+v), want the replay from memory's %+v (intent %+v)", round, a, a.Intent, fromMemory, fromMemory.Intent)
		}
		if w, r := writes.Load()-writes0, reads.Load()-reads0; w != 0 || r != 0 {
			t.Errorf("round %d: %d write and %d read transactions, want none (one plain read of the record)", round, w, r)
		}
		if got := s.Stats(); got.Conflicts != stats.Conflicts || got.Replays != stats.Replays {
			t.Errorf("round %d: conflicts %d → %d, replays from memory %d → %d; want both unchanged", round, stats.Conflicts, got.Conflicts, stats.Replays, got.Replays)
		}
		e, ok := s.replayEntry("default", key)
		if !ok || a.Memo == nil || a.Memo != e.memo || !e.replayed {
			t.Errorf("round %d: memo %p, cached %v (memo %p, replayed %v); want the record remembered again, its memo handed out and charged", round, a.Memo, ok, e.memo, e.replayed)
		}
		a.Memo.Store("an answer") // as the server keeps its answer
		again, err := s.Acquire(ctx, retry)
		if err != nil || s.Stats().Replays != stats.Replays+1 || again.Memo != a.Memo {
			t.Errorf("round %d: the next replay %+v, %v; want it from memory with the same memo", round, again, err)
		}
	}

	// Another fingerprint is refused as from memory.
	other := retry
	other.Register = &intent.Registration{Tenant: "default", Key: key, Params: []byte(`{"other":true}`), RequestID: "reg-other"}
	forget(s, "default", key)
	if _, err := s.Acquire(ctx, other); !isFingerprintMismatch(err) {
		t.Errorf("other params out of the cache: %v, want a fingerprint mismatch", err)
	}

	// A wrong hint: the record is not final (hinted by hand). The whole
	// path answers, as without the hint.
	const pending = "pending-hinted"
	if _, _, err := s.Register(ctx, intent.Registration{Tenant: "default", Key: pending, Params: params, RequestID: "reg-" + pending}); err != nil {
		t.Fatal(err)
	}
	s.records.Remove(cacheKey("default", pending))
	s.hints().note(s.cfg.Prefix, "default", pending)
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: pending, SessionID: sess.ID, RequestID: "p"})
	if err != nil || a.Outcome != intent.OutcomeExecute || a.Lease == nil {
		t.Errorf("Acquire of a PENDING intent hinted final: %+v, %v; want EXECUTE", a, err)
	}
}

// A replay out of the cache reads serializably, from whichever member the
// client reaches, and such a member may be behind what the store saw: its
// answer, below the revision floor, is used (the record is final) and
// neither refused nor latched as a rolled-back etcd; a store that did
// latch refuses it before it reaches etcd.
func TestReplayReadBelowTheFloorIsNoRollback(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(readPathName(local), func(t *testing.T) { testReplayReadBelowTheFloor(t, local) })
	}
}

func testReplayReadBelowTheFloor(t *testing.T, local bool) {
	cli, cfg, localReads := withReadPath(t, DefaultConfig(), local)
	s, sess := storeWithSession(t, cli, cfg)
	s.KeepsAnswers()
	ctx := context.Background()
	const key = "read-from-a-lagging-member"
	happyPath(t, s, cli, key, sess.ID)
	c, ok := s.cachedEntry("default", key)
	if !ok {
		t.Fatal("the completed record is not cached")
	}
	retry := intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "again",
		Register: &intent.Registration{Tenant: "default", Key: key, Params: c.rec.Params, RequestID: "reg-" + key}}

	// As a member some revisions behind answers: etcd's revision is below
	// the floor the store holds its linearizable calls to.
	floor := s.HighestRevision() + 1000
	s.RaiseFloor(floor)
	forget(s, "default", key)
	a, err := s.Acquire(ctx, retry)
	if err != nil || a.Outcome != intent.OutcomeCompleted {
		t.Fatalf("replay out of the cache below the floor: %+v, %v; want COMPLETED", a, err)
	}
	if e := s.floor.refused.Load(); e != nil {
		t.Fatalf("a serializable read below the floor latched the store: %v", e)
	}
	if got := s.HighestRevision(); got != floor {
		t.Errorf("HighestRevision() = %d, want the floor %d unchanged", got, floor)
	}

	// A linearizable call meets the floor and latches; then the replay is
	// refused before it reads.
	if err := s.Ping(ctx); !errors.Is(err, intent.ErrStoreRolledBack) {
		t.Fatalf("Ping below the floor: %v, want intent.ErrStoreRolledBack", err)
	}
	forget(s, "default", key)
	before := localReads.Load()
	if _, err := s.Acquire(ctx, retry); !errors.Is(err, intent.ErrStoreRolledBack) {
		t.Errorf("replay out of the cache once latched: %v, want intent.ErrStoreRolledBack", err)
	}
	if n := localReads.Load() - before; n != 0 {
		t.Errorf("the refused replay read the member in this process %d times, want none", n)
	}
}

// withReadPath starts an etcd member and returns a client of it, and cfg
// set, if local is, to read the record of a replay out of the cache from
// the member itself, in this process (Config.LocalGet, as intentd with
// its embedded etcd does), counting those reads.
func withReadPath(t *testing.T, cfg Config, local bool) (*clientv3.Client, Config, *atomic.Int64) {
	t.Helper()
	etcd := etcdtest.Start(t)
	var reads atomic.Int64
	if local {
		get := embedetcd.LocalGet(etcd.Etcd)
		cfg.LocalGet = func(ctx context.Context, key string) (*mvccpb.KeyValue, error) {
			reads.Add(1)
			return get(ctx, key)
		}
	}
	return etcd.Client(t), cfg, &reads
}

func readPathName(local bool) string {
	if local {
		return "from the member in this process"
	}
	return "through the client"
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// forget drops whatever s's cache holds of tenant's key.
func forget(s *Store, tenant, key string) {
	s.records.Remove(cacheKey(tenant, key))
	s.records.Remove(compactKey(tenant, key))
}

func isFingerprintMismatch(err error) bool {
	_, ok := err.(*intent.FingerprintMismatchError)
	return ok
}

// The hints remember what they were told, in far less than the records
// would take, and a full table forgets some but never makes up a hint for
// a key it was not told about (false positives are 8 in 2^32 per lookup).
func TestFinalHintsRememberWhatTheyWereTold(t *testing.T) {
	h := newFinalHints(1 << 12)
	const told = 2000 // under half the slots
	for i := range told {
		h.note("p/", "t", fmt.Sprintf("k-%d", i))
	}
	forgotten := 0
	for i := range told {
		if !h.seen("p/", "t", fmt.Sprintf("k-%d", i)) {
			forgotten++
		}
	}
	if forgotten > told/100 {
		t.Errorf("%d of %d hints forgotten at half load, want at most 1 %%", forgotten, told)
	}
	for i := range 100_000 {
		if h.seen("p/", "t", fmt.Sprintf("never-%d", i)) || h.seen("other/", "t", "k-1") || h.seen("p/", "t2", "k-1") {
			t.Fatalf("a key never told is hinted (%d)", i)
		}
	}
	// Overfilled four times: the last told are mostly there, and the
	// table holds no more than its slots.
	for i := range 4 << 12 {
		h.note("p/", "t", fmt.Sprintf("late-%d", i))
	}
	kept := 0
	for i := (4 << 12) - 500; i < 4<<12; i++ {
		if h.seen("p/", "t", fmt.Sprintf("late-%d", i)) {
			kept++
		}
	}
	if kept < 300 {
		t.Errorf("%d of the last 500 told kept in a full table, want most", kept)
	}
}

func TestFinalHintSlots(t *testing.T) {
	for _, tc := range []struct {
		cacheBytes int64
		want       int
	}{
		{1 << 20, 1 << 16},           // the smallest cache: the floor, 256 KiB
		{DefaultCacheBytes, 1 << 18}, // 1 MiB of hints for 32 MiB of cache
		{100 << 20, 1 << 19},         // rounded down to a power of two
		{64 << 30, 1 << 22},          // the ceiling, 16 MiB
	} {
		if got := finalHintSlots(tc.cacheBytes); got != tc.want {
			t.Errorf("finalHintSlots(%d) = %d, want %d", tc.cacheBytes, got, tc.want)
		}
	}
}
