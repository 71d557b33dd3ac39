package etcdstore

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// The record cache's estimate of an entry is the heap a record decoded
// from etcd occupies, within the allocator's rounding: measured for every
// golden record in each format the store reads, decoded many times and
// kept. An estimate far below what a record holds would let the cache
// grow past its budget; far above, hold fewer records than it could.
func TestCacheEstimateIsTheHeapARecordHolds(t *testing.T) {
	type golden struct {
		name, tenant, key string
		modRev            int64
	}
	var cases []golden
	for _, tc := range recordCases {
		cases = append(cases, golden{tc.name, tc.stored.Tenant, tc.stored.Key, 1000})
	}
	typical := golden{typicalCompleted.name, typicalCompleted.stored.Tenant, typicalCompleted.stored.Key, typicalCompleted.modRev}
	for _, g := range append(cases, typical) {
		for _, ext := range []string{".json", ".pb", ".pb2"} {
			if _, err := os.Stat(goldenPath(g.name, ext)); err != nil {
				continue // a case that format has no file of
			}
			t.Run(g.name+ext, func(t *testing.T) {
				b := readGolden(t, g.name, ext)
				const n = 5000
				keep := make([]cached, n)
				keys := make([]string, n)
				before := heapInUse()
				for i := range keep {
					rec, err := decodeRecord(g.tenant, g.key, b, g.modRev)
					if err != nil {
						t.Fatal(err)
					}
					keep[i] = cached{rec: rec, rev: g.modRev}
					keys[i] = cacheKey(rec.Tenant, rec.Key)
				}
				// The entries' own headers are the slice's, allocated
				// before: count them as the estimate does.
				measured := float64(heapInUse()-before)/n + float64(unsafe.Sizeof(cached{}))
				estimate := float64(cachedBytes(keys[0], keep[0]))
				runtime.KeepAlive(keep)
				runtime.KeepAlive(keys)
				t.Logf("%d stored bytes: %.0f bytes of heap per decoded record, estimated %.0f", len(b), measured, estimate)
				if estimate < 0.85*measured || estimate > 1.3*measured {
					t.Errorf("estimate %.0f bytes, measured %.0f: want within -15%% to +30%% of it", estimate, measured)
				}
			})
		}
	}
}

// The store's record cache holds at most Config.CacheBytes of heap,
// however many records it is shown: the oldest are forgotten (and served
// from etcd again).
func TestRecordCacheStaysWithinItsBytes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CacheBytes = 4 << 20
	s, err := New(etcdtest.Start(t).Client(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tc := typicalCompleted
	b := readGolden(t, tc.name, ".pb2")
	const n = 20_000 // about 40 MiB of records
	before := heapInUse()
	for i := range n {
		key := fmt.Sprintf("key-%06d", i)
		rec, err := decodeRecord(tc.stored.Tenant, key, b, int64(1000+i))
		if err != nil {
			t.Fatal(err)
		}
		s.remember(rec.Tenant, key, rec, int64(1000+i))
	}
	grown := heapInUse() - before
	t.Logf("%d records shown, %d cached: %d KiB estimated, heap grew %d KiB", n, s.records.Len(), s.records.Bytes()>>10, grown>>10)
	if got := s.records.Bytes(); got > cfg.CacheBytes {
		t.Errorf("record cache holds %d bytes by its estimate, over CacheBytes %d", got, cfg.CacheBytes)
	}
	if limit := cfg.CacheBytes * 5 / 4; grown > limit {
		t.Errorf("heap grew %d KiB, want at most %d KiB (CacheBytes and a quarter)", grown>>10, limit>>10)
	}
	if _, ok := s.cachedEntry(tc.stored.Tenant, fmt.Sprintf("key-%06d", n-1)); !ok {
		t.Error("the last record shown is not cached")
	}
	if _, ok := s.cachedEntry(tc.stored.Tenant, "key-000000"); ok {
		t.Error("the first record shown is still cached, want it forgotten")
	}
}

// A final record's entry counts, from its first replay on, what its memo
// may hold (the server's converted answer): replaying every cached record
// makes room for those answers by forgetting records.
func TestReplayedRecordsCountTheirMemo(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CacheBytes = 1 << 20
	s, err := New(etcdtest.Start(t).Client(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tc := typicalCompleted
	b := readGolden(t, tc.name, ".pb2")
	const n = 2000
	for i := range n {
		key := fmt.Sprintf("key-%06d", i)
		rec, err := decodeRecord(tc.stored.Tenant, key, b, int64(1000+i))
		if err != nil {
			t.Fatal(err)
		}
		s.remember(rec.Tenant, key, rec, int64(1000+i))
	}
	held, bytes := s.records.Len(), s.records.Bytes()
	var replayed int
	for i := n - held; i < n; i++ {
		key := fmt.Sprintf("key-%06d", i)
		if c, ok := s.cachedEntry(tc.stored.Tenant, key); ok {
			s.replayedFrom(tc.stored.Tenant, key, c.memo)
			s.replayedFrom(tc.stored.Tenant, key, c.memo) // counted once
			replayed++
		}
	}
	rec, err := decodeRecord(tc.stored.Tenant, "k", b, 1)
	if err != nil {
		t.Fatal(err)
	}
	perMemo := memoBytes(rec)
	t.Logf("%d records held (%d KiB); after %d replays %d held (%d KiB); %d bytes per memo", held, bytes>>10, replayed, s.records.Len(), s.records.Bytes()>>10, perMemo)
	if got := s.records.Bytes(); got > cfg.CacheBytes-cfg.CacheBytes/sessionCacheShare {
		t.Errorf("record cache holds %d bytes, over its budget", got)
	}
	// Each replayed entry grew by perMemo: fewer fit.
	perEntry := bytes / int64(held)
	if want := int(int64(held) * perEntry / (perEntry + perMemo)); s.records.Len() > want+1 {
		t.Errorf("after replaying every cached record: %d held, want at most %d (each now counts its memo)", s.records.Len(), want+1)
	}
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A replay through Acquire charges its entry for the memo the first time
// it hands the memo out, and leaves the entry as it is on later replays.
func TestAcquireReplayChargesTheMemoOnce(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	s, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sess, err := s.OpenSession(ctx, "default", "w-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const key = "replayed-once"
	happyPath(t, s, cli, key, sess.ID)
	c, ok := s.cachedEntry("default", key)
	if !ok || c.memo == nil || c.replayed {
		t.Fatalf("after Complete: entry %+v, cached %v; want a final entry with a memo, not replayed", c, ok)
	}
	before := s.records.Bytes()
	replay := func() *intent.Acquisition {
		a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "again", ExpectedFingerprint: c.rec.Fingerprint})
		if err != nil || a.Outcome != intent.OutcomeCompleted || a.Memo != c.memo {
			t.Fatalf("replay: %+v, %v; want COMPLETED with the entry's memo", a, err)
		}
		return a
	}
	replay()
	charged := s.records.Bytes()
	if after, _ := s.cachedEntry("default", key); !after.replayed || charged <= before {
		t.Errorf("after the first replay: replayed %v, cache %d bytes (was %d); want the memo charged", after.replayed, charged, before)
	}
	replay()
	if again := s.records.Bytes(); again != charged {
		t.Errorf("after a second replay the cache holds %d bytes, want %d as after the first", again, charged)
	}
}
