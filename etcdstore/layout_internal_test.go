package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// decimalIndexKeys spells, independently of keys.go, the index entries
// the previous version wrote for a record: decimal times, state names,
// "x/" tags.
func decimalIndexKeys(r *machine.Record) []string {
	const p = "/intentd/v1/"
	tk := func(t time.Time) string { return fmt.Sprintf("%020d", t.UnixNano()) }
	x := p + "t/" + r.Tenant + "/x/"
	order := tk(r.CreatedAt) + "/" + r.Key
	out := []string{x + "s/" + r.State.String() + "/" + order}
	for n, v := range r.Labels {
		out = append(out, x+"l/"+url.QueryEscape(n)+"="+url.QueryEscape(v)+"/"+order)
	}
	if r.ParentKey != "" {
		out = append(out, x+"p/"+url.QueryEscape(r.ParentKey)+"/"+order)
	}
	if r.State.Final() && !r.RetainUntil.IsZero() {
		out = append(out, p+"x/r/"+tk(r.RetainUntil)+"/"+r.Tenant+"/"+r.Key)
	}
	return out
}

// toPreviousVersion rewrites every record of the store as the previous
// version left them: the value in format 0x01 (tenant and key in it, no
// index layout), and its state, label, parent and retention entries in the
// decimal layout instead of the compact one. The other indexes have one
// layout and stay.
func toPreviousVersion(t *testing.T, cli *clientv3.Client, s *Store) {
	t.Helper()
	ctx := context.Background()
	resp, err := cli.Get(ctx, s.keys.intents("default"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	ops := []clientv3.Op{
		clientv3.OpDelete(s.keys.tenant("default")+"X", clientv3.WithPrefix()),
		clientv3.OpDelete(s.keys.prefix+"Xr", clientv3.WithPrefix()),
	}
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), s.keys.intents("default"))
		r, err := decodeRecord("default", key, kv.Value, kv.ModRevision)
		if err != nil {
			t.Fatal(err)
		}
		m, err := toCompact(r)
		if err != nil {
			t.Fatal(err)
		}
		b, err := marshal.MarshalAppend([]byte{formatCompact1}, m)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(string(kv.Key), string(b)))
		for _, k := range decimalIndexKeys(r) {
			ops = append(ops, clientv3.OpPut(k, ""))
		}
	}
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
}

// keysUnder is the etcd keys under prefix.
func keysUnder(t *testing.T, cli *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// listKeys lists every page of q, pageSize at a time.
func listKeys(t *testing.T, s *Store, q intent.ListQuery, pageSize int) []string {
	t.Helper()
	var out []string
	q.Tenant, q.PageSize = "default", pageSize
	for {
		p, err := s.List(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range p.Intents {
			out = append(out, in.Key)
		}
		if p.NextPageToken == "" {
			return out
		}
		q.PageToken = p.NextPageToken
	}
}

// TestIndexEntriesOfThePreviousLayoutServe: a store as the previous version
// left it (records in format 0x01, index entries in the decimal layout) is
// listed, paged (with the previous version's page tokens too), shows its
// children and is swept by the janitor exactly as one in the compact
// layout; a record's next write moves its entries to the compact layout,
// and a listing of records in both layouts is one ordered listing, each
// intent once.
func TestIndexEntriesOfThePreviousLayoutServe(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	now := time.Now()
	cfg := DefaultConfig()
	cfg.Now = func() time.Time { return now }
	s, err := New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sess, err := s.OpenSession(ctx, "default", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	params := []byte(`{"item":"lamp"}`)
	for i := range 9 {
		now = now.Add(time.Millisecond)
		reg := intent.Registration{Tenant: "default", Key: fmt.Sprintf("k-%d", i), Params: params,
			Labels: map[string]string{"shop": []string{"a", "b"}[i%2]}, Retention: time.Hour}
		if i >= 6 {
			reg.ParentKey = "k-0"
		}
		a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: sess.ID, RequestID: "a", Register: &reg})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 { // k-0, k-3, k-6 complete; the others stay held
			if _, err := s.Report(ctx, intent.Report{Tenant: "default", Key: reg.Key, Kind: intent.ReportComplete, Token: a.Lease.Token,
				Result: &intent.Result{Payload: []byte(`{}`)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	queries := map[string]intent.ListQuery{
		"all":       {},
		"completed": {Filter: intent.Filter{States: []intent.State{intent.StateCompleted}}},
		"label":     {Filter: intent.Filter{Label: &intent.Label{Name: "shop", Value: "a"}}},
		"parent":    {Filter: intent.Filter{ParentKey: "k-0"}},
	}
	before := map[string][]string{}
	for name, q := range queries {
		before[name] = listKeys(t, s, q, 2)
	}
	if want := []string{"k-0", "k-1", "k-2", "k-3", "k-4", "k-5", "k-6", "k-7", "k-8"}; !slices.Equal(before["all"], want) {
		t.Fatalf("List before the rewrite = %v, want %v", before["all"], want)
	}
	// A token of this version, from the compact layout, is followed
	// below after the rewrite.
	first, err := s.List(ctx, intent.ListQuery{Filter: intent.Filter{Tenant: "default"}, PageSize: 4})
	if err != nil {
		t.Fatal(err)
	}

	toPreviousVersion(t, cli, s)
	if got := keysUnder(t, cli, s.keys.tenant("default")+"X"); len(got) != 0 {
		t.Fatalf("compact entries left after the rewrite: %q", got)
	}
	old, err := New(cli, cfg) // no cache: everything is read from etcd
	if err != nil {
		t.Fatal(err)
	}
	for name, q := range queries {
		if got := listKeys(t, old, q, 2); !slices.Equal(got, before[name]) {
			t.Errorf("List(%s) of the decimal layout = %v, want %v", name, got, before[name])
		}
	}
	// A token of the previous version named a decimal position.
	k3, err := old.Get(ctx, "default", "k-3")
	if err != nil {
		t.Fatal(err)
	}
	prevToken := pageToken{Rev: first.Revision, Decimal: fmt.Sprintf("%020d/k-3", k3.CreatedAt.UnixNano())}.String()
	for _, tok := range []string{prevToken, first.NextPageToken} {
		p, err := old.List(ctx, intent.ListQuery{Filter: intent.Filter{Tenant: "default"}, PageSize: 10, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range p.Intents {
			got = append(got, in.Key)
		}
		if want := []string{"k-4", "k-5", "k-6", "k-7", "k-8"}; !slices.Equal(got, want) {
			t.Errorf("List after token %q = %v, want %v", tok, got, want)
		}
	}
	bad := pageToken{Rev: first.Revision, Decimal: "not a position"}.String()
	if _, err := old.List(ctx, intent.ListQuery{Filter: intent.Filter{Tenant: "default"}, PageToken: bad}); !errors.Is(err, intent.ErrInvalid) {
		t.Errorf("List after a token with a bad position: err = %v, want an InvalidError", err)
	}
	parent, err := old.Get(ctx, "default", "k-0")
	if err != nil {
		t.Fatal(err)
	}
	if len(parent.Children) != 3 || parent.Children[0].Key != "k-6" || parent.Children[2].Key != "k-8" {
		t.Errorf("children of the decimal layout = %+v, want k-6, k-7, k-8", parent.Children)
	}

	// k-1's and k-7's next writes move their entries: both layouts at
	// once, one listing.
	for _, key := range []string{"k-1", "k-7"} {
		in, err := old.Get(ctx, "default", key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := old.Report(ctx, intent.Report{Tenant: "default", Key: key, Kind: intent.ReportComplete, Token: in.Lease.Token,
			Result: &intent.Result{Payload: []byte(`{}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := keysUnder(t, cli, s.keys.tenant("default")+"x/s/"); slices.ContainsFunc(got, func(k string) bool { return strings.HasSuffix(k, "/k-1") }) {
		t.Errorf("k-1's decimal state entry outlived its next write: %q", got)
	}
	if got := keysUnder(t, cli, s.keys.tenant("default")+"X"); len(got) != 5 { // k-1: state, label; k-7: state, label, parent
		t.Errorf("compact entries after two writes: %q, want 5", got)
	}
	if got := keysUnder(t, cli, s.keys.prefix+"Xr"); len(got) != 2 {
		t.Errorf("compact retention entries after two writes: %q, want 2", got)
	}
	fresh, err := New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{
		"all":       before["all"],
		"completed": {"k-0", "k-1", "k-3", "k-6", "k-7"},
		"label":     before["label"],
		"parent":    before["parent"],
	} {
		for _, size := range []int{1, 2, 50} {
			if got := listKeys(t, fresh, queries[name], size); !slices.Equal(got, want) {
				t.Errorf("List(%s) of both layouts, pages of %d = %v, want %v", name, size, got, want)
			}
		}
	}

	// The janitor removes what is due in either layout.
	now = now.Add(2 * time.Hour)
	rep, err := fresh.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Removed != 5 {
		t.Errorf("Sweep removed %d records, want the 5 completed ones (3 in the decimal layout, 2 in the compact)", rep.Removed)
	}
	for _, prefix := range []string{s.keys.prefix + "x/r/", s.keys.prefix + "Xr", s.keys.tenant("default") + "x/s/COMPLETED/", s.keys.tenant("default") + "Xs4"} {
		if got := keysUnder(t, cli, prefix); len(got) != 0 {
			t.Errorf("entries under %q after the sweep: %q", prefix, got)
		}
	}
	if got := listKeys(t, fresh, queries["all"], 2); !slices.Equal(got, []string{"k-2", "k-4", "k-5", "k-8"}) {
		t.Errorf("List after the sweep = %v, want k-2, k-4, k-5, k-8", got)
	}
	if got := keysUnder(t, cli, s.keys.prefix+"Zr"); len(got) != 0 {
		t.Errorf("tombstone index entries after the sweep: %q, want none: tombstones are packed", got)
	}
	if n := packedEntries(t, cli, s.keys); n != 5 {
		t.Errorf("packed tombstones after the sweep: %d, want the 5 removed records'", n)
	}

	// A tombstone of the previous version (format 0x01, its decimal entry
	// holding the intent key) answers EXPIRED, and is swept with the new
	// ones when its retention ends.
	old1 := tombstoneCases[0].tomb // order-5, until at(59)
	if _, err := cli.Txn(ctx).Then(
		clientv3.OpPut(s.keys.tombstone("default", old1.Key), string(readGolden(t, tombstoneCases[0].name, ".pb"))),
		clientv3.OpPut(fmt.Sprintf("/intentd/v1/x/zr/%020d/default/%s", old1.Until.UnixNano(), old1.Key), old1.Key),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Get(ctx, "default", old1.Key); !errors.Is(err, intent.ErrExpired) {
		t.Errorf("Get of a previous version's tombstone: err = %v, want EXPIRED", err)
	}
	// A packed tombstone may stay until the end of the day its
	// retention ends in.
	now = now.Add(cfg.TombstoneRetention + 25*time.Hour)
	if rep, err = fresh.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if rep.TombstonesRemoved != 6 {
		t.Errorf("Sweep removed %d tombstones, want 6 (5 packed, 1 of the previous version)", rep.TombstonesRemoved)
	}
	for _, prefix := range []string{s.keys.prefix + "x/zr/", s.keys.prefix + "Zr", s.keys.tenant("default") + "z/"} {
		if got := keysUnder(t, cli, prefix); len(got) != 0 {
			t.Errorf("keys under %q after the tombstones' sweep: %q", prefix, got)
		}
	}
	if n := packedEntries(t, cli, s.keys); n != 0 {
		t.Errorf("packed tombstones after their retention: %d, want none", n)
	}
}
