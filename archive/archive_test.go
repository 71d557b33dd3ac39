package archive_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/intentd/intentd/archive"
	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/pgtest"
)

// now is the tests' clock: a fixed day, so that partitions are
// predictable.
var now = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// open starts a PostgreSQL server and opens an archive on a database of
// its own.
func open(t *testing.T) (*archive.Archive, *pgtest.Server, string) { return openB(t) }

func openB(t testing.TB) (*archive.Archive, *pgtest.Server, string) {
	t.Helper()
	s := pgtest.Start(t)
	dsn := s.NewDatabase(t)
	a, err := archive.Open(ctxT(t), dsn, archive.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(a.Close)
	return a, s, dsn
}

func rec(tenant, key string, rev int64, data string) archive.Record {
	return archive.Record{
		Tenant: tenant, Key: key, State: intent.StateCompleted,
		Fingerprint:  strings.Repeat("ab", 32),
		RegisteredAt: now.Add(-time.Hour), CompletedAt: now.Add(-time.Minute),
		RetainUntil: now.Add(30 * 24 * time.Hour), Revision: rev, Data: []byte(data),
	}
}

func TestPutGetRoundTrip(t *testing.T) {
	a, _, _ := open(t)
	ctx := ctxT(t)
	big := make([]byte, 64<<10)
	for i := range big {
		big[i] = byte(rand.IntN(256))
	}
	cases := []struct {
		name string
		r    archive.Record
	}{
		{"plain", rec("default", "k-plain", 10, "value")},
		{"labels and parent", func() archive.Record {
			r := rec("default", "k-child", 11, "child")
			r.Parent, r.Labels = "k-plain", []intent.Label{{Name: "team", Value: "ops"}, {Name: "a", Value: "x=y"}, {Name: "empty", Value: ""}}
			return r
		}()},
		{"failed, nanoseconds kept", func() archive.Record {
			r := rec("default", "k-failed", 12, "f")
			r.State = intent.StateFailed
			r.RegisteredAt = time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
			return r
		}()},
		{"cancelled, no completion time", func() archive.Record {
			r := rec("default", "k-cancelled", 13, "c")
			r.State, r.CompletedAt = intent.StateCancelled, time.Time{}
			return r
		}()},
		{"a fingerprint that is not lowercase hex", func() archive.Record {
			r := rec("default", "k-fp", 14, "x")
			r.Fingerprint = "ABCDEF-not-hex"
			return r
		}()},
		{"an uppercase hex fingerprint stays as it is", func() archive.Record {
			r := rec("default", "k-fp-upper", 14, "x")
			r.Fingerprint = "ABCD"
			return r
		}()},
		{"a fingerprint of 32 characters", func() archive.Record {
			r := rec("default", "k-fp-32", 14, "x")
			r.Fingerprint = strings.Repeat("z", 32)
			return r
		}()},
		{"a fingerprint of 32 characters ending in NUL", func() archive.Record {
			r := rec("default", "k-fp-32-nul", 14, "x")
			r.Fingerprint = strings.Repeat("z", 31) + "\x00"
			return r
		}()},
		{"33 characters ending in NUL", func() archive.Record {
			r := rec("default", "k-fp-33-nul", 14, "x")
			r.Fingerprint = strings.Repeat("z", 32) + "\x00"
			return r
		}()},
		{"64 characters of uppercase hex", func() archive.Record {
			r := rec("default", "k-fp-64-upper", 14, "x")
			r.Fingerprint = strings.Repeat("AB", 32)
			return r
		}()},
		{"no fingerprint", func() archive.Record {
			r := rec("default", "k-nofp", 15, "x")
			r.Fingerprint = ""
			return r
		}()},
		{"empty data", rec("default", "k-empty", 16, "")},
		{"binary data with NULs", rec("default", "k-bin", 17, "\x00\x01\xff\x00compressed?\x00")},
		{"64 KiB of data, out of line", func() archive.Record {
			r := rec("default", "k-big", 18, "")
			r.Data = big
			return r
		}()},
		{"another tenant, same key", rec("other", "k-plain", 19, "other's")},
		{"a key of 256 bytes", rec("default", strings.Repeat("k", 256), 20, "long")},
	}
	var all []archive.Record
	for _, c := range cases {
		all = append(all, c.r)
	}
	// Half put, half seeded: both store alike.
	if err := a.Put(ctx, all[:len(all)/2]); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if err := a.Seed(ctx, all[len(all)/2:]); err != nil {
		t.Fatalf("Seed: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := a.Get(ctx, c.r.Tenant, c.r.Key)
			if err != nil || !ok {
				t.Fatalf("Get: %v, %v", ok, err)
			}
			if !bytes.Equal(got.Data, c.r.Data) {
				t.Errorf("data: %d bytes back, want the %d put", len(got.Data), len(c.r.Data))
			}
			want := c.r
			if want.Data == nil {
				want.Data = []byte{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("round trip (-put +got):\n%s", diff)
			}
		})
	}
}

func TestPutRefusesWhatIsNotAFinalRecord(t *testing.T) {
	a, _, _ := open(t)
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		r    archive.Record
	}{
		{"pending", func() archive.Record { r := rec("default", "k", 1, "x"); r.State = intent.StatePending; return r }()},
		{"needs review", func() archive.Record { r := rec("default", "k", 1, "x"); r.State = intent.StateNeedsReview; return r }()},
		{"no tenant", rec("", "k", 1, "x")},
		{"no key", rec("default", "", 1, "x")},
		{"a label name with '='", func() archive.Record {
			r := rec("default", "k", 1, "x")
			r.Labels = []intent.Label{{Name: "a=b", Value: "c"}}
			return r
		}()},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := a.Put(ctx, []archive.Record{c.r}); err == nil || errors.Is(err, archive.ErrUnavailable) {
				t.Fatalf("Put: %v, want a refusal", err)
			}
		})
	}
	if _, ok, err := a.Get(ctx, "default", "k"); ok || err != nil {
		t.Fatalf("a refused record was stored: %v, %v", ok, err)
	}
}

func TestPutIsIdempotent(t *testing.T) {
	a, _, _ := open(t)
	ctx := ctxT(t)
	cases := []struct {
		name     string
		second   archive.Record
		wantData string
		wantRev  int64
	}{
		{"the same record again", rec("default", "k", 100, "first"), "first", 100},
		{"the same revision, other bytes: left as it is", rec("default", "k", 100, "second"), "first", 100},
		{"an older revision: left as it is", rec("default", "k", 99, "older"), "first", 100},
		{"a newer revision replaces it", rec("default", "k", 101, "newer"), "newer", 101},
		{"and the older one again changes nothing", rec("default", "k", 100, "first"), "newer", 101},
	}
	if err := a.Put(ctx, []archive.Record{rec("default", "k", 100, "first")}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := a.Put(ctx, []archive.Record{c.second}); err != nil {
				t.Fatal(err)
			}
			got, ok, err := a.Get(ctx, "default", "k")
			if err != nil || !ok {
				t.Fatalf("Get: %v, %v", ok, err)
			}
			if string(got.Data) != c.wantData || got.Revision != c.wantRev {
				t.Fatalf("got %q at %d, want %q at %d", got.Data, got.Revision, c.wantData, c.wantRev)
			}
		})
	}
	t.Run("one batch holding a key twice keeps the higher revision", func(t *testing.T) {
		if err := a.Put(ctx, []archive.Record{rec("default", "twice", 5, "b"), rec("default", "twice", 3, "a")}); err != nil {
			t.Fatal(err)
		}
		got, _, err := a.Get(ctx, "default", "twice")
		if err != nil || string(got.Data) != "b" {
			t.Fatalf("got %q, %v; want b", got.Data, err)
		}
	})
	t.Run("a batch is one transaction", func(t *testing.T) {
		// The second record's state is refused by PostgreSQL (a smallint
		// out of range is refused by Go first: use a value the schema
		// takes but a failed statement instead: a key of a NUL).
		err := a.Put(ctx, []archive.Record{rec("default", "batch-1", 1, "x"), rec("default", "bad\x00key", 1, "x")})
		if err == nil {
			t.Fatal("a key holding NUL was stored")
		}
		if _, ok, _ := a.Get(ctx, "default", "batch-1"); ok {
			t.Fatal("the batch's first record was stored though the batch failed")
		}
	})
}

func TestTenantIsolation(t *testing.T) {
	a, _, _ := open(t)
	ctx := ctxT(t)
	mine := rec("acme", "shared-key", 1, "acme's")
	if err := a.Put(ctx, []archive.Record{mine}); err != nil {
		t.Fatal(err)
	}
	if err := a.PutTombstones(ctx, []tombstones.Entry{tombstones.NewEntry("acme", "gone", intent.StateCompleted, now, now.Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name        string
		tenant, key string
		want        bool
	}{
		{"the owner", "acme", "shared-key", true},
		{"another tenant", "globex", "shared-key", false},
		{"a tenant that is a prefix", "acm", "shared-key", false},
		{"the default tenant", intent.DefaultTenant, "shared-key", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ok, err := a.Get(ctx, c.tenant, c.key)
			if err != nil || ok != c.want {
				t.Errorf("Get: %v, %v; want %v", ok, err, c.want)
			}
			list, err := a.List(ctx, archive.Query{Tenant: c.tenant})
			if err != nil || (len(list) == 1) != c.want {
				t.Errorf("List: %d records, %v; want them only for the owner", len(list), err)
			}
			_, ok, err = a.Tombstone(ctx, c.tenant, "gone")
			if err != nil || ok != c.want {
				t.Errorf("Tombstone: %v, %v; want %v", ok, err, c.want)
			}
		})
	}
	if _, err := a.List(ctx, archive.Query{}); err == nil {
		t.Error("List without a tenant answered")
	}
}

func TestTombstoneLookupsAreExact(t *testing.T) {
	a, _, dsn := open(t)
	ctx := ctxT(t)
	var es []tombstones.Entry
	for i := range 2000 {
		es = append(es, tombstones.NewEntry("default", fmt.Sprintf("key-%d", i), intent.State([]int{4, 5, 7}[i%3]),
			now.Add(-time.Duration(i)*time.Second), now.Add(time.Duration(i%800)*24*time.Hour)))
	}
	if err := a.PutTombstones(ctx, es); err != nil {
		t.Fatal(err)
	}
	// Again, and again in pieces: nothing changes.
	if err := a.PutTombstones(ctx, es); err != nil {
		t.Fatal(err)
	}
	if err := a.PutTombstones(ctx, es[:10]); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1, 2, 799, 800, 1999} {
		got, ok, err := a.Tombstone(ctx, "default", fmt.Sprintf("key-%d", i))
		if err != nil || !ok || got != es[i] {
			t.Errorf("key-%d: %+v, %v, %v; want %+v", i, got, ok, err, es[i])
		}
	}
	for _, key := range []string{"key-2000", "key-", "Key-1", "key-1 "} {
		if got, ok, err := a.Tombstone(ctx, "default", key); ok || err != nil {
			t.Errorf("%q: %+v, %v, %v; want none", key, got, ok, err)
		}
	}
	var n int64
	if err := connect(t, dsn).QueryRow(ctx, "SELECT count(*) FROM tombstones").Scan(&n); err != nil || n != int64(len(es)) {
		t.Fatalf("%d rows, %v; want %d: PutTombstones is not idempotent", n, err, len(es))
	}
	t.Run("the same key tombstoned twice: the later ending one", func(t *testing.T) {
		early := tombstones.NewEntry("default", "again", intent.StateFailed, now, now.Add(24*time.Hour))
		late := tombstones.NewEntry("default", "again", intent.StateCompleted, now.Add(time.Hour), now.Add(400*24*time.Hour))
		if err := a.PutTombstones(ctx, []tombstones.Entry{late, early}); err != nil {
			t.Fatal(err)
		}
		if got, ok, err := a.Tombstone(ctx, "default", "again"); err != nil || !ok || got != late {
			t.Fatalf("%+v, %v, %v; want %+v", got, ok, err, late)
		}
	})
	t.Run("completion past 2038 and unknown", func(t *testing.T) {
		far := tombstones.NewEntry("default", "far", intent.StateCompleted, time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), now.Add(24*time.Hour))
		unknown := tombstones.NewEntry("default", "unknown", intent.StateCompleted, time.Time{}, now.Add(24*time.Hour))
		if err := a.PutTombstones(ctx, []tombstones.Entry{far, unknown}); err != nil {
			t.Fatal(err)
		}
		for _, e := range []tombstones.Entry{far, unknown} {
			if got, ok, err := a.Tombstone(ctx, "default", map[bool]string{true: "far", false: "unknown"}[e == far]); err != nil || !ok || got != e {
				t.Errorf("%+v, %v, %v; want %+v", got, ok, err, e)
			}
		}
	})
}

// connect is a connection to the archive's database, for what the tests
// check behind its back.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctxT(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestExpire(t *testing.T) {
	a, _, _ := open(t)
	ctx := ctxT(t)
	var recs []archive.Record
	for i := range 250 {
		r := rec("default", fmt.Sprintf("k-%03d", i), int64(i+1), "data")
		r.State = intent.State([]int{4, 5, 7}[i%3])
		r.RetainUntil = now.Add(time.Duration(i-100) * time.Minute) // 101 of them past by now
		recs = append(recs, r)
	}
	if err := a.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}
	st, err := a.Expire(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tombstoned != 101 {
		t.Fatalf("Tombstoned %d, want 101", st.Tombstoned)
	}
	// The months before the one a tombstone made now ends in take no
	// more tombstones: their indexes were packed, once.
	if st.PartitionsPacked != 24 {
		t.Errorf("packed %d months, want 24 (2026-12 to 2028-11)", st.PartitionsPacked)
	}
	for i, r := range recs {
		_, kept, err := a.Get(ctx, r.Tenant, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		e, tomb, err := a.Tombstone(ctx, r.Tenant, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		past := !r.RetainUntil.After(now)
		if kept == past || tomb != past {
			t.Fatalf("%s (retained until %v): kept %v, tombstone %v", r.Key, r.RetainUntil, kept, tomb)
		}
		if past {
			want := tombstones.NewEntry(r.Tenant, r.Key, r.State, r.CompletedAt, now.Add(2*365*24*time.Hour))
			if e != want {
				t.Fatalf("%d: tombstone %+v, want %+v", i, e, want)
			}
		}
	}
	// Once more: nothing left to do.
	if st, err := a.Expire(ctx, now); err != nil || st.Tombstoned != 0 || st.PartitionsDropped != 0 || st.PartitionsPacked != 0 {
		t.Fatalf("again: %+v, %v", st, err)
	}

	// Tombstones of several months, then days pass.
	var es []tombstones.Entry
	for i := range 120 {
		es = append(es, tombstones.NewEntry("default", fmt.Sprintf("t-%d", i), intent.StateCompleted, now, now.Add(time.Duration(i)*24*time.Hour)))
	}
	if err := a.PutTombstones(ctx, es); err != nil {
		t.Fatal(err)
	}
	before, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	later := now.Add(70 * 24 * time.Hour) // 2027-02-13: December's and January's months have passed
	st, err = a.Expire(ctx, later)
	if err != nil {
		t.Fatal(err)
	}
	if st.PartitionsDropped != 2 {
		t.Errorf("dropped %d partitions, want 2 (2026-12, 2027-01)", st.PartitionsDropped)
	}
	after, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("partitions %d → %d; expire %+v", before.TombstonePartitions, after.TombstonePartitions, st)
	for _, e := range es {
		key := fmt.Sprintf("t-%d", slices.Index(es, e))
		_, ok, err := a.Tombstone(ctx, "default", key)
		if err != nil {
			t.Fatal(err)
		}
		// Every entry of a dropped month had passed its day; every entry
		// not passed is still there.
		if e.UntilDay > tombstones.Today(later) && !ok {
			t.Errorf("%s (until %v) lost before its day", key, e.Until())
		}
		if e.Until().Before(time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)) && ok {
			t.Errorf("%s (until %v) still there after its month was dropped", key, e.Until())
		}
	}
	// The intents tombstoned at now end two years later: still there.
	if _, ok, err := a.Tombstone(ctx, "default", "k-000"); err != nil || !ok {
		t.Errorf("k-000's tombstone: %v, %v", ok, err)
	}
	// A tombstone put for a month already dropped makes it again; the
	// next Expire drops it again.
	if err := a.PutTombstones(ctx, es[:1]); err != nil {
		t.Fatal(err)
	}
	if st, err := a.Expire(ctx, later); err != nil || st.PartitionsDropped != 1 {
		t.Errorf("expire after a late tombstone: %+v, %v", st, err)
	}
}

func TestExpireInBatches(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxT(t)
	dsn := s.NewDatabase(t)
	a, err := archive.Open(ctx, dsn, archive.Options{ExpireBatch: 7, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var recs []archive.Record
	for i := range 100 {
		r := rec("default", fmt.Sprintf("k-%03d", i), 1, "d")
		r.RetainUntil = now.Add(-time.Duration(i) * time.Second)
		recs = append(recs, r)
	}
	if err := a.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}
	// Two processes expiring at once: each row becomes one tombstone.
	b, err := archive.Open(ctx, dsn, archive.Options{ExpireBatch: 7, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var wg sync.WaitGroup
	stats := make([]archive.ExpireStats, 2)
	errs := make([]error, 2)
	for i, x := range []*archive.Archive{a, b} {
		wg.Go(func() { stats[i], errs[i] = x.Expire(ctx, now) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if n := stats[0].Tombstoned + stats[1].Tombstoned; n != 100 {
		t.Fatalf("tombstoned %d + %d, want 100 in all", stats[0].Tombstoned, stats[1].Tombstoned)
	}
	st, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := connect(t, dsn).QueryRow(ctx, "SELECT count(*) FROM tombstones").Scan(&n); err != nil || n != 100 {
		t.Fatalf("%d tombstones, %v; want 100 (stats: %+v)", n, err, st)
	}
}

func TestListPagination(t *testing.T) {
	a, _, _ := open(t)
	ctx := ctxT(t)
	states := []intent.State{intent.StateCompleted, intent.StateFailed, intent.StateCancelled}
	var recs []archive.Record
	base := now.Add(-24 * time.Hour)
	for i := range 400 {
		r := rec("default", fmt.Sprintf("k-%03d", 399-i), int64(i+1), fmt.Sprint(i))
		r.State = states[i%3]
		// Pairs share a registration time: the key breaks the tie.
		r.RegisteredAt = base.Add(time.Duration(i/2) * time.Millisecond)
		if i%4 == 0 {
			r.Labels = []intent.Label{{Name: "team", Value: "ops"}}
		}
		if i%5 == 0 {
			r.Parent = "p-1"
		}
		recs = append(recs, r)
		other := r
		other.Tenant = "other"
		recs = append(recs, other)
	}
	if err := a.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}
	completed, failed := intent.StateCompleted, intent.StateFailed
	cases := []struct {
		name  string
		q     archive.Query
		match func(archive.Record) bool
	}{
		{"all", archive.Query{}, func(archive.Record) bool { return true }},
		{"completed", archive.Query{State: &completed}, func(r archive.Record) bool { return r.State == completed }},
		{"failed", archive.Query{State: &failed}, func(r archive.Record) bool { return r.State == failed }},
		{"label", archive.Query{Label: &intent.Label{Name: "team", Value: "ops"}}, func(r archive.Record) bool { return len(r.Labels) > 0 }},
		{"a label no one has", archive.Query{Label: &intent.Label{Name: "team", Value: "dev"}}, func(archive.Record) bool { return false }},
		{"parent", archive.Query{Parent: "p-1"}, func(r archive.Record) bool { return r.Parent == "p-1" }},
		{"parent and failed", archive.Query{Parent: "p-1", State: &failed}, func(r archive.Record) bool { return r.Parent == "p-1" && r.State == failed }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var want []string
			for _, r := range recs {
				if r.Tenant == "default" && c.match(r) {
					want = append(want, r.Key)
				}
			}
			// Keys are in the opposite order of their registration, and
			// pairs share a time: List's order is the keys' reversed,
			// pair by pair.
			slices.SortFunc(want, func(x, y string) int { return cmpOrder(recs, x, y) })
			q := c.q
			q.Tenant, q.Limit = "default", 37
			var got []string
			for page := 0; ; page++ {
				rs, err := a.List(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					got = append(got, r.Key)
				}
				if len(rs) < q.Limit {
					break
				}
				q.After = &archive.Cursor{RegisteredAt: rs[len(rs)-1].RegisteredAt, Key: rs[len(rs)-1].Key}
				if page > 100 {
					t.Fatal("paging does not end")
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("pages (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("stable while records are archived between pages", func(t *testing.T) {
		// Records archived while a caller pages: those that sort before
		// its cursor are not seen, those after it are, and none twice.
		q := archive.Query{Tenant: "default", Limit: 50}
		seen := map[string]int{}
		var last *archive.Cursor
		added := 0
		for page := 0; ; page++ {
			rs, err := a.List(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				seen[r.Key]++
				c := archive.Of(r)
				if last != nil && !after(c, *last) {
					t.Fatalf("%s at %v is not after %s at %v", c.Key, c.RegisteredAt, last.Key, last.RegisteredAt)
				}
				last = &c
			}
			if len(rs) < q.Limit {
				break
			}
			q.After = last
			// Between pages, another process archives one record before
			// the cursor and one far after it.
			var batch []archive.Record
			for _, at := range []time.Time{base.Add(-time.Hour), base.Add(time.Hour + time.Duration(page)*time.Second)} {
				r := rec("default", fmt.Sprintf("new-%d", added), 1, "n")
				r.RegisteredAt = at
				batch = append(batch, r)
				added++
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := a.Put(ctx, batch); err != nil {
					t.Error(err)
				}
			})
			wg.Wait()
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("%s seen %d times", k, n)
			}
		}
		for i := range added {
			k := fmt.Sprintf("new-%d", i)
			before := i%2 == 0
			if before && seen[k] != 0 {
				t.Errorf("%s, archived before the cursor, was listed", k)
			}
			if !before && seen[k] != 1 {
				t.Errorf("%s, archived after the cursor, was not listed", k)
			}
		}
		for _, r := range recs {
			if r.Tenant == "default" && seen[r.Key] != 1 {
				t.Errorf("%s missing", r.Key)
			}
		}
	})
}

func after(c, last archive.Cursor) bool {
	if !c.RegisteredAt.Equal(last.RegisteredAt) {
		return c.RegisteredAt.After(last.RegisteredAt)
	}
	return c.Key > last.Key
}

func cmpOrder(recs []archive.Record, x, y string) int {
	find := func(k string) archive.Record {
		i := slices.IndexFunc(recs, func(r archive.Record) bool { return r.Key == k })
		return recs[i]
	}
	rx, ry := find(x), find(y)
	if c := rx.RegisteredAt.Compare(ry.RegisteredAt); c != 0 {
		return c
	}
	return strings.Compare(x, y)
}

func TestOpenOnABadDSN(t *testing.T) {
	ctx := ctxT(t)
	for _, c := range []struct {
		name, dsn string
		says      string // in the error
	}{
		{"empty", "", "empty"},
		{"not a URL nor key=value", "postgres://u@h:notaport/db", "DSN"},
		{"an unknown sslmode", "postgres://u@127.0.0.1:1/db?sslmode=sometimes", "sslmode"},
		{"a key without a value", "host", "DSN"},
		{"a bad port, with a password", "postgres://u:s3cret@127.0.0.1:notaport/db", "port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := archive.Open(ctx, c.dsn, archive.Options{})
			if err == nil {
				a.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("%v: does not say %q", err, c.says)
			}
			if errors.Is(err, archive.ErrUnavailable) {
				t.Errorf("%v: a DSN that does not parse is not an unavailable server", err)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%v: shows the password", err)
			}
		})
	}
}

func TestOpenMigratesOnce(t *testing.T) {
	s := pgtest.Start(t)
	dsn := s.NewDatabase(t)
	ctx := ctxT(t)
	// Four replicas start at once, then one more later.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			a, err := archive.Open(ctx, dsn, archive.Options{})
			if err == nil {
				a.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	a, err := archive.Open(ctx, dsn, archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	v, err := a.SchemaVersion(ctx)
	if err != nil || v != 1 {
		t.Fatalf("schema version %d, %v; want 1", v, err)
	}
	var applied int
	if err := connect(t, dsn).QueryRow(ctx, "SELECT count(*) FROM goose_db_version WHERE version_id = 1").Scan(&applied); err != nil || applied != 1 {
		t.Fatalf("migration 1 applied %d times, %v", applied, err)
	}
}

func TestUnavailable(t *testing.T) {
	a, s, dsn := open(t)
	ctx := ctxT(t)
	if err := a.Put(ctx, []archive.Record{rec("default", "k", 1, "x")}); err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Get", func(ctx context.Context) error { _, _, err := a.Get(ctx, "default", "k"); return err }},
		{"Put", func(ctx context.Context) error { return a.Put(ctx, []archive.Record{rec("default", "k2", 1, "x")}) }},
		{"Tombstone", func(ctx context.Context) error { _, _, err := a.Tombstone(ctx, "default", "k"); return err }},
		{"List", func(ctx context.Context) error { _, err := a.List(ctx, archive.Query{Tenant: "default"}); return err }},
		{"Ping", a.Ping},
		{"Open", func(ctx context.Context) error {
			b, err := archive.Open(ctx, dsn, archive.Options{})
			if err == nil {
				b.Close()
			}
			return err
		}},
	}
	const deadline = 500 * time.Millisecond
	check := func(t *testing.T) {
		for _, c := range calls {
			t.Run(c.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				start := time.Now()
				err := c.call(ctx)
				took := time.Since(start)
				if !errors.Is(err, archive.ErrUnavailable) {
					t.Errorf("%v: not ErrUnavailable", err)
				}
				if took > deadline+time.Second {
					t.Errorf("answered after %v, past the deadline of %v", took, deadline)
				}
			})
		}
	}
	t.Run("paused", func(t *testing.T) {
		s.Pause()
		defer s.Resume()
		check(t)
	})
	t.Run("stopped", func(t *testing.T) {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		check(t)
	})
	t.Run("started again: answers", func(t *testing.T) {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		r, ok, err := a.Get(ctx, "default", "k")
		if err != nil || !ok || string(r.Data) != "x" {
			t.Fatalf("%v, %v, %v", r, ok, err)
		}
	})
	t.Run("a refusal is not ErrUnavailable", func(t *testing.T) {
		err := a.Put(ctx, []archive.Record{rec("default", "bad\x00key", 1, "x")})
		if err == nil || errors.Is(err, archive.ErrUnavailable) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("a cancelled call is not ErrUnavailable", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _, err := a.Get(ctx, "default", "k")
		if err == nil || errors.Is(err, archive.ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("%v", err)
		}
	})
}

// Hashes gives the hash of every key the archive holds, records and
// tombstones, and nothing else; it stops at fn's error.
func TestHashes(t *testing.T) {
	a, _, _ := open(t)
	ctx := ctxT(t)
	want := map[tombstones.Hash]bool{}
	var recs []archive.Record
	for i := range 300 {
		r := rec([]string{"t1", "t2"}[i%2], fmt.Sprintf("k%d", i), int64(i+1), "x")
		recs = append(recs, r)
		want[tombstones.HashOf(r.Tenant, r.Key)] = true
	}
	if err := a.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}
	var es []tombstones.Entry
	for i := range 50 {
		e := tombstones.NewEntry("t1", fmt.Sprintf("gone%d", i), intent.StateCompleted, now, now.Add(40*24*time.Hour))
		es = append(es, e)
		want[e.Hash] = true
	}
	if err := a.PutTombstones(ctx, es); err != nil {
		t.Fatal(err)
	}
	got := map[tombstones.Hash]bool{}
	if err := a.Hashes(ctx, func(h tombstones.Hash) error { got[h] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%d hashes, want %d (the same)", len(got), len(want))
	}
	stop := errors.New("enough")
	n := 0
	err := a.Hashes(ctx, func(tombstones.Hash) error {
		if n++; n == 10 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 10 {
		t.Fatalf("stopped after %d: %v; want after 10 with its error", n, err)
	}
}
