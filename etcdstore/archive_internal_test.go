package etcdstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/archive"
	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/internal/testing/pgtest"
)

// pgArchive is package archive's PostgreSQL archive as the store's
// Archive: the conversions a program that configures one makes.
type pgArchive struct{ a *archive.Archive }

func (p pgArchive) Put(ctx context.Context, recs []ArchivedRecord) error {
	out := make([]archive.Record, len(recs))
	for i, r := range recs {
		out[i] = archive.Record(r)
	}
	return p.a.Put(ctx, out)
}

func (p pgArchive) Get(ctx context.Context, tenant, key string) (ArchivedRecord, bool, error) {
	r, ok, err := p.a.Get(ctx, tenant, key)
	return ArchivedRecord(r), ok, err
}

func (p pgArchive) Tombstone(ctx context.Context, tenant, key string) (tombstones.Entry, bool, error) {
	return p.a.Tombstone(ctx, tenant, key)
}

func (p pgArchive) PutTombstones(ctx context.Context, es []tombstones.Entry) error {
	return p.a.PutTombstones(ctx, es)
}

func (p pgArchive) Hashes(ctx context.Context, fn func(tombstones.Hash) error) error {
	return p.a.Hashes(ctx, fn)
}

func (p pgArchive) List(ctx context.Context, q ArchiveQuery) ([]ArchivedRecord, error) {
	aq := archive.Query{Tenant: q.Tenant, State: q.State, Label: q.Label, Parent: q.Parent, Limit: q.Limit}
	if q.After != nil {
		aq.After = (*archive.Cursor)(q.After)
	}
	recs, err := p.a.List(ctx, aq)
	out := make([]ArchivedRecord, len(recs))
	for i, r := range recs {
		out[i] = ArchivedRecord(r)
	}
	return out, err
}

// tiers is a test's two tiers: an etcd and a PostgreSQL archive.
type tiers struct {
	cli *clientv3.Client
	pg  *pgtest.Server
	a   *archive.Archive
	c   *clock
}

func startTiers(t testing.TB) *tiers {
	t.Helper()
	pg := pgtest.Start(t)
	a, err := archive.Open(context.Background(), pg.NewDatabase(t), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return &tiers{cli: etcdtest.Start(t).Client(t), pg: pg, a: a, c: &clock{now: time.Now().UTC().Truncate(time.Second)}}
}

// store is a store on the tiers (archive: with the archive), records
// kept a day and moved after an hour.
func (ti *tiers) store(t testing.TB, withArchive bool) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Now = ti.c.Now
	cfg.DefaultRetention, cfg.MaxRetention, cfg.TombstoneRetention = 24*time.Hour, 30*24*time.Hour, 60*24*time.Hour
	cfg.OperationTimeout = 5 * time.Second
	if withArchive {
		cfg.Archive, cfg.ArchiveAfter = pgArchive{ti.a}, time.Hour
	}
	s, err := New(ti.cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if withArchive {
		// The cluster at the archive's format, as the daemon's format
		// member makes it (archivegate.go), and no replica announced.
		s.formats.cluster.Store(FormatArchive)
	}
	return s
}

// etcdValue is the value etcd holds for tenant's key (nil: none).
func (ti *tiers) etcdValue(t *testing.T, s *Store, tenant, key string) []byte {
	t.Helper()
	resp, err := ti.cli.Get(context.Background(), s.keys.intent(tenant, key))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0].Value
}

// replayOf is the acquisition a replay answers for tenant's key (params
// {"n":1}, as finish registers), without its memo.
func replayOf(t *testing.T, s *Store, tenant, key string) *intent.Acquisition {
	t.Helper()
	ctx := context.Background()
	sess, err := s.OpenSession(ctx, tenant, "w2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: tenant, Key: key, SessionID: sess.ID, RequestID: "again",
		Register: &intent.Registration{Tenant: tenant, Key: key, Params: []byte(`{"n":1}`)}})
	if err != nil {
		t.Fatalf("replay %s: %v", key, err)
	}
	a.Memo = nil
	return a
}

// A final record moved to the archive answers exactly as before, from a
// store that never saw it: the same replay, the same Get (history
// included), the same registration answer (never created again), the same
// mismatch for other terms; the archive holds etcd's value byte for byte,
// and etcd holds nothing of it, index keys included.
func TestArchiveMoveKeepsEveryAnswer(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	states := map[string]intent.State{"done": intent.StateCompleted, "failed": intent.StateFailed, "cancelled": intent.StateCancelled}
	before := map[string]*intent.Acquisition{}
	gets := map[string]*intent.Intent{}
	values := map[string][]byte{}
	for key, st := range states {
		finish(t, s, "t1", key, st)
		before[key] = replayOf(t, s, "t1", key)
		in, err := s.Get(ctx, "t1", key)
		if err != nil {
			t.Fatal(err)
		}
		gets[key] = in
		values[key] = ti.etcdValue(t, s, "t1", key)
	}
	if r, err := s.Sweep(ctx); err != nil || r.Archived != 0 {
		t.Fatalf("a sweep within the hour: %+v %v, want nothing archived", r, err)
	}
	ti.c.Advance(2 * time.Hour)
	r, err := s.Sweep(ctx)
	if err != nil || r.Archived != len(states) || r.Removed != 0 {
		t.Fatalf("sweep: %+v %v, want %d archived", r, err, len(states))
	}
	if st := s.ArchiveStats(); st.Moved != int64(len(states)) || st.Lag != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Nothing of the moved records is left in etcd but the chunk.
	resp, err := ti.cli.Get(ctx, s.keys.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if bytes.Contains(kv.Key, []byte("/i/")) || bytes.Contains(kv.Key, []byte("Xr")) || bytes.Contains(kv.Key, []byte("/Xs")) {
			t.Errorf("etcd still holds %q", k)
		}
	}
	fresh := ti.store(t, true)
	for key, st := range states {
		rec, ok, err := ti.a.Get(ctx, "t1", key)
		if err != nil || !ok || !bytes.Equal(rec.Data, values[key]) || rec.State != st {
			t.Fatalf("archive's %s: %v %v, data equal %v", key, ok, err, bytes.Equal(rec.Data, values[key]))
		}
		if got := replayOf(t, fresh, "t1", key); !reflect.DeepEqual(got, before[key]) {
			t.Errorf("%s replayed from the archive:\n%+v\nwant\n%+v", key, got, before[key])
		}
		if got := replayOf(t, s, "t1", key); !reflect.DeepEqual(got, before[key]) {
			t.Errorf("%s replayed by the store that moved it:\n%+v\nwant\n%+v", key, got, before[key])
		}
		in, err := fresh.Get(ctx, "t1", key)
		if err != nil || !reflect.DeepEqual(in, gets[key]) {
			t.Errorf("Get %s from the archive: %v\n%+v\nwant\n%+v", key, err, in, gets[key])
		}
		in, created, err := fresh.Register(ctx, intent.Registration{Tenant: "t1", Key: key, Params: []byte(`{"n":1}`)})
		if err != nil || created || in.State != st {
			t.Errorf("Register %s again: %v created %v %v", key, in, created, err)
		}
		_, _, err = fresh.Register(ctx, intent.Registration{Tenant: "t1", Key: key, Params: []byte(`{"n":2}`)})
		if !errors.Is(err, intent.ErrFingerprintMismatch) {
			t.Errorf("Register %s with other terms: %v, want a fingerprint mismatch", key, err)
		}
		// Another tenant's key answers as a key nowhere.
		if _, err := fresh.Get(ctx, "t2", key); !errors.Is(err, intent.ErrNotFound) {
			t.Errorf("t2's %s: %v, want not found", key, err)
		}
		if v := ti.etcdValue(t, s, "t1", key); v != nil {
			t.Errorf("%s is in etcd again", key)
		}
	}
	// A late report on an archived intent is refused at once, not retried
	// until the operation's timeout.
	start := time.Now()
	_, err = fresh.Report(ctx, intent.Report{Tenant: "t1", Key: "done", Token: 1, Kind: intent.ReportComplete, Result: &intent.Result{Payload: []byte(`{}`)}})
	if err == nil || errors.Is(err, intent.ErrUnavailable) || time.Since(start) > 2*time.Second {
		t.Errorf("a stale report on an archived intent: %v after %v", err, time.Since(start))
	}
}

// A pass that wrote the archive and stopped before etcd's delete (a crash)
// leaves the record in etcd, answering as before; the next pass writes the
// archive again (idempotent) and deletes it: one record.
func TestArchiveCrashBetweenWriteAndDelete(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	finish(t, s, "t1", "k", intent.StateCompleted)
	want := replayOf(t, s, "t1", "k")
	ti.c.Advance(2 * time.Hour)
	page := []dueEntry{{tenant: "t1", key: "k"}}
	cands, err := s.readMoveCands(ctx, page, ti.c.Now())
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v %v", cands, err)
	}
	if err := s.putArchived(ctx, cands); err != nil {
		t.Fatal(err)
	}
	// The crash: no delete. Both tiers hold it; every answer is the same.
	if got := replayOf(t, ti.store(t, true), "t1", "k"); !reflect.DeepEqual(got, want) {
		t.Fatalf("between the steps: %+v, want %+v", got, want)
	}
	r, err := s.Sweep(ctx)
	if err != nil || r.Archived != 1 {
		t.Fatalf("the next pass: %+v %v", r, err)
	}
	if ti.etcdValue(t, s, "t1", "k") != nil {
		t.Fatal("still in etcd")
	}
	recs, err := ti.a.List(ctx, archive.Query{Tenant: "t1"})
	if err != nil || len(recs) != 1 {
		t.Fatalf("archive holds %d records (%v), want 1", len(recs), err)
	}
	if got := replayOf(t, ti.store(t, true), "t1", "k"); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the move: %+v, want %+v", got, want)
	}
	// The steps of a pass that found the record gone do nothing.
	if n, err := s.dropMoved(ctx, cands); err != nil || n != 0 {
		t.Fatalf("deleting again: %d %v", n, err)
	}
}

// Two archivers at once (two replicas sweeping together) move each record
// once and lose none.
func TestTwoArchiversAtOnce(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	a, b := ti.store(t, true), ti.store(t, true)
	const n = 40
	for i := range n {
		finish(t, a, "t1", fmt.Sprintf("k%02d", i), intent.StateCancelled)
	}
	ti.c.Advance(2 * time.Hour)
	var wg sync.WaitGroup
	var ra, rb SweepReport
	var ea, eb error
	wg.Add(2)
	go func() { defer wg.Done(); ra, ea = a.Sweep(ctx) }()
	go func() { defer wg.Done(); rb, eb = b.Sweep(ctx) }()
	wg.Wait()
	if ea != nil || eb != nil {
		t.Fatal(ea, eb)
	}
	if ra.Archived+rb.Archived != n {
		t.Fatalf("moved %d + %d, want %d in all", ra.Archived, rb.Archived, n)
	}
	recs, err := ti.a.List(ctx, archive.Query{Tenant: "t1", Limit: 2 * n})
	if err != nil || len(recs) != n {
		t.Fatalf("archive holds %d (%v), want %d", len(recs), err, n)
	}
	for i := range n {
		in, err := ti.store(t, true).Get(ctx, "t1", fmt.Sprintf("k%02d", i))
		if err != nil || in.State != intent.StateCancelled {
			t.Fatalf("k%02d: %v %v", i, in, err)
		}
	}
}

// A registration decided on a read that found the key nowhere, while the
// key was registered, finished and moved by another replica before the
// registration's write, never creates a second intent: the move rewrote
// the key's tombstone chunk, the write's guard fails, and the read again
// finds the archived record.
func TestRegistrationRacingAMove(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s, other := ti.store(t, true), ti.store(t, true)
	var fired atomic.Bool // the hook's own calls (other's lookups) pass through
	archiveLookupHook = func(tenant, key string) {
		if key != "raced" || !fired.CompareAndSwap(false, true) {
			return
		}
		func() {
			if _, _, err := other.Register(ctx, intent.Registration{Tenant: tenant, Key: key, Params: []byte(`{"n":2}`)}); err != nil {
				t.Error(err)
				return
			}
			if _, err := other.Cancel(ctx, intent.Cancellation{Tenant: tenant, Key: key, Actor: "tester", Reason: "withdrawn"}); err != nil {
				t.Error(err)
				return
			}
			ti.c.Advance(2 * time.Hour)
			if r, err := other.Sweep(ctx); err != nil || r.Archived != 1 {
				t.Errorf("the racing move: %+v %v", r, err)
			}
		}()
	}
	t.Cleanup(func() { archiveLookupHook = nil })
	_, created, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "raced", Params: []byte(`{"n":1}`)})
	if !errors.Is(err, intent.ErrFingerprintMismatch) || created {
		t.Fatalf("the raced registration: created %v, %v; want the archived intent's fingerprint mismatch", created, err)
	}
	if ti.etcdValue(t, s, "t1", "raced") != nil {
		t.Fatal("a second intent in etcd")
	}
	// The same race on Acquire's write without a read (the store knows
	// the key's chunk and its filter rules the key out).
	fired.Store(false)
	archiveLookupHook = func(tenant, key string) {
		if key != "raced2" || !fired.CompareAndSwap(false, true) {
			return
		}
		func() {
			if _, _, err := other.Register(ctx, intent.Registration{Tenant: tenant, Key: key, Params: []byte(`{"n":2}`)}); err != nil {
				t.Error(err)
			}
			if _, err := other.Cancel(ctx, intent.Cancellation{Tenant: tenant, Key: key, Actor: "tester", Reason: "withdrawn"}); err != nil {
				t.Error(err)
			}
			ti.c.Advance(2 * time.Hour)
			if r, err := other.Sweep(ctx); err != nil || r.Archived != 1 {
				t.Errorf("the racing move: %+v %v", r, err)
			}
		}()
	}
	sess, err := s.OpenSession(ctx, "t1", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: "raced2", SessionID: sess.ID, RequestID: "r",
		Register: &intent.Registration{Tenant: "t1", Key: "raced2", Params: []byte(`{"n":1}`)}})
	if !errors.Is(err, intent.ErrFingerprintMismatch) {
		t.Fatalf("the raced acquire: %v; want the archived intent's fingerprint mismatch", err)
	}
	if ti.etcdValue(t, s, "t1", "raced2") != nil {
		t.Fatal("a second intent in etcd")
	}
}

// With the archive stopped, calls on live intents keep working; a call
// that must ask the archive fails at once with ErrArchiveUnavailable
// (also ErrUnavailable); the archiver pauses and its lag shows; once the
// archive is back, everything moves.
func TestArchiveStopped(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	finish(t, s, "t1", "old", intent.StateCompleted)
	ti.c.Advance(2 * time.Hour)
	if r, err := s.Sweep(ctx); err != nil || r.Archived != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	finish(t, s, "t1", "done", intent.StateCompleted)
	if _, _, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "live", Params: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	if err := ti.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	fresh := ti.store(t, true)
	// Live and hot intents: etcd alone.
	sess, err := fresh.OpenSession(ctx, "t1", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a, err := fresh.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: "live", SessionID: sess.ID, RequestID: "r"})
	if err != nil || a.Outcome != intent.OutcomeExecute {
		t.Fatalf("acquire a live intent: %v %v", a, err)
	}
	if _, err := fresh.Report(ctx, intent.Report{Tenant: "t1", Key: "live", Token: a.Lease.Token, Kind: intent.ReportComplete, Result: &intent.Result{Payload: []byte(`{}`)}}); err != nil {
		t.Fatalf("complete a live intent: %v", err)
	}
	if got := replayOf(t, fresh, "t1", "done"); got.Outcome != intent.OutcomeCompleted {
		t.Fatalf("replay of a hot final intent: %+v", got)
	}
	// A young intent's Get: its children cannot be in the archive yet.
	if in, err := fresh.Get(ctx, "t1", "live"); err != nil || in.State != intent.StateCompleted {
		t.Fatalf("get a young intent: %v %v", in, err)
	}
	// What only the archive can answer.
	for name, call := range map[string]func() error{
		"get archived": func() error { _, err := fresh.Get(ctx, "t1", "old"); return err },
		"register new": func() error {
			_, _, err := fresh.Register(ctx, intent.Registration{Tenant: "t1", Key: "new", Params: []byte(`{"n":1}`)})
			return err
		},
		"acquire new": func() error {
			_, err := fresh.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: "new2", SessionID: sess.ID, RequestID: "r2",
				Register: &intent.Registration{Tenant: "t1", Key: "new2", Params: []byte(`{"n":1}`)}})
			return err
		},
		"list": func() error {
			_, err := fresh.List(ctx, intent.ListQuery{Filter: intent.Filter{Tenant: "t1"}})
			return err
		},
	} {
		start := time.Now()
		err := call()
		if !errors.Is(err, intent.ErrArchiveUnavailable) || !errors.Is(err, intent.ErrUnavailable) {
			t.Errorf("%s: %v, want the archive unavailable", name, err)
		}
		if d := time.Since(start); d > 4*time.Second {
			t.Errorf("%s took %v: not at once", name, d)
		}
	}
	ti.c.Advance(2 * time.Hour)
	if _, err := s.Sweep(ctx); !errors.Is(err, intent.ErrArchiveUnavailable) {
		t.Fatalf("a sweep without the archive: %v", err)
	}
	if st := s.ArchiveStats(); st.Lag <= 0 || st.Unavailable == 0 {
		t.Fatalf("stats without the archive: %+v", st)
	}
	if ti.etcdValue(t, s, "t1", "done") == nil {
		t.Fatal("a record left etcd while the archive was down")
	}
	if err := ti.pg.Start(); err != nil {
		t.Fatal(err)
	}
	r, err := s.Sweep(ctx)
	for i := 0; err != nil && i < 50; i++ { // the pool reconnects
		time.Sleep(100 * time.Millisecond)
		r, err = s.Sweep(ctx)
	}
	if err != nil || r.Archived != 2 {
		t.Fatalf("once the archive is back: %+v %v", r, err)
	}
	if st := s.ArchiveStats(); st.Lag != 0 {
		t.Fatalf("lag after catching up: %+v", st)
	}
}

// A listing goes through both tiers with one cursor: every intent once, in
// registration order, whichever page and tier; with filters; and an
// intent's children are found in both.
func TestListAcrossTiers(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	if _, _, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "parent", Params: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	var want []string
	reg := func(key string, cancel bool) {
		ti.c.Advance(time.Millisecond)
		r := intent.Registration{Tenant: "t1", Key: key, Params: []byte(`{}`), ParentKey: "parent", Labels: map[string]string{"half": key[:1]}}
		if _, _, err := s.Register(ctx, r); err != nil {
			t.Fatal(err)
		}
		want = append(want, key)
		if cancel {
			if _, err := s.Cancel(ctx, intent.Cancellation{Tenant: "t1", Key: key, Actor: "tester", Reason: "x"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 12 {
		reg(fmt.Sprintf("a%02d", i), true)
	}
	ti.c.Advance(2 * time.Hour)
	for i := range 12 {
		reg(fmt.Sprintf("b%02d", i), i%2 == 0) // half live, half hot and final
	}
	if r, err := s.Sweep(ctx); err != nil || r.Archived != 12 {
		t.Fatalf("%+v %v", r, err)
	}
	list := func(f intent.Filter) []string {
		f.Tenant = "t1"
		var got []string
		token := ""
		for range 20 {
			p, err := s.List(ctx, intent.ListQuery{Filter: f, PageSize: 5, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range p.Intents {
				got = append(got, in.Key)
			}
			if token = p.NextPageToken; token == "" {
				return got
			}
		}
		t.Fatal("no end")
		return nil
	}
	all := append([]string{"parent"}, want...)
	if got := list(intent.Filter{}); !reflect.DeepEqual(got, all) {
		t.Errorf("all:\n%v\nwant\n%v", got, all)
	}
	if got := list(intent.Filter{ParentKey: "parent"}); !reflect.DeepEqual(got, want) {
		t.Errorf("by parent:\n%v\nwant\n%v", got, want)
	}
	if got := list(intent.Filter{Label: &intent.Label{Name: "half", Value: "a"}}); !reflect.DeepEqual(got, want[:12]) {
		t.Errorf("by label:\n%v\nwant\n%v", got, want[:12])
	}
	var cancelled []string
	for i, k := range want {
		if i < 12 || (i-12)%2 == 0 {
			cancelled = append(cancelled, k)
		}
	}
	if got := list(intent.Filter{States: []intent.State{intent.StateCancelled}}); !reflect.DeepEqual(got, cancelled) {
		t.Errorf("cancelled:\n%v\nwant\n%v", got, cancelled)
	}
	in, err := s.Get(ctx, "t1", "parent")
	if err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, c := range in.Children {
		kids = append(kids, c.Key)
	}
	if !reflect.DeepEqual(kids, want) {
		t.Errorf("children:\n%v\nwant\n%v", kids, want)
	}
	if p, err := s.List(ctx, intent.ListQuery{Filter: intent.Filter{Tenant: "t2"}}); err != nil || len(p.Intents) != 0 {
		t.Errorf("another tenant lists %v %v", p, err)
	}
}

// Turning the archive on for an installation that holds finished intents
// in etcd moves them all, including those of a retention longer than the
// default (found by the backfill), and nothing is lost.
func TestTurningTheArchiveOn(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	before := ti.store(t, false)
	const n = 30
	for i := range n {
		finish(t, before, "t1", fmt.Sprintf("k%02d", i), intent.StateCancelled)
	}
	long := intent.Registration{Tenant: "t1", Key: "long", Params: []byte(`{}`), Retention: 20 * 24 * time.Hour}
	if _, _, err := before.Register(ctx, long); err != nil {
		t.Fatal(err)
	}
	if _, err := before.Cancel(ctx, intent.Cancellation{Tenant: "t1", Key: "long", Actor: "tester", Reason: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := before.Register(ctx, intent.Registration{Tenant: "t1", Key: "live", Params: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	ti.c.Advance(2 * time.Hour)
	s := ti.store(t, true)
	r, err := s.Sweep(ctx)
	if err != nil || r.Archived != n+1 {
		t.Fatalf("the first pass: %+v %v, want %d archived", r, err, n+1)
	}
	if !s.ArchiveStats().Backfilled {
		t.Fatal("not backfilled")
	}
	for i := range n {
		key := fmt.Sprintf("k%02d", i)
		if ti.etcdValue(t, s, "t1", key) != nil {
			t.Fatalf("%s still in etcd", key)
		}
		if in, err := ti.store(t, true).Get(ctx, "t1", key); err != nil || in.State != intent.StateCancelled {
			t.Fatalf("%s: %v %v", key, in, err)
		}
	}
	if in, err := s.Get(ctx, "t1", "live"); err != nil || in.State != intent.StatePending {
		t.Fatalf("live: %v %v", in, err)
	}
}

// A completion whose outbox names a child the archive holds leaves it
// alone (the same terms) or is refused (others): never a second intent.
func TestOutboxChildInTheArchive(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	if _, _, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "p", Params: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	child := intent.Registration{Tenant: "t1", Key: "c", Params: []byte(`{"n":1}`), ParentKey: "p"}
	if _, _, err := s.Register(ctx, child); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(ctx, intent.Cancellation{Tenant: "t1", Key: "c", Actor: "tester", Reason: "x"}); err != nil {
		t.Fatal(err)
	}
	ti.c.Advance(2 * time.Hour)
	if r, err := s.Sweep(ctx); err != nil || r.Archived != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	sess, err := s.OpenSession(ctx, "t1", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: "p", SessionID: sess.ID, RequestID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	other := child
	other.Params = []byte(`{"n":2}`)
	report := intent.Report{Tenant: "t1", Key: "p", Token: a.Lease.Token, Kind: intent.ReportComplete, Result: &intent.Result{Payload: []byte(`{}`)}}
	report.Children = []intent.Registration{other}
	if _, err := s.Report(ctx, report); !errors.Is(err, intent.ErrFingerprintMismatch) {
		t.Fatalf("a child of other terms than the archived one: %v, want a fingerprint mismatch", err)
	}
	report.Children = []intent.Registration{child}
	if _, err := s.Report(ctx, report); err != nil {
		t.Fatal(err)
	}
	if ti.etcdValue(t, s, "t1", "c") != nil {
		t.Fatal("the archived child was created again")
	}
	if in, err := s.Get(ctx, "t1", "c"); err != nil || in.State != intent.StateCancelled {
		t.Fatalf("the child: %v %v", in, err)
	}
}

// A move is no transition: a watcher of the tenant sees no event of it.
func TestWatchersSeeNoMove(t *testing.T) {
	ti := startTiers(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := ti.store(t, true)
	finish(t, s, "t1", "k", intent.StateCancelled)
	events := make(chan intent.WatchEvent, 100)
	go func() {
		_ = s.Watch(ctx, intent.WatchQuery{Filter: intent.Filter{Tenant: "t1"}, NotifyCreated: true}, func(e intent.WatchEvent) error {
			events <- e
			return nil
		})
	}()
	select {
	case e := <-events:
		if !e.Created {
			t.Fatalf("first event %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch")
	}
	ti.c.Advance(2 * time.Hour)
	if r, err := s.Sweep(ctx); err != nil || r.Archived != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	if _, _, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "marker", Params: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case e := <-events:
			if e.Intent != nil && e.Intent.Key == "marker" {
				return
			}
			t.Fatalf("an event of the move: %+v", e)
		case <-time.After(10 * time.Second):
			t.Fatal("no marker")
		}
	}
}

// A key the archive keeps a tombstone of (its record expired there)
// answers EXPIRED to Register, Acquire (its outcome) and Get, and is never created
// again.
func TestArchivedTombstoneAnswersExpired(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	now := ti.c.Now()
	e := tombstones.NewEntry("t1", "gone", intent.StateCompleted, now.Add(-48*time.Hour), now.Add(30*24*time.Hour))
	if err := ti.a.PutTombstones(ctx, []tombstones.Entry{e}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "gone", Params: []byte(`{}`)}); !errors.Is(err, intent.ErrExpired) {
		t.Fatalf("register: %v, want expired", err)
	}
	if _, err := s.Get(ctx, "t1", "gone"); !errors.Is(err, intent.ErrExpired) {
		t.Fatalf("get: %v, want expired", err)
	}
	sess, err := s.OpenSession(ctx, "t1", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	acq, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: "gone", SessionID: sess.ID, RequestID: "r",
		Register: &intent.Registration{Tenant: "t1", Key: "gone", Params: []byte(`{}`)}})
	if err != nil || acq.Outcome != intent.OutcomeExpired {
		t.Fatalf("acquire: %+v %v, want EXPIRED", acq, err)
	}
	if _, err := s.Get(ctx, "t2", "gone"); !errors.Is(err, intent.ErrNotFound) {
		t.Fatalf("another tenant's: %v, want not found", err)
	}
	if ti.etcdValue(t, s, "t1", "gone") != nil {
		t.Fatal("created")
	}
}
