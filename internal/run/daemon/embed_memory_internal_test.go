package daemon

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The embedded etcd keeps only a few applied raft entries in memory: with
// etcd's default (5,000 kept for followers it does not have) the entries
// below held several times the heap they hold with embedRaftCatchUpEntries
// (see docs/PERFORMANCE.md, "What the heap held").
func TestEmbeddedEtcdHoldsFewRaftEntries(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB through raft")
	}
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.EmbedClientURL, cfg.EmbedPeerURL = "http://127.0.0.1:0", "http://127.0.0.1:0"
	e, err := startEmbedded(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + cfg.EmbedSocket()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const entries, entryBytes = 1000, 64 << 10
	value := strings.Repeat("x", entryBytes)
	before := heapInUse()
	for i := range entries {
		// One key, overwritten: the raft log grows, the key index does not.
		if _, err := c.Put(ctx, "k", value); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	grown := heapInUse() - before
	if limit := int64(3 * (embedRaftCatchUpEntries + 100) * entryBytes); grown > limit {
		t.Errorf("after %d raft entries of %d KiB: heap grew %d MiB, want at most %d MiB (the embedded etcd keeps old raft entries)",
			entries, entryBytes>>10, grown>>20, limit>>20)
	}
	t.Logf("heap grew %d KiB after %d raft entries of %d KiB", grown>>10, entries, entryBytes>>10)
}

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
