package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// packedChunks reads every chunk of packed tombstones under k's prefix.
func packedChunks(t *testing.T, cli *clientv3.Client, k keys) []tombstones.Chunk {
	t.Helper()
	resp, err := cli.Get(context.Background(), k.chunks(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []tombstones.Chunk
	for _, kv := range resp.Kvs {
		hi, err := tombstones.ParseHash(strings.TrimPrefix(string(kv.Key), k.chunks()))
		if err != nil {
			t.Fatal(err)
		}
		c, err := tombstones.ParseChunk(hi, kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// packedEntries counts the packed tombstones under k's prefix.
func packedEntries(t *testing.T, cli *clientv3.Client, k keys) int {
	t.Helper()
	n := 0
	for _, c := range packedChunks(t, cli, k) {
		n += c.Len()
	}
	return n
}

// clock is a Config.Now that a test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// packedStore is a store on cli whose records are kept an hour and their
// tombstones two days, on clock c.
func packedStore(t *testing.T, cli *clientv3.Client, c *clock) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Now = c.Now
	cfg.DefaultRetention, cfg.MaxRetention, cfg.TombstoneRetention = time.Hour, time.Hour, 48*time.Hour
	s, err := New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// finish registers key, acquires it and ends it in state.
func finish(t testing.TB, s *Store, tenant, key string, state intent.State) *intent.Intent {
	t.Helper()
	ctx := context.Background()
	reg := intent.Registration{Tenant: tenant, Key: key, Params: []byte(`{"n":1}`)}
	if _, _, err := s.Register(ctx, reg); err != nil {
		t.Fatalf("register %s: %v", key, err)
	}
	if state == intent.StateCancelled {
		in, err := s.Cancel(ctx, intent.Cancellation{Tenant: tenant, Key: key, Actor: "tester", Reason: "withdrawn"})
		if err != nil {
			t.Fatalf("cancel %s: %v", key, err)
		}
		return in
	}
	sess, err := s.OpenSession(ctx, tenant, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: tenant, Key: key, SessionID: sess.ID, RequestID: "r"})
	if err != nil || a.Outcome != intent.OutcomeExecute {
		t.Fatalf("acquire %s: %v %v", key, a, err)
	}
	kind := intent.ReportComplete
	r := intent.Report{Tenant: tenant, Key: key, Token: a.Lease.Token, Kind: kind, Result: &intent.Result{Payload: []byte(`{}`)}}
	if state == intent.StateFailed {
		r.Kind, r.Result, r.Failure = intent.ReportFail, nil, &intent.Failure{Code: "declined"}
	}
	out, err := s.Report(ctx, r)
	if err != nil {
		t.Fatalf("report %s: %v", key, err)
	}
	return out.Intent
}

// Every tombstoned key answers EXPIRED with its state and completion to
// the second, however its chunk was written (by the janitor, or packed in
// bulk) and wherever its hash falls (a chunk's bound, the last chunk); a
// key never tombstoned never does, in any tenant.
func TestPackedLookupIsExact(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	c := &clock{now: time.Date(2030, 3, 1, 9, 0, 0, 0, time.UTC)}
	s := packedStore(t, cli, c)
	ctx := context.Background()

	// Tombstones by the janitor, of every final state, in two tenants,
	// under keys that look like other keys of the layout.
	type ended struct {
		tenant, key string
		state       intent.State
		completed   time.Time
	}
	var removed []ended
	states := []intent.State{intent.StateCompleted, intent.StateFailed, intent.StateCancelled}
	for i, key := range []string{"a", "a/", "a/b", "..", "z/x", "t/default/z/a", "Z/ffffffffffffffffffffffffffffffff"} {
		for _, tenant := range []string{"default", "acme"} {
			in := finish(t, s, tenant, key, states[i%len(states)])
			removed = append(removed, ended{tenant, key, in.State, in.CompletedAt})
		}
	}
	c.Advance(2 * time.Hour)
	rep, err := s.Sweep(ctx)
	if err != nil || rep.Removed != len(removed) {
		t.Fatalf("Sweep = %+v, %v; want %d removed", rep, err, len(removed))
	}

	// Many more, packed as the janitor would have (three chunks and more):
	// a set holding the janitor's too.
	set := tombstones.NewSet()
	today := tombstones.Today(c.Now())
	for _, ch := range packedChunks(t, cli, s.keys) {
		for _, e := range ch.Entries() {
			set.Add(e, today)
		}
	}
	bulk := map[tombstones.Hash]string{}
	until := c.Now().Add(48 * time.Hour)
	for i := range 3 * tombstones.MaxEntries {
		key := fmt.Sprintf("bulk-%d", i)
		e := tombstones.NewEntry("default", key, states[i%3], c.Now().Add(-time.Duration(i)*time.Second), until)
		set.Add(e, today)
		bulk[e.Hash] = key
	}
	if err := StoreTombstones(ctx, cli, s.keys.prefix, set); err != nil {
		t.Fatal(err)
	}
	chunks := packedChunks(t, cli, s.keys)
	if len(chunks) < 4 {
		t.Fatalf("%d chunks, want several", len(chunks))
	}

	cold := packedStore(t, cli, c) // knows no chunk: reads each
	for _, st := range []*Store{s, cold} {
		for _, r := range removed {
			_, err := st.Get(ctx, r.tenant, r.key)
			var exp *intent.ExpiredError
			if !errors.As(err, &exp) || exp.State != r.state || !exp.CompletedAt.Equal(r.completed.Truncate(time.Second)) || exp.Fingerprint != "" {
				t.Errorf("Get(%s, %q) = %v, want EXPIRED, %v at %v", r.tenant, r.key, err, r.state, r.completed.Truncate(time.Second))
			}
		}
		// The keys whose hashes bound the chunks, and a key of the last.
		for _, ch := range chunks {
			key, ok := bulk[ch.Hi]
			if !ok {
				continue
			}
			if _, err := st.Get(ctx, "default", key); !errors.Is(err, intent.ErrExpired) {
				t.Errorf("Get of %q, whose hash bounds its chunk: %v, want EXPIRED", key, err)
			}
			if _, err := st.Get(ctx, "acme", key); !errors.Is(err, intent.ErrNotFound) {
				t.Errorf("Get of %q in another tenant: %v, want NOT_FOUND", key, err)
			}
		}
		for h, key := range bulk {
			if h != chunks[len(chunks)-1].At(0).Hash {
				continue
			}
			if _, err := st.Get(ctx, "default", key); !errors.Is(err, intent.ErrExpired) {
				t.Errorf("Get of %q, in the last chunk: %v, want EXPIRED", key, err)
			}
		}
	}
	for i := range 2000 {
		key := fmt.Sprintf("never-%d", i)
		if _, err := cold.Get(ctx, "default", key); !errors.Is(err, intent.ErrNotFound) {
			t.Fatalf("Get(%q), never registered: %v, want NOT_FOUND", key, err)
		}
	}
	// A late registration of any of them is refused, by Register and by
	// Acquire (which, knowing the chunk, would write at once).
	if err := s.LearnTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	sess, err := s.OpenSession(ctx, "default", "late", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, key := range bulk {
		if n++; n > 300 {
			break
		}
		reg := intent.Registration{Tenant: "default", Key: key, Params: []byte(`{"n":2}`)}
		if _, _, err := s.Register(ctx, reg); !errors.Is(err, intent.ErrExpired) {
			t.Fatalf("Register(%q): %v, want EXPIRED", key, err)
		}
		a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "late", Register: &reg})
		if err != nil || a.Outcome != intent.OutcomeExpired {
			t.Fatalf("Acquire(%q) with register: %+v, %v; want EXPIRED", key, a, err)
		}
	}
}

// A replica that learnt the chunks before another replica's janitor added
// a key's tombstone still refuses the key: its registration writes at
// once, comparing the chunk as it knew it, which etcd refuses; the write
// loop reads the chunk then and answers EXPIRED.
// twoReplicasOneTombstone is two stores on one etcd, the first of which
// (the janitor) has swept one intent, "earlier", into a tombstone, and
// their clock.
func twoReplicasOneTombstone(t *testing.T) (janitor, replica *Store, c *clock) {
	t.Helper()
	cli := etcdtest.Start(t).Client(t)
	c = &clock{now: time.Date(2030, 3, 1, 9, 0, 0, 0, time.UTC)}
	janitor, replica = packedStore(t, cli, c), packedStore(t, cli, c)
	finish(t, janitor, "default", "earlier", intent.StateCompleted)
	c.Advance(2 * time.Hour)
	if _, err := janitor.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	return janitor, replica, c
}

func TestStaleChunkKnowledgeRefusesTheWrite(t *testing.T) {
	janitor, replica, c := twoReplicasOneTombstone(t)
	ctx := context.Background()
	if err := replica.LearnTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	in := finish(t, janitor, "default", "late", intent.StateCompleted)
	if _, ok := replica.certifiedSpot("default", "late"); !ok {
		t.Fatal("the replica cannot tell that late has no tombstone yet")
	}
	c.Advance(2 * time.Hour)
	if rep, err := janitor.Sweep(ctx); err != nil || rep.Removed != 1 {
		t.Fatalf("Sweep = %+v, %v", rep, err)
	}
	if _, ok := replica.certifiedSpot("default", "late"); !ok {
		t.Fatal("the replica learnt the new chunk without reading it")
	}
	sess, err := replica.OpenSession(ctx, "default", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	reg := intent.Registration{Tenant: "default", Key: "late", Params: []byte(`{"n":1}`)}
	conflicts := replica.Stats().Conflicts
	a, err := replica.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: "late", SessionID: sess.ID, RequestID: "r", Register: &reg})
	if err != nil || a.Outcome != intent.OutcomeExpired || a.Intent.State != intent.StateCompleted || !a.Intent.CompletedAt.Equal(in.CompletedAt.Truncate(time.Second)) {
		t.Fatalf("Acquire with register of a key tombstoned since = %+v, %v; want EXPIRED, COMPLETED", a, err)
	}
	if replica.Stats().Conflicts != conflicts+1 {
		t.Errorf("conflicts %d → %d: want the optimistic write refused once", conflicts, replica.Stats().Conflicts)
	}
	if _, ok := replica.certifiedSpot("default", "late"); ok {
		t.Error("after reading the chunk, the replica still certifies the tombstoned key")
	}
}

// Removals racing on the same chunks — from two replicas' janitors at
// once, each sending its writes through group commit — beside
// registrations and lookups, lose no tombstone, and every chunk splits
// and stays within its range.
func TestRacingRemovalsLoseNoTombstone(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	c := &clock{now: time.Date(2030, 3, 1, 9, 0, 0, 0, time.UTC)}
	a, b := packedStore(t, cli, c), packedStore(t, cli, c)
	ctx := context.Background()
	n := tombstones.MaxEntries + 200 // one split at least
	keys := make([]string, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				keys[i] = fmt.Sprintf("race-%d", i)
				finish(t, a, "default", keys[i], intent.StateCancelled) // the cheapest to end
			}
		})
	}
	wg.Wait()
	if err := b.LearnTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	c.Advance(2 * time.Hour)
	now := c.Now()
	var removedA, removedB, fresh atomic.Int64
	errs := make(chan error, 64)
	// Four removers, two a replica (one janitor sweeps at a time; these
	// race on purpose).
	for w := range 4 {
		st, count := a, &removedA
		if w%2 == 1 {
			st, count = b, &removedB
		}
		wg.Go(func() {
			// Each replica removes every key, in its own order: one of
			// the two wins each.
			for i := range n {
				k := keys[(i*7+w*31)%n]
				done, err := st.remove(ctx, "default", k, now)
				if err != nil {
					errs <- err
					return
				}
				if done {
					count.Add(1)
				}
			}
		})
	}
	for w := range 4 {
		st := []*Store{a, b}[w%2]
		wg.Go(func() {
			sess, err := st.OpenSession(ctx, "default", "fresh", time.Minute)
			if err != nil {
				errs <- err
				return
			}
			for i := range 50 {
				key := fmt.Sprintf("fresh-%d-%d", w, i)
				reg := intent.Registration{Tenant: "default", Key: key, Params: []byte(`{"n":1}`)}
				got, err := st.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "r", Register: &reg})
				if err != nil || got.Outcome != intent.OutcomeExecute {
					errs <- fmt.Errorf("acquire %s: %+v, %v", key, got, err)
					return
				}
				fresh.Add(1)
				// And a lookup of a key being removed meanwhile: the
				// record, or EXPIRED, never NOT_FOUND.
				if _, err := st.Get(ctx, "default", keys[(i*13+w)%n]); err != nil && !errors.Is(err, intent.ErrExpired) {
					errs <- fmt.Errorf("get while removing: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := removedA.Load() + removedB.Load(); got != int64(n) {
		t.Errorf("removed %d + %d, want %d in all", removedA.Load(), removedB.Load(), n)
	}
	chunks := packedChunks(t, cli, a.keys)
	total := 0
	for i, ch := range chunks {
		total += ch.Len()
		if i > 0 && ch.Lo != chunks[i-1].Hi {
			t.Errorf("chunk %d starts at %s, after %s", i, ch.Lo, chunks[i-1].Hi)
		}
	}
	if len(chunks) < 2 || total != n || chunks[len(chunks)-1].Hi != tombstones.Last {
		t.Fatalf("%d chunks holding %d tombstones, want %d in two or more", len(chunks), total, n)
	}
	for _, k := range keys {
		if _, err := b.Get(ctx, "default", k); !errors.Is(err, intent.ErrExpired) {
			t.Fatalf("Get(%s): %v, want EXPIRED", k, err)
		}
	}
	if fresh.Load() != 200 {
		t.Errorf("%d fresh registrations, want 200", fresh.Load())
	}
}

// The janitor's walk drops entries past their day and merges a chunk with
// fewer than MinEntries left into its right neighbour; a pass rewrites a
// bounded number of chunks, the next goes on from there, and a pass with
// nothing due reads nothing; what is left is exactly the entries not due,
// in chunks covering every hash.
func TestChunkWalkDropsExpiredAndMerges(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	c := &clock{now: time.Date(2030, 3, 1, 9, 0, 0, 0, time.UTC)}
	s := packedStore(t, cli, c)
	ctx := context.Background()
	set := tombstones.NewSet()
	today := tombstones.Today(c.Now())
	keys := map[string]tombstones.Entry{}
	for i := range 128 * tombstones.MaxEntries { // chunks three quarters full: 170 or so
		key := fmt.Sprintf("walk-%d", i)
		// Most end in 10 days; a tenth in 100.
		days := 10
		if i%10 == 0 {
			days = 100
		}
		e := tombstones.NewEntry("default", key, intent.StateCompleted, c.Now(), c.Now().Add(time.Duration(days)*24*time.Hour))
		set.Add(e, today)
		keys[key] = e
	}
	if err := StoreTombstones(ctx, cli, s.keys.prefix, set); err != nil {
		t.Fatal(err)
	}
	before := len(packedChunks(t, cli, s.keys))
	if before <= 2*rewritesPerSweep {
		t.Fatalf("%d chunks: want more than two passes' worth", before)
	}
	if err := s.LearnTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	rev := func() int64 {
		resp, err := cli.Get(ctx, "probe")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	rev0 := rev()
	for range 3 {
		if _, err := s.sweepChunks(ctx, c.Now()); err != nil { // nothing due
			t.Fatal(err)
		}
	}
	if rev() != rev0 {
		t.Errorf("passes with nothing due wrote %d revisions", rev()-rev0)
	}
	if got := packedEntries(t, cli, s.keys); got != len(keys) {
		t.Fatalf("%d entries after a pass with nothing due, want %d", got, len(keys))
	}
	c.Advance(11 * 24 * time.Hour)
	dropped := 0
	for pass := 0; pass < 3*before/rewritesPerSweep+3; pass++ {
		d, err := s.sweepChunks(ctx, c.Now())
		if err != nil {
			t.Fatal(err)
		}
		dropped += d
	}
	chunks := packedChunks(t, cli, s.keys)
	want := 0
	for _, e := range keys {
		if e.UntilDay > tombstones.Today(c.Now()) {
			want++
		}
	}
	if dropped != len(keys)-want || packedEntries(t, cli, s.keys) != want {
		t.Fatalf("dropped %d, left %d; want %d dropped, %d left", dropped, packedEntries(t, cli, s.keys), len(keys)-want, want)
	}
	for i, ch := range chunks {
		if i > 0 && ch.Lo != chunks[i-1].Hi {
			t.Errorf("chunk %d starts at %s, after %s", i, ch.Lo, chunks[i-1].Hi)
		}
		if ch.Hi != tombstones.Last && ch.Len() < tombstones.MinEntries {
			t.Errorf("chunk %d holds %d entries after the walk, fewer than %d", i, ch.Len(), tombstones.MinEntries)
		}
	}
	if chunks[0].Lo != (tombstones.Hash{}) || chunks[len(chunks)-1].Hi != tombstones.Last || len(chunks) >= before/4 {
		t.Errorf("%d chunks left of %d, from %s to %s", len(chunks), before, chunks[0].Lo, chunks[len(chunks)-1].Hi)
	}
	i := 0
	for key, e := range keys {
		if i++; i%50 != 0 && e.UntilDay <= tombstones.Today(c.Now()) {
			continue // every one kept, and a sample of the others
		}
		_, err := s.Get(ctx, "default", key)
		if left := e.UntilDay > tombstones.Today(c.Now()); left != errors.Is(err, intent.ErrExpired) || !left && !errors.Is(err, intent.ErrNotFound) {
			t.Fatalf("Get(%s), kept %v: %v", key, left, err)
		}
	}
}

// What the store knows of the chunks follows the newest version of each
// range, whatever order it learns them in.
func TestChunkMapKeepsTheNewest(t *testing.T) {
	// A hash that starts with b, and then bytes as mixed as a hash's (the
	// filters probe the latter ones).
	mixed := func(b, salt byte) tombstones.Hash {
		x := tombstones.Hash{b}
		for i := 1; i < len(x); i++ {
			x[i] = byte(i*131) ^ salt*53 ^ b*17
		}
		return x
	}
	h := func(b byte) tombstones.Hash { return mixed(b, 0) }
	e := func(b byte) tombstones.Entry { return tombstones.Entry{Hash: mixed(b, 1), UntilDay: 9} }
	whole := tombstones.NewChunk(tombstones.Hash{}, tombstones.Last, []tombstones.Entry{e(0x10), e(0x80)})
	left := tombstones.NewChunk(tombstones.Hash{}, h(0x50), []tombstones.Entry{e(0x10)})
	right := tombstones.NewChunk(h(0x50), tombstones.Last, []tombstones.Entry{e(0x80), e(0x90)})
	none := tombstones.Chunk{Hi: tombstones.Last}
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1}} {
		var m chunkMap
		seen := []struct {
			c   tombstones.Chunk
			rev int64
		}{{none, 0}, {whole, 5}, {left, 9}, {right, 9}}
		for _, i := range order {
			m.observe(seen[i].c, seen[i].rev)
		}
		for _, probe := range []struct {
			h       tombstones.Hash
			hi      tombstones.Hash
			rev     int64
			certify bool
		}{
			{h(0x20), h(0x50), 9, true},
			{h(0x60), tombstones.Last, 9, true},
			{e(0x90).Hash, tombstones.Hash{}, 0, false}, // in right
			{e(0x10).Hash, tombstones.Hash{}, 0, false}, // in left
		} {
			hi, rev, ok := m.certify(probe.h)
			if ok != probe.certify || (ok && (hi != probe.hi || rev != probe.rev)) {
				t.Errorf("order %v: certify(%s) = %s, %d, %v; want %s, %d, %v", order, probe.h, hi, rev, ok, probe.hi, probe.rev, probe.certify)
			}
		}
		if chunks, _ := m.usage(); chunks != 2 {
			t.Errorf("order %v: %d chunks known, want 2", order, chunks)
		}
	}
	var empty chunkMap
	if _, _, ok := empty.certify(h(1)); ok {
		t.Error("a map that knows nothing certifies")
	}
}

// Records due together whose tombstones go into one chunk are removed
// together: a janitor catching up on a backlog rewrites each chunk once a
// page, not once a record; and each is removed exactly as alone (its
// index keys gone, EXPIRED with its state and completion).
func TestDueRemovalsShareChunkRewrites(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	c := &clock{now: time.Date(2030, 3, 1, 9, 0, 0, 0, time.UTC)}
	s := packedStore(t, cli, c)
	ctx := context.Background()
	const n = 400
	ended := map[string]*intent.Intent{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				key := fmt.Sprintf("backlog-%d", i)
				in := finish(t, s, "default", key, []intent.State{intent.StateCancelled, intent.StateCompleted, intent.StateCancelled, intent.StateFailed}[i%4])
				mu.Lock()
				ended[key] = in
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := s.LearnTombstones(ctx); err != nil { // no chunk yet: known as such
		t.Fatal(err)
	}
	c.Advance(2 * time.Hour)
	rev := func() int64 {
		resp, err := cli.Get(ctx, "probe")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := rev()
	rep, err := s.Sweep(ctx)
	if err != nil || rep.Removed != n {
		t.Fatalf("Sweep = %+v, %v; want %d removed", rep, err, n)
	}
	writes := rev() - before
	t.Logf("%d removals in %d etcd writes", n, writes)
	if writes > n/4 {
		t.Errorf("%d removals took %d etcd writes, want them shared (at most %d)", n, writes, n/4)
	}
	if got := packedEntries(t, cli, s.keys); got != n {
		t.Errorf("%d packed tombstones, want %d", got, n)
	}
	for _, prefix := range []string{s.keys.intents("default"), s.keys.tenant("default") + "X", s.keys.prefix + "Xr"} {
		if got := keysUnder(t, cli, prefix); len(got) != 0 {
			t.Errorf("%d keys left under %q, e.g. %q", len(got), prefix, got[0])
		}
	}
	for key, in := range ended {
		_, err := s.Get(ctx, "default", key)
		var exp *intent.ExpiredError
		if !errors.As(err, &exp) || exp.State != in.State || !exp.CompletedAt.Equal(in.CompletedAt.Truncate(time.Second)) {
			t.Fatalf("Get(%s) = %v, want EXPIRED, %v", key, err, in.State)
		}
	}
}

// A replica reads a key's chunk in a range that ends where it knows the
// chunks to end (etcd counts every key of a range). When the chunks moved
// since (merged by another replica's walk), the bounded read finds none,
// and the replica reads again without the bound: every answer stays
// exact.
func TestStaleChunkBoundsReadAgain(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	c := &clock{now: time.Date(2030, 3, 1, 9, 0, 0, 0, time.UTC)}
	s := packedStore(t, cli, c)
	ctx := context.Background()
	today := tombstones.Today(c.Now())
	until := c.Now().Add(48 * time.Hour)
	many := tombstones.NewSet()
	for i := range 8 * tombstones.MaxEntries {
		many.Add(tombstones.NewEntry("default", fmt.Sprintf("many-%d", i), intent.StateCompleted, c.Now(), until), today)
	}
	if err := StoreTombstones(ctx, cli, s.keys.prefix, many); err != nil {
		t.Fatal(err)
	}
	if err := s.LearnTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	// Elsewhere, the chunks are replaced by one holding other keys (as a
	// walk would merge them once their entries expired).
	few := tombstones.NewSet()
	for i := range 10 {
		few.Add(tombstones.NewEntry("default", fmt.Sprintf("few-%d", i), intent.StateFailed, c.Now(), until), today)
	}
	if _, err := cli.Delete(ctx, s.keys.chunks(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if err := StoreTombstones(ctx, cli, s.keys.prefix, few); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		var exp *intent.ExpiredError
		if _, err := s.Get(ctx, "default", fmt.Sprintf("few-%d", i)); !errors.As(err, &exp) || exp.State != intent.StateFailed {
			t.Fatalf("Get(few-%d) = %v, want EXPIRED, FAILED", i, err)
		}
	}
	for i := range 50 {
		if _, err := s.Get(ctx, "default", fmt.Sprintf("many-%d", i)); !errors.Is(err, intent.ErrNotFound) {
			t.Fatalf("Get(many-%d) = %v, want NOT_FOUND: its tombstone is gone", i, err)
		}
	}
	if chunks, _ := s.chunks.usage(); chunks != 1 {
		t.Errorf("the store knows %d chunks, want the one there is", chunks)
	}
}

// A bounded read of a key's chunk ranges over that chunk alone: etcd reads
// the value of one key more than a range's limit (to tell whether there
// are more), so a range that held the next chunk too read two chunks'
// values to answer with one.
func TestBoundedSpotReadsOneChunk(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	c := &clock{now: time.Date(2030, 3, 1, 9, 0, 0, 0, time.UTC)}
	s := packedStore(t, cli, c)
	ctx := context.Background()
	today := tombstones.Today(c.Now())
	set := tombstones.NewSet()
	for i := range 8 * tombstones.MaxEntries {
		set.Add(tombstones.NewEntry("default", fmt.Sprintf("tomb-%d", i), intent.StateCompleted, c.Now(), c.Now().Add(48*time.Hour)), today)
	}
	if err := StoreTombstones(ctx, cli, s.keys.prefix, set); err != nil {
		t.Fatal(err)
	}
	if err := s.LearnTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(set.Chunks()); n < 8 {
		t.Fatalf("%d chunks, want several", n)
	}
	for i := range 200 {
		key := fmt.Sprintf("tomb-%d", i*37%(8*tombstones.MaxEntries))
		ops, bounded := s.spotOps("default", key, true)
		if !bounded {
			t.Fatalf("%s: the store knows its chunk, yet read it unbounded", key)
		}
		chunk := ops[1]
		resp, err := cli.Get(ctx, string(chunk.KeyBytes()), clientv3.WithRange(string(chunk.RangeBytes())), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != 1 {
			t.Fatalf("%s: its chunk's range holds %d chunks, want 1", key, resp.Count)
		}
		if _, err := s.Get(ctx, "default", key); !errors.Is(err, intent.ErrExpired) {
			t.Fatalf("Get(%s) = %v, want EXPIRED", key, err)
		}
	}
}

// TombstonesLearnt closes when LearnTombstones has read every chunk, and
// only then: the daemon gives the start's memory back at that moment.
func TestTombstonesLearntClosesAfterLearning(t *testing.T) {
	_, replica, _ := twoReplicasOneTombstone(t)
	ctx := context.Background()
	select {
	case <-replica.TombstonesLearnt():
		t.Fatal("closed before the replica learnt the chunks")
	default:
	}
	if err := replica.LearnTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-replica.TombstonesLearnt():
	default:
		t.Fatal("still open after LearnTombstones")
	}
	if err := replica.LearnTombstones(ctx); err != nil { // learning again closes nothing twice
		t.Fatal(err)
	}
}
