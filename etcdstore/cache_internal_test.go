package etcdstore

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
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

// A final record's entry becomes compact on its first replay, once
// answers are kept: its record goes, its head stays and what its memo
// will hold (the server's converted answer) is counted: replaying every
// cached record leaves room for more of them than whole records with
// their answers took, within the same budget.
func TestReplayedRecordsBecomeCompact(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("answers kept %v", keep), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.CacheBytes = 1 << 20
			s, err := New(etcdtest.Start(t).Client(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			keepingAnswers(s, keep)
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
			for i := n - held; i < n; i++ {
				key := fmt.Sprintf("key-%06d", i)
				if c, ok := s.cachedEntry(tc.stored.Tenant, key); ok {
					s.replayedFrom(tc.stored.Tenant, key, c.memo)
					s.replayedFrom(tc.stored.Tenant, key, c.memo) // once
					after, _ := s.replayEntry(tc.stored.Tenant, key)
					if _, whole := s.cachedEntry(tc.stored.Tenant, key); !after.replayed || (after.rec == nil) != keep || (after.view(key) == nil) != keep || whole == keep {
						t.Fatalf("%s after its replay: replayed %v, whole %v, found by what decides on records %v; want compact (no view to write from, cached apart) %v", key, after.replayed, after.rec != nil, whole, keep)
					}
				}
			}
			rec, err := decodeRecord(tc.stored.Tenant, "key-000000", b, 1)
			if err != nil {
				t.Fatal(err)
			}
			perEntry, replayed := bytes/int64(held), s.records.Bytes()/int64(s.records.Len())
			t.Logf("%d records held (%d KiB, %d B each); after replaying them %d held (%d KiB, %d B each); memo %d B", held, bytes>>10, perEntry, s.records.Len(), s.records.Bytes()>>10, replayed, memoBytes(rec))
			if got := s.records.Bytes(); got > cfg.CacheBytes-cfg.CacheBytes/sessionCacheShare {
				t.Errorf("record cache holds %d bytes, over its budget", got)
			}
			if keep && replayed >= perEntry+memoBytes(rec) {
				t.Errorf("a compact entry counts %d bytes, a whole one and its answer %d: want fewer", replayed, perEntry+memoBytes(rec))
			}
			if !keep && replayed < perEntry+memoBytes(rec) {
				t.Errorf("a whole replayed entry counts %d bytes, want its record's and its answer's %d", replayed, perEntry+memoBytes(rec))
			}
		})
	}
}

// keepingAnswers sets whether s has found answers kept in memos.
func keepingAnswers(s *Store, keep bool) { s.answersKept.Store(keep) }

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A store told that its callers keep answers makes an entry compact on
// its first replay, before any memo was seen filled: what a store whose
// replays all miss the cache would otherwise never learn.
func TestKeepsAnswersMakesTheFirstReplayCompact(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	s, sess := storeWithSession(t, cli, DefaultConfig())
	s.KeepsAnswers()
	ctx := context.Background()
	const key = "kept-from-the-start"
	happyPath(t, s, cli, key, sess.ID)
	whole, ok := s.replayEntry("default", key)
	if !ok || whole.rec == nil {
		t.Fatal("the completed record is not cached whole")
	}
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "again"})
	if err != nil || a.Outcome != intent.OutcomeCompleted || string(a.Intent.Params) != string(whole.rec.Params) {
		t.Fatalf("first replay: %+v, %v; want COMPLETED with the whole record, for its caller to derive from", a, err)
	}
	if c, ok := s.replayEntry("default", key); !ok || c.rec != nil || c.head == nil || c.memo != a.Memo {
		t.Errorf("after the first replay: cached %v, whole %v, head %+v; want the compact entry with the replay's memo", ok, c.rec != nil, c.head)
	}
}

// A store keeps whole records, and replays them whole from memory, until
// it finds a replay's memo holding what its caller derived: that entry is
// then made compact, and from then on an entry is made compact on its
// first replay. A compact entry answers with its head and the memo, or,
// while the memo is empty, from a read of the record; a report finds no
// view in it to write from.
func TestReplaysMakeEntriesCompactOnceAnswersAreKept(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	s, sess := storeWithSession(t, cli, DefaultConfig())
	ctx := context.Background()
	replay := func(key, what string) *intent.Acquisition {
		t.Helper()
		c, _ := s.replayEntry("default", key)
		a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "again"})
		if err != nil || a.Outcome != intent.OutcomeCompleted || a.Memo == nil || a.Memo != c.memo || a.Intent.Revision != c.rev {
			t.Fatalf("%s: %+v, %v; want COMPLETED with the entry's memo and revision", what, a, err)
		}
		return a
	}
	entry := func(key string) cached {
		c, ok := s.replayEntry("default", key)
		if !ok {
			t.Fatalf("%s is not cached", key)
		}
		return c
	}
	const first = "replayed-first"
	happyPath(t, s, cli, first, sess.ID)
	whole := entry(first).rec
	before := s.records.Bytes()
	for i := range 3 {
		if a := replay(first, "replay, nothing kept"); string(a.Intent.Params) != string(whole.Params) || a.Intent.Result == nil {
			t.Errorf("replay %d: params %s, result %v; want the whole record's", i, a.Intent.Params, a.Intent.Result)
		}
	}
	charged := s.records.Bytes()
	if c := entry(first); !c.replayed || c.rec == nil || c.head != nil || charged != before+memoBytes(whole) || s.Stats().Replays != 3 {
		t.Errorf("after replays whose memo stayed empty: replayed %v, whole %v, head %+v, cache %d bytes (was %d), %d from memory; want the whole record, its memo charged once, replays from memory",
			c.replayed, c.rec != nil, c.head, charged, before, s.Stats().Replays)
	}

	entry(first).memo.Store("an answer") // as the gRPC server keeps its answer
	a := replay(first, "replay once the memo holds the answer")
	c := entry(first)
	if c.rec != nil || c.head == nil || c.head.memo != memoBytes(whole) || !s.answersKept.Load() {
		t.Fatalf("after a replay found the memo kept: whole %v, head %+v, answers kept %v; want compact", c.rec != nil, c.head, s.answersKept.Load())
	}
	if want := charged - recordBytes(whole) + headSize + alloc(len(whole.Fingerprint)); s.records.Bytes() != want {
		t.Errorf("compact entry: cache %d bytes, want %d", s.records.Bytes(), want)
	}
	if a.Intent.Fingerprint != whole.Fingerprint || !a.Intent.CompletedAt.Equal(whole.CompletedAt) || !a.Intent.RetainUntil.Equal(whole.RetainUntil) || a.Intent.State != whole.State {
		t.Errorf("replay: intent %+v, want the record's state, fingerprint and times", a.Intent)
	}
	compact := s.records.Bytes()
	if a := replay(first, "replay of the compact entry"); a.Intent.Params != nil || a.Intent.Result != nil || s.records.Bytes() != compact {
		t.Errorf("replay of a compact entry: params %s, result %v, cache %d bytes (was %d); want its head, nothing counted again", a.Intent.Params, a.Intent.Result, s.records.Bytes(), compact)
	}
	if _, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: first, SessionID: sess.ID, RequestID: "x", ExpectedFingerprint: "other"}); err == nil {
		t.Error("a compact entry replayed to another fingerprint")
	}
	// What decides on a cached record (a report, a heartbeat, a
	// submission) never finds a compact entry: a heartbeat naming the
	// completed intent's lease answers as a store that never cached it.
	if _, ok := s.cachedEntry("default", first); ok {
		t.Error("a compact entry is found by what decides on cached records")
	}
	fresh, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	held := []intent.HeldLease{{Key: first, Token: whole.Lease.Token}}
	_, got := s.Heartbeat(ctx, "default", sess.ID, held)
	_, want := fresh.Heartbeat(ctx, "default", sess.ID, held)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("heartbeat naming a compact entry's lease: %v, want %v as without a cache", got, want)
	}
	if _, err := s.Report(ctx, intent.Report{Tenant: "default", Key: first, Kind: intent.ReportComplete, Token: 1}); err == nil {
		t.Error("a stale report on a compact entry succeeded")
	}

	// Answers are kept: the next final record is compact on its first
	// replay, and read while its memo is empty.
	const second = "replayed-second"
	happyPath(t, s, cli, second, sess.ID)
	whole = entry(second).rec
	if a := replay(second, "first replay"); string(a.Intent.Params) != string(whole.Params) {
		t.Errorf("first replay: params %s, want the whole record's", a.Intent.Params)
	}
	if c := entry(second); c.rec != nil || c.head == nil {
		t.Fatalf("after its first replay: whole %v, head %+v; want compact", c.rec != nil, c.head)
	}
	replays := s.Stats().Replays
	a, err = s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: second, SessionID: sess.ID, RequestID: "again"})
	if err != nil || a.Outcome != intent.OutcomeCompleted || string(a.Intent.Params) != string(whole.Params) || s.Stats().Replays != replays {
		t.Errorf("replay of a compact entry with an empty memo: %+v, %v, %d from memory (was %d); want the record read, whole", a, err, s.Stats().Replays, replays)
	}
	if c := entry(second); c.rec != nil || c.head == nil || a.Memo != c.memo {
		t.Errorf("after the read: whole %v, head %+v, memo %p (answer's %p); want compact again, with the memo handed out", c.rec != nil, c.head, c.memo, a.Memo)
	}

	// A memo that says what it holds is counted at that, once.
	estimated := s.records.Bytes()
	a.Memo.Store(sizedMemo(1000))
	replay(second, "replay once the memo says what it holds")
	c = entry(second)
	if c.head == nil || !c.head.exact || c.head.memo != alloc(1000) || s.records.Bytes() != estimated-memoBytes(whole)+alloc(1000) {
		t.Errorf("after the memo said it holds 1,000 bytes: head %+v, cache %d bytes (was %d); want the memo counted at them", c.head, s.records.Bytes(), estimated)
	}
	exact := s.records.Bytes()
	replay(second, "a later replay")
	if s.records.Bytes() != exact {
		t.Errorf("a later replay moved the cache from %d to %d bytes", exact, s.records.Bytes())
	}
}

// sizedMemo stands for what the gRPC server keeps in a memo: it says how
// much it holds.
type sizedMemo int64

func (m sizedMemo) HeapBytes() int64 { return int64(m) }

// A record a replay had to read from etcd goes into a full cache only if
// it was asked for more often lately than the least recently used entry
// it would evict: one retried no more than the entries held is answered
// and left out, and once retried more often it is kept (compact), so that
// a round of retries larger than the cache leaves what the cache holds to
// answer its share rather than each evicting the next.
func TestAFullCacheAdmitsAReplayedRecordOnlyIfAskedForMore(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	cfg := DefaultConfig()
	cfg.CacheBytes = minCacheBytes
	s, sess := storeWithSession(t, cli, cfg)
	s.KeepsAnswers()
	ctx := context.Background()
	const key = "retried-later"
	happyPath(t, s, cli, key, sess.ID)
	s.records.Remove(cacheKey("default", key))
	// Fill the cache with entries each asked for three times.
	for i := 0; ; i++ {
		k := cacheKey("default", fmt.Sprintf("held-%d", i))
		before := s.records.Len()
		s.records.Add(k, cached{rev: 1})
		if s.records.Len() == before {
			break // it evicted one: full
		}
		for range 3 {
			s.records.Asked(k)
		}
	}
	replay := func() *intent.Acquisition {
		t.Helper()
		a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "again"})
		if err != nil || a.Outcome != intent.OutcomeCompleted {
			t.Fatalf("replay: %+v, %v; want COMPLETED", a, err)
		}
		return a
	}
	// Left out, its memo would be the caller's alone: none is handed out,
	// and the server encodes the answer once, for the wire.
	if a := replay(); a.Memo != nil {
		t.Error("a replay the cache did not admit handed out a memo")
	}
	if _, ok := s.replayEntry("default", key); ok {
		t.Fatal("a record retried once is cached over entries asked for three times")
	}
	var last *intent.Acquisition
	for range 4 {
		last = replay()
	}
	c, ok := s.replayEntry("default", key)
	if !ok || c.head == nil {
		t.Fatalf("a record retried six times (with its registration's Acquire) is not cached: cached %v, head %+v", ok, c.head)
	}
	if last.Memo == nil || last.Memo != c.memo {
		t.Errorf("the replay that cached the record handed out memo %p, want the cached entry's %p", last.Memo, c.memo)
	}
}
