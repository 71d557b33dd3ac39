package etcdstore

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/intentd/intentd/internal/etcdtest"
)

// The record cache's estimate of an entry is the heap a record decoded
// from etcd occupies, within the allocator's rounding: measured for every
// golden record (each format the store reads), decoded many times and
// kept. An estimate far below what a record holds would let the cache
// grow past its budget; far above, hold fewer records than it could.
func TestCacheEstimateIsTheHeapARecordHolds(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "records", "*"))
	if err != nil {
		t.Fatal(err)
	}
	tested := 0
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasPrefix(name, "tombstone") || strings.HasPrefix(name, "session") || strings.HasPrefix(name, ".") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			const n = 5000
			keep := make([]cached, n)
			keys := make([]string, n)
			before := heapInUse()
			for i := range keep {
				rec, err := decodeRecord(b, 1000)
				if err != nil {
					t.Fatal(err)
				}
				keep[i] = cached{rec: rec, rev: 1000}
				keys[i] = cacheKey(rec.Tenant, rec.Key)
			}
			// The values' headers (cached{}) are the slice's, allocated
			// before: count them as the estimate does.
			measured := float64(heapInUse()-before)/n + float64(16)
			estimate := float64(cachedBytes(keys[0], keep[0]))
			runtime.KeepAlive(keep)
			runtime.KeepAlive(keys)
			t.Logf("%d stored bytes: %.0f bytes of heap per decoded record, estimated %.0f", len(b), measured, estimate)
			if estimate < 0.85*measured || estimate > 1.3*measured {
				t.Errorf("estimate %.0f bytes, measured %.0f: want within -15%% to +30%% of it", estimate, measured)
			}
		})
		tested++
	}
	if tested == 0 {
		t.Fatal("no golden records found")
	}
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
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
	b, err := os.ReadFile(filepath.Join("testdata", "records", "completed_typical.pb"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 20_000 // about 40 MiB of records
	before := heapInUse()
	for i := range n {
		rec, err := decodeRecord(b, int64(1000+i))
		if err != nil {
			t.Fatal(err)
		}
		rec.Key = fmt.Sprintf("key-%06d", i)
		s.remember(rec.Tenant, rec.Key, rec, int64(1000+i))
	}
	grown := heapInUse() - before
	t.Logf("%d records shown, %d cached: %d KiB estimated, heap grew %d KiB", n, s.records.Len(), s.records.Bytes()>>10, grown>>10)
	if got := s.records.Bytes(); got > cfg.CacheBytes {
		t.Errorf("record cache holds %d bytes by its estimate, over CacheBytes %d", got, cfg.CacheBytes)
	}
	if limit := cfg.CacheBytes * 5 / 4; grown > limit {
		t.Errorf("heap grew %d KiB, want at most %d KiB (CacheBytes and a quarter)", grown>>10, limit>>10)
	}
	rec, _ := decodeRecord(b, 1)
	if _, ok := s.cachedView(rec.Tenant, fmt.Sprintf("key-%06d", n-1)); !ok {
		t.Error("the last record shown is not cached")
	}
	if _, ok := s.cachedView(rec.Tenant, "key-000000"); ok {
		t.Error("the first record shown is still cached, want it forgotten")
	}
}
