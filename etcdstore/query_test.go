package etcdstore_test

// List and Watch against a real etcd: the indexes behind List never drift
// from the records, pages are stable and complete, and Watch neither skips
// nor hangs.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// listAll follows a listing to its end, pageSize at a time, and checks that
// every page reads the first page's revision and holds at most pageSize
// intents.
func listAll(t *testing.T, s *etcdstore.Store, q intent.ListQuery, pageSize int) []*intent.Intent {
	t.Helper()
	all, _, _ := listPages(t, s, q, pageSize, nil)
	return all
}

// listPages is listAll calling between after each page but the last, and
// returning the number of pages and the revision they read.
func listPages(t *testing.T, s *etcdstore.Store, q intent.ListQuery, pageSize int, between func(page int)) ([]*intent.Intent, int, int64) {
	t.Helper()
	q.PageSize = pageSize
	if q.Tenant == "" {
		q.Tenant = "default"
	}
	var all []*intent.Intent
	var rev int64
	for pages := 1; ; pages++ {
		p, err := s.List(ctx(t), q)
		if err != nil {
			t.Fatalf("List(%+v) page %d: %v", q.Filter, pages, err)
		}
		if len(p.Intents) > pageSize {
			t.Fatalf("page %d holds %d intents, want at most %d", pages, len(p.Intents), pageSize)
		}
		if rev == 0 {
			rev = p.Revision
		} else if p.Revision != rev {
			t.Fatalf("page %d read revision %d, the first page %d", pages, p.Revision, rev)
		}
		all = append(all, p.Intents...)
		if p.NextPageToken == "" {
			return all, pages, rev
		}
		if pages > 1000 {
			t.Fatal("listing does not end")
		}
		if between != nil {
			between(pages)
		}
		q.PageToken = p.NextPageToken
	}
}

func keysOf(ins []*intent.Intent) []string {
	out := make([]string, len(ins))
	for i, in := range ins {
		out[i] = in.Key
	}
	return out
}

// TestListFilters lists one population by state, label, parent and review
// queue, a page of 3 at a time and in one page: oldest first, complete,
// each intent once.
func TestListFilters(t *testing.T) {
	c := newCluster(t)
	clock := newFakeClock(epoch, time.Second) // every reading a second later
	s := storeWith(t, c, nil, func(cfg *etcdstore.Config) { cfg.Now = clock.Now })
	sess := openSession(t, s, "w", 60*time.Second)
	// l-00 … l-11 registered in order; by i%4 they end PENDING, COMPLETED,
	// UNKNOWN, NEEDS_REVIEW; customer c-0 or c-1 by parity.
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = fmt.Sprintf("l-%02d", i)
		reg := lamp(t, keys[i], 1)
		reg.Labels = map[string]string{"customer": fmt.Sprintf("c-%d", i%2), "session": "agent run/7"}
		register(t, s, reg)
	}
	// Transitions in reverse order, so that last-changed is not oldest.
	for i := len(keys) - 1; i >= 0; i-- {
		if i%4 == 0 {
			continue
		}
		a := acquire(t, s, keys[i], sess)
		var err error
		switch i % 4 {
		case 1:
			r := complete(keys[i], a.Lease.Token, "SO-"+keys[i])
			if i == 1 {
				r.Children = outboxChildren(t, keys[i])
			}
			_, err = report(t, s, r)
		case 2:
			_, err = report(t, s, intent.Report{Key: keys[i], Token: a.Lease.Token, Kind: intent.ReportMarkUnknown})
		case 3:
			_, err = escalate(t, s, intent.Escalation{Key: keys[i], Token: a.Lease.Token, Reason: "two orders"})
		}
		if err != nil {
			t.Fatalf("%s: %v", keys[i], err)
		}
	}
	children := []string{"l-01:send-confirmation", "l-01:send-invoice"}
	pick := func(f func(i int) bool) []string {
		var out []string
		for i, k := range keys {
			if f(i) {
				out = append(out, k)
			}
		}
		return out
	}
	c1 := intent.Label{Name: "customer", Value: "c-1"}
	cases := []struct {
		name   string
		filter intent.Filter
		want   []string
	}{
		{"PENDING", intent.Filter{States: []intent.State{intent.StatePending}}, append(pick(func(i int) bool { return i%4 == 0 }), children...)},
		{"COMPLETED", intent.Filter{States: []intent.State{intent.StateCompleted}}, pick(func(i int) bool { return i%4 == 1 })},
		{"review queue", intent.Filter{States: []intent.State{intent.StateUnknown, intent.StateNeedsReview}}, pick(func(i int) bool { return i%4 >= 2 })},
		{"review queue, states given the other way round", intent.Filter{States: []intent.State{intent.StateNeedsReview, intent.StateUnknown}}, pick(func(i int) bool { return i%4 >= 2 })},
		{"label customer=c-1", intent.Filter{Label: &c1}, pick(func(i int) bool { return i%2 == 1 })},
		{"label with characters to escape", intent.Filter{Label: &intent.Label{Name: "session", Value: "agent run/7"}}, keys},
		{"label and state: completed results to carry forward", intent.Filter{Label: &c1, States: []intent.State{intent.StateCompleted}}, pick(func(i int) bool { return i%4 == 1 })},
		{"parent", intent.Filter{ParentKey: "l-01"}, children},
		{"no filter", intent.Filter{}, append(slices.Clone(keys), children...)},
		{"label nobody has", intent.Filter{Label: &intent.Label{Name: "customer", Value: "c-9"}}, nil},
		{"another tenant", intent.Filter{Tenant: "other"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := intent.ListQuery{Filter: tc.filter}
			for _, size := range []int{3, 100} {
				got, pages, _ := listPages(t, s, q, size, nil)
				if !slices.Equal(keysOf(got), tc.want) {
					t.Fatalf("page size %d: listed %v, want %v", size, keysOf(got), tc.want)
				}
				if most := (len(tc.want)+size-1)/size + 1; pages > most {
					t.Fatalf("page size %d: %d pages for %d intents, want at most %d", size, pages, len(tc.want), most)
				}
				for i := 1; i < len(got); i++ {
					a, b := got[i-1], got[i]
					if a.CreatedAt.After(b.CreatedAt) || (a.CreatedAt.Equal(b.CreatedAt) && a.Key >= b.Key) {
						t.Fatalf("%s (%v) listed before %s (%v): want oldest first, then by key", a.Key, a.CreatedAt, b.Key, b.CreatedAt)
					}
				}
				for _, in := range got {
					if len(tc.filter.States) > 0 && !slices.Contains(tc.filter.States, in.State) {
						t.Fatalf("%s in %v listed for states %v", in.Key, in.State, tc.filter.States)
					}
					if in.State == intent.StateCompleted && (in.Result == nil || in.Result.ExternalRefs["supplier_order_id"] != "SO-"+in.Key) {
						t.Fatalf("%s listed COMPLETED with result %+v, want its order", in.Key, in.Result)
					}
				}
			}
		})
	}

	for _, q := range []intent.ListQuery{
		{Filter: intent.Filter{Tenant: "default"}, PageSize: etcdstore.MaxPageSize + 1},
		{Filter: intent.Filter{Tenant: "default"}, PageSize: -1},
		{Filter: intent.Filter{Tenant: "default"}, PageToken: "not-a-token"},
	} {
		var inv *intent.InvalidError
		if _, err := s.List(ctx(t), q); !errors.As(err, &inv) {
			t.Errorf("List(size %d, token %q): err = %v, want an InvalidError", q.PageSize, q.PageToken, err)
		}
	}
}

// Pages read the revision of the listing's first page: intents inserted
// while a listing runs, by a replica whose clock puts them before, between
// and after the listed ones, neither appear nor push listed ones out.
func TestListPaginationStableUnderConcurrentInserts(t *testing.T) {
	c := newCluster(t)
	clock := newFakeClock(epoch, time.Second)
	s := storeWith(t, c, nil, func(cfg *etcdstore.Config) { cfg.Now = clock.Now })
	var want []string
	for i := range 10 {
		want = append(want, register(t, s, lamp(t, fmt.Sprintf("page-%02d", i), 1)).Key)
	}
	// The inserter's clock runs backwards from just after the last listed
	// intent, half a second a step: its first intents sort ahead of the
	// listing's cursor, its last ones behind it.
	insClock := newFakeClock(epoch.Add(9500*time.Millisecond), -500*time.Millisecond)
	ins := storeWith(t, c, nil, func(cfg *etcdstore.Config) { cfg.Now = insClock.Now })

	var mu sync.Mutex
	inserted := 0
	var insertErr error
	started := make(chan struct{})
	finished := make(chan struct{})
	startInserts := func() {
		go func() {
			defer close(finished)
			for i := range 20 {
				reg := lamp(t, fmt.Sprintf("late-%02d", i), 1)
				if _, _, err := ins.Register(context.Background(), reg); err != nil {
					mu.Lock()
					insertErr = err
					mu.Unlock()
					return
				}
				mu.Lock()
				inserted++
				mu.Unlock()
			}
		}()
		close(started)
	}
	insertedSoFar := func() int {
		mu.Lock()
		defer mu.Unlock()
		return inserted
	}
	got, pages, rev := listPages(t, s, intent.ListQuery{}, 3, func(page int) {
		if page == 1 {
			startInserts()
		}
		// Let inserts land between every two pages.
		deadline := time.Now().Add(10 * time.Second)
		for n := insertedSoFar(); insertedSoFar() < min(20, n+2) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	})
	<-started
	<-finished
	if insertErr != nil {
		t.Fatalf("insert: %v", insertErr)
	}
	if pages < 4 {
		t.Fatalf("%d pages, want 4: the test did not page", pages)
	}
	if atRev := recordsAt(t, c, rev); !slices.Equal(atRev, want) {
		t.Fatalf("etcd held %v at the listing's revision %d, want the first %d intents", atRev, rev, len(want))
	}
	if !slices.Equal(keysOf(got), want) {
		t.Fatalf("listed %v, want exactly the intents of the first page's revision %v", keysOf(got), want)
	}

	all := listAll(t, s, intent.ListQuery{}, 7)
	if len(all) != 30 {
		t.Fatalf("a new listing found %d intents, want 30", len(all))
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.CreatedAt.After(b.CreatedAt) || (a.CreatedAt.Equal(b.CreatedAt) && a.Key >= b.Key) {
			t.Fatalf("%s (%v) listed before %s (%v): want oldest first, then by key", a.Key, a.CreatedAt, b.Key, b.CreatedAt)
		}
	}
	if now := recordsAt(t, c, 0); !slices.Equal(keysOf(all), now) {
		t.Fatalf("a new listing %v, want what etcd holds %v", keysOf(all), now)
	}
}

// recordsAt lists the keys of the records etcd held at revision rev (0:
// now), oldest registration first, read from the records themselves.
func recordsAt(t *testing.T, c *cluster, rev int64) []string {
	t.Helper()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := c.cli.Get(ctx(t), "/intentd/v1/t/default/i/", opts...)
	if err != nil {
		t.Fatal(err)
	}
	var recs []*machine.Record
	for _, kv := range resp.Kvs {
		r, err := etcdstore.DecodeRecord(string(kv.Key), kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool {
		if !recs[i].CreatedAt.Equal(recs[j].CreatedAt) {
			return recs[i].CreatedAt.Before(recs[j].CreatedAt)
		}
		return recs[i].Key < recs[j].Key
	})
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Key
	}
	return out
}

// rawRecord is the part of a stored record the indexes are built from.
type rawRecord struct {
	Tenant      string
	Key         string
	State       intent.State
	Labels      map[string]string
	ParentKey   string
	Lease       *struct{ SessionID string }
	CreatedAt   time.Time
	RetainUntil time.Time
}

func rawKVs(t *testing.T, c *cluster, prefix string) map[string]string {
	t.Helper()
	resp, err := c.cli.Get(ctx(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

// wantIndexes is every index entry the records imply, by the compact
// layout of keys.go (every record of the test was written by this
// version): tenant-scoped state, label and parent entries ordered by
// registration (8 big-endian bytes of nanoseconds, sign bit flipped, then
// the key), and the cluster-wide holder, retention and unfinished entries
// the janitor scans, each with an empty value (the key names the intent).
func wantIndexes(recs []rawRecord) map[string]string {
	const p = "/intentd/v1/"
	tk := func(t time.Time) string { return fmt.Sprintf("%020d", t.UnixNano()) }
	tb := func(t time.Time) string {
		return string(binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())^(1<<63)))
	}
	out := map[string]string{}
	for _, r := range recs {
		x := p + "t/" + r.Tenant + "/X"
		order := tb(r.CreatedAt) + r.Key
		out[x+"s"+strconv.Itoa(int(r.State))+order] = ""
		for n, v := range r.Labels {
			out[x+"l"+url.QueryEscape(n)+"="+url.QueryEscape(v)+"/"+order] = ""
		}
		if r.ParentKey != "" {
			out[x+"p"+url.QueryEscape(r.ParentKey)+"/"+order] = ""
		}
		if r.State == intent.StateInProgress && r.Lease != nil && r.Lease.SessionID != "" {
			out[p+"x/h/"+r.Tenant+"/"+r.Lease.SessionID+"/"+r.Key] = ""
		}
		if r.State.Final() && !r.RetainUntil.IsZero() {
			out[p+"Xr"+tb(r.RetainUntil)+r.Tenant+"/"+r.Key] = ""
		}
		if !r.State.Final() {
			out[p+"x/o/"+tk(r.CreatedAt)+"/"+r.Tenant+"/"+r.Key] = ""
		}
		if r.State == intent.StateUnknown || r.State == intent.StateNeedsReview {
			out[p+"x/q/"+r.State.String()+"/"+r.Tenant+"/"+tk(r.CreatedAt)+"/"+r.Key] = ""
		}
	}
	return out
}

// diffKVs describes how got differs from want.
func diffKVs(got, want map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[k]; !ok {
			fmt.Fprintf(&b, "\n  missing %s", k)
		} else if g != want[k] {
			fmt.Fprintf(&b, "\n  %s = %q, want %q", k, g, want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "\n  extra %s = %q", k, got[k])
		}
	}
	return b.String()
}

// The index cannot drift from the records: workers on two replicas race
// random transitions over 30 intents (registration, acquire, every report,
// escalation, decisions, cancellation, outbox children, stale heartbeats,
// sessions that end while holding intents) while a janitor sweeps; then the
// index keys in etcd are exactly those the records imply, and List by each
// state, label and parent returns exactly the matching records.
func TestIndexesMatchRecordsUnderConcurrentTransitions(t *testing.T) {
	c := newCluster(t)
	replicas := []*etcdstore.Store{c.store(t), c.store(t)}
	const nKeys, workers, steps = 30, 10, 60
	regs := make([]intent.Registration, nKeys)
	for i := range regs {
		regs[i] = lamp(t, fmt.Sprintf("drift-%02d", i), float64(i+1))
		regs[i].Labels = map[string]string{"customer": fmt.Sprintf("c-%d", i%3)}
		if i%4 == 0 {
			regs[i].Labels["note"] = "a b/c=d&e"
		}
		if i >= 20 {
			regs[i].ParentKey = regs[i-20].Key // the parent may not exist yet
		}
	}
	for i := range 10 {
		register(t, replicas[i%2], regs[i])
	}
	sessions := make([]string, workers)
	for w := range sessions {
		sessions[w] = openSession(t, replicas[w%2], fmt.Sprintf("worker-%d", w), 60*time.Second)
	}

	var mu sync.Mutex
	tokens := map[string][]fencing.Token{} // every token issued, per key
	done := map[string]int{}               // successful calls by name
	expected := []error{
		intent.ErrNotFound, intent.ErrStaleToken, intent.ErrInvalidTransition, intent.ErrResultMismatch,
		intent.ErrInvalid, intent.ErrLeaseHeld,
	}
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stormOver := make(chan struct{})
	sweeperDone := make(chan struct{})
	go func() {
		defer close(sweeperDone)
		for {
			select {
			case <-stormOver:
				return
			default:
			}
			if _, err := replicas[1].Sweep(bg); err != nil {
				t.Errorf("Sweep during the storm: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			s := replicas[w%2]
			for step := range steps {
				if step == steps/2 && w%3 == 0 {
					// This worker's session ends while it holds intents;
					// it carries on under a new one.
					if err := s.CloseSession(bg, "default", sessions[w]); err != nil {
						t.Errorf("worker %d: CloseSession: %v", w, err)
						return
					}
					sess, err := s.OpenSession(bg, "default", fmt.Sprintf("worker-%d-again", w), 60*time.Second)
					if err != nil {
						t.Errorf("worker %d: OpenSession: %v", w, err)
						return
					}
					sessions[w] = sess.ID
				}
				i := rng.IntN(nKeys)
				key := regs[i].Key
				mu.Lock()
				var tok fencing.Token
				if ts := tokens[key]; len(ts) > 0 {
					tok = ts[len(ts)-1]
					if rng.IntN(4) == 0 {
						tok = ts[rng.IntN(len(ts))] // maybe a stale one
					}
				}
				mu.Unlock()
				name, err := "", error(nil)
				switch rng.IntN(11) {
				case 0:
					name = "Register"
					_, _, err = s.Register(bg, regs[i])
				case 1, 2:
					name = "Acquire"
					req := intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sessions[w], RequestID: fmt.Sprintf("w%d-%d", w, step)}
					if rng.IntN(2) == 0 {
						req.Register = &regs[i]
					}
					var a *intent.Acquisition
					if a, err = s.Acquire(bg, req); err == nil && a.Lease != nil && a.Fresh {
						mu.Lock()
						tokens[key] = append(tokens[key], a.Lease.Token)
						mu.Unlock()
						name += " " + a.Outcome.String()
					}
				case 3:
					name = "Complete"
					r := complete(key, tok, "SO-"+key)
					r.Tenant = "default"
					if rng.IntN(3) == 0 {
						r.Children = outboxChildren(t, key)[:1]
						r.Children[0].Labels = map[string]string{"customer": "c-child"}
						name += " with child"
					}
					_, err = s.Report(bg, r)
				case 4:
					name = "MarkUnknown"
					_, err = s.Report(bg, intent.Report{Tenant: "default", Key: key, Token: tok, Kind: intent.ReportMarkUnknown})
				case 5:
					name = "Release"
					_, err = s.Report(bg, intent.Report{Tenant: "default", Key: key, Token: tok, Kind: intent.ReportRelease})
				case 6:
					name = "Fail"
					_, err = s.Report(bg, intent.Report{Tenant: "default", Key: key, Token: tok, Kind: intent.ReportFail, Failure: &intent.Failure{Code: "declined"}})
				case 7:
					e := intent.Escalation{Tenant: "default", Key: key, Reason: "unsure", Actor: "worker"}
					name = "Escalate"
					if rng.IntN(2) == 0 {
						e.Token = tok
					} else {
						e.Actor, e.Force = reviewer, rng.IntN(2) == 0
						name += " by reviewer"
					}
					_, err = s.Escalate(bg, e)
				case 8:
					d := intent.Resolution{Tenant: "default", Key: key, Actor: reviewer, Reason: "decided", Force: rng.IntN(3) == 0}
					switch rng.IntN(4) {
					case 0:
						d.Decision, d.Result = intent.StateCompleted, foundOrder("SO-R-"+key)
					case 1:
						d.Decision = intent.StatePending
					case 2:
						d.Decision, d.Failure = intent.StateFailed, &intent.Failure{Code: "declined"}
					case 3:
						d.Decision = intent.StateCancelled
					}
					name = "Resolve " + d.Decision.String()
					var in *intent.Intent
					if in, _, err = s.Resolve(bg, d); err == nil {
						mu.Lock()
						tokens[key] = append(tokens[key], in.Lease.Token)
						mu.Unlock()
					}
				case 9:
					name = "Cancel"
					_, err = s.Cancel(bg, intent.Cancellation{Tenant: "default", Key: key, Actor: "approver"})
				case 10:
					name = "Heartbeat"
					_, err = s.Heartbeat(bg, "default", sessions[w], []intent.HeldLease{{Key: key, Token: tok}})
				}
				if err != nil && !slices.ContainsFunc(expected, func(e error) bool { return errors.Is(err, e) }) {
					t.Errorf("worker %d: %s(%s): unexpected error %v", w, name, key, err)
				}
				if err == nil {
					mu.Lock()
					done[name]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(stormOver)
	<-sweeperDone
	// A last pass marks every intent whose holder lapsed UNKNOWN, so that
	// List shows stored states.
	if _, err := replicas[0].Sweep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("successful calls: %v", done)
	for _, kind := range []string{"Acquire EXECUTE", "Complete", "MarkUnknown", "Resolve PENDING", "Cancel"} {
		if done[kind] == 0 && done[kind+" with child"] == 0 {
			t.Logf("no successful %s in this run", kind)
		}
	}
	if len(done) < 8 {
		t.Fatalf("only %d kinds of call succeeded (%v): the storm was too tame to test anything", len(done), done)
	}

	var recs []rawRecord
	for k, v := range rawKVs(t, c, "/intentd/v1/t/default/i/") {
		r, err := etcdstore.DecodeRecord(k, []byte(v))
		if err != nil {
			t.Fatalf("record %s: %v", k, err)
		}
		raw := rawRecord{Tenant: r.Tenant, Key: r.Key, State: r.State, Labels: r.Labels, ParentKey: r.ParentKey,
			CreatedAt: r.CreatedAt, RetainUntil: r.RetainUntil}
		if r.Lease != nil {
			raw.Lease = &struct{ SessionID string }{r.Lease.SessionID}
		}
		recs = append(recs, raw)
	}
	got := rawKVs(t, c, "/intentd/v1/t/default/x/")
	maps.Copy(got, rawKVs(t, c, "/intentd/v1/x/"))
	maps.Copy(got, rawKVs(t, c, "/intentd/v1/t/default/X"))
	maps.Copy(got, rawKVs(t, c, "/intentd/v1/Xr"))
	want := wantIndexes(recs)
	for k := range rawKVs(t, c, "/intentd/v1/t/default/s/") {
		want["/intentd/v1/x/ss/default/"+strings.TrimPrefix(k, "/intentd/v1/t/default/s/")] = ""
	}
	if diff := diffKVs(got, want); diff != "" {
		t.Fatalf("index keys differ from what the %d records imply:%s", len(recs), diff)
	}

	byState := map[intent.State][]string{}
	byLabel := map[intent.Label][]string{}
	byParent := map[string][]string{}
	slices.SortFunc(recs, func(a, b rawRecord) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	for _, r := range recs {
		byState[r.State] = append(byState[r.State], r.Key)
		for n, v := range r.Labels {
			byLabel[intent.Label{Name: n, Value: v}] = append(byLabel[intent.Label{Name: n, Value: v}], r.Key)
		}
		if r.ParentKey != "" {
			byParent[r.ParentKey] = append(byParent[r.ParentKey], r.Key)
		}
	}
	states := []intent.State{intent.StatePending, intent.StateInProgress, intent.StateUnknown, intent.StateCompleted, intent.StateFailed, intent.StateNeedsReview, intent.StateCancelled}
	for _, st := range states {
		listed := keysOf(listAll(t, replicas[0], intent.ListQuery{Filter: intent.Filter{States: []intent.State{st}}}, 7))
		if !slices.Equal(listed, byState[st]) {
			t.Errorf("List(%v) = %v, want %v", st, listed, byState[st])
		}
	}
	for l, want := range byLabel {
		if listed := keysOf(listAll(t, replicas[1], intent.ListQuery{Filter: intent.Filter{Label: &l}}, 7)); !slices.Equal(listed, want) {
			t.Errorf("List(label %v) = %v, want %v", l, listed, want)
		}
	}
	for p, want := range byParent {
		if listed := keysOf(listAll(t, replicas[0], intent.ListQuery{Filter: intent.Filter{ParentKey: p}}, 7)); !slices.Equal(listed, want) {
			t.Errorf("List(parent %s) = %v, want %v", p, listed, want)
		}
	}
}

// A page token whose revision etcd compacted away is a CompactedError, not a
// silently different listing; a new listing works.
func TestListCompactedPageToken(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	for i := range 10 {
		register(t, s, lamp(t, fmt.Sprintf("cmp-%02d", i), 1))
	}
	first, err := s.List(ctx(t), intent.ListQuery{Filter: intent.Filter{Tenant: "default"}, PageSize: 3})
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v, token %q", err, first.NextPageToken)
	}
	last := register(t, s, lamp(t, "cmp-late", 1))
	if _, err := c.cli.Compact(ctx(t), last.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	_, err = s.List(ctx(t), intent.ListQuery{Filter: intent.Filter{Tenant: "default"}, PageSize: 3, PageToken: first.NextPageToken})
	var ce *intent.CompactedError
	if !errors.As(err, &ce) || ce.Requested != first.Revision {
		t.Fatalf("next page after compaction: err = %v, want a *intent.CompactedError for revision %d", err, first.Revision)
	}
	if n := len(listAll(t, s, intent.ListQuery{}, 3)); n != 11 {
		t.Fatalf("a new listing found %d intents, want 11", n)
	}
}

var errEnough = errors.New("test has seen enough")

// watchUntil runs Watch until stop says so, and returns what it saw; it
// fails after 10 s.
func watchUntil(t *testing.T, s *etcdstore.Store, q intent.WatchQuery, stop func(intent.WatchEvent) bool) []intent.WatchEvent {
	t.Helper()
	if q.Tenant == "" {
		q.Tenant = "default"
	}
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []intent.WatchEvent
	err := s.Watch(wctx, q, func(e intent.WatchEvent) error {
		got = append(got, e)
		if stop(e) {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("Watch(%+v) = %v after %d events %s", q, err, len(got), describe(got))
	}
	return got
}

func describe(evs []intent.WatchEvent) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, " %s@%d:%v", e.Intent.Key, e.Revision, e.Intent.State)
		if e.Deleted {
			b.WriteString("(deleted)")
		}
	}
	return b.String()
}

// A duplicate caller finds the intent IN_PROGRESS and waits for its
// completion with Watch instead of polling: from now (set up before the
// holder completes), or from the revision its Acquire returned (set up
// after the completion, and still seeing it).
func TestWatchWaitsForCompletion(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	for _, fromNow := range []bool{true, false} {
		t.Run(fmt.Sprintf("from now %v", fromNow), func(t *testing.T) {
			key := fmt.Sprintf("wait-%v", fromNow)
			register(t, s, lamp(t, key, 1))
			holder := acquire(t, s, key, openSession(t, s, "holder", 30*time.Second))
			dup := acquire(t, s, key, openSession(t, s, "duplicate", 30*time.Second))
			mustOutcome(t, dup, intent.OutcomeInProgress)

			final := func(e intent.WatchEvent) bool { return e.Intent.State.Final() }
			var got []intent.WatchEvent
			if fromNow {
				ch := make(chan []intent.WatchEvent, 1)
				created := make(chan struct{})
				go func() {
					var evs []intent.WatchEvent
					wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					q := intent.WatchQuery{Filter: intent.Filter{Tenant: "default"}, Key: key, NotifyCreated: true}
					_ = s.Watch(wctx, q, func(e intent.WatchEvent) error {
						if e.Created {
							close(created)
							return nil
						}
						evs = append(evs, e)
						if final(e) {
							return errEnough
						}
						return nil
					})
					ch <- evs
				}()
				select {
				case <-created:
				case <-time.After(10 * time.Second):
					t.Fatal("the watch was not set up")
				}
				if _, err := report(t, s, complete(key, holder.Lease.Token, "SO-W")); err != nil {
					t.Fatal(err)
				}
				got = <-ch
			} else {
				if _, err := report(t, s, complete(key, holder.Lease.Token, "SO-W")); err != nil {
					t.Fatal(err)
				}
				got = watchUntil(t, s, intent.WatchQuery{Key: key, StartRevision: dup.Intent.Revision + 1}, final)
			}
			if len(got) != 1 {
				t.Fatalf("saw%s, want the completion alone", describe(got))
			}
			e := got[0]
			if e.Deleted || e.Intent.State != intent.StateCompleted || e.Intent.Result.ExternalRefs["supplier_order_id"] != "SO-W" || e.Revision <= dup.Intent.Revision {
				t.Fatalf("saw %+v (result %+v), want COMPLETED with SO-W after revision %d", e, e.Intent.Result, dup.Intent.Revision)
			}
		})
	}
}

// watched is one write the test made and the state it left.
type watched struct {
	key   string
	state intent.State
	rev   int64
	label string
}

// A watch on a filter sees exactly the matching changes of its tenant, in
// revision order.
func TestWatchFilter(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	var changes []watched
	record := func(in *intent.Intent) {
		changes = append(changes, watched{key: in.Key, state: in.State, rev: in.Revision, label: in.Labels["customer"]})
	}
	keys := []string{"wf-a", "wf-b", "wf-c", "wf-d"}
	for i, k := range keys {
		reg := lamp(t, k, 1)
		reg.Labels = map[string]string{"customer": fmt.Sprintf("c-%d", i%2)}
		record(register(t, s, reg))
	}
	from := changes[0].rev
	// Another tenant's completion, which no watch of "default" may see.
	other := lamp(t, "wf-a", 1)
	other.Tenant = "other"
	if _, _, err := s.Register(ctx(t), other); err != nil {
		t.Fatal(err)
	}
	osess, err := s.OpenSession(ctx(t), "other", "w", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	oa, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "other", Key: "wf-a", SessionID: osess.ID, RequestID: "o"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Report(ctx(t), intent.Report{Tenant: "other", Key: "wf-a", Token: oa.Lease.Token, Kind: intent.ReportComplete, Result: foundOrder("SO-O")}); err != nil {
		t.Fatal(err)
	}

	sess := openSession(t, s, "w", 30*time.Second)
	toks := map[string]fencing.Token{}
	for _, k := range keys {
		a := acquire(t, s, k, sess)
		toks[k] = a.Lease.Token
		record(a.Intent)
	}
	for _, step := range []struct {
		key  string
		kind intent.ReportKind
	}{{"wf-a", intent.ReportComplete}, {"wf-b", intent.ReportMarkUnknown}, {"wf-c", intent.ReportFail}, {"wf-d", intent.ReportComplete}} {
		r := intent.Report{Key: step.key, Token: toks[step.key], Kind: step.kind, Result: foundOrder("SO-" + step.key), Failure: &intent.Failure{Code: "x"}}
		if step.kind != intent.ReportComplete {
			r.Result = nil
		}
		out, err := report(t, s, r)
		if err != nil {
			t.Fatal(err)
		}
		record(out.Intent)
	}

	cases := []struct {
		name   string
		filter intent.Filter
		match  func(watched) bool
	}{
		{"completions", intent.Filter{States: []intent.State{intent.StateCompleted}}, func(ch watched) bool { return ch.state == intent.StateCompleted }},
		{"label customer=c-1", intent.Filter{Label: &intent.Label{Name: "customer", Value: "c-1"}}, func(ch watched) bool { return ch.label == "c-1" }},
		{"final states of customer c-0", intent.Filter{Label: &intent.Label{Name: "customer", Value: "c-0"}, States: []intent.State{intent.StateCompleted, intent.StateFailed}}, func(ch watched) bool {
			return ch.label == "c-0" && ch.state.Final()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var want []watched
			for _, ch := range changes {
				if tc.match(ch) {
					want = append(want, ch)
				}
			}
			last := want[len(want)-1].rev
			got := watchUntil(t, s, intent.WatchQuery{Filter: tc.filter, StartRevision: from}, func(e intent.WatchEvent) bool { return e.Revision >= last })
			if len(got) != len(want) {
				t.Fatalf("saw%s, want %d changes %v", describe(got), len(want), want)
			}
			for i, e := range got {
				if e.Intent.Tenant != "default" || e.Intent.Key != want[i].key || e.Intent.State != want[i].state || e.Revision != want[i].rev {
					t.Fatalf("event %d: %s %v@%d in tenant %q, want %s %v@%d", i, e.Intent.Key, e.Intent.State, e.Revision, e.Intent.Tenant, want[i].key, want[i].state, want[i].rev)
				}
			}
		})
	}
}

// A watch resumed from the last revision it saw, plus one, misses nothing
// and repeats nothing, however much happened while it was down.
func TestWatchResumesWithoutGaps(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	const key = "resume-1"
	var want []watched
	note := func(in *intent.Intent) { want = append(want, watched{key: in.Key, state: in.State, rev: in.Revision}) }
	note(register(t, s, lamp(t, key, 1)))
	sess := openSession(t, s, "w", 30*time.Second)
	a := acquire(t, s, key, sess)
	note(a.Intent)
	mustReport := func(r intent.Report) {
		t.Helper()
		out, err := report(t, s, r)
		if err != nil {
			t.Fatal(err)
		}
		note(out.Intent)
	}
	mustReport(intent.Report{Key: key, Token: a.Lease.Token, Kind: intent.ReportMarkUnknown})
	register(t, s, lamp(t, "unrelated", 1)) // revisions of other keys lie between

	first := watchUntil(t, s, intent.WatchQuery{Key: key, StartRevision: want[0].rev}, func(e intent.WatchEvent) bool { return e.Revision >= want[2].rev })

	// While no one watches.
	b := acquire(t, s, key, sess)
	note(b.Intent)
	mustReport(intent.Report{Key: key, Token: b.Lease.Token, Kind: intent.ReportRelease})
	e := acquire(t, s, key, sess)
	note(e.Intent)
	mustReport(complete(key, e.Lease.Token, "SO-R"))

	last := want[len(want)-1].rev
	second := watchUntil(t, s, intent.WatchQuery{Key: key, StartRevision: first[len(first)-1].Revision + 1}, func(e intent.WatchEvent) bool { return e.Revision >= last })
	got := append(first, second...)
	if len(got) != len(want) {
		t.Fatalf("saw%s, want %d changes", describe(got), len(want))
	}
	for i, e := range got {
		if e.Revision != want[i].rev || e.Intent.State != want[i].state {
			t.Fatalf("event %d: %v@%d, want %v@%d (all:%s)", i, e.Intent.State, e.Revision, want[i].state, want[i].rev, describe(got))
		}
	}
}

// A watch from a revision etcd compacted away says so at once, instead of
// hanging or starting silently later.
func TestWatchCompactedRevision(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	first := register(t, s, lamp(t, "old-1", 1))
	var last *intent.Intent
	for i := range 5 {
		last = register(t, s, lamp(t, fmt.Sprintf("old-%d", i+2), 1))
	}
	if _, err := c.cli.Compact(ctx(t), last.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	for _, q := range []intent.WatchQuery{
		{Filter: intent.Filter{Tenant: "default"}, Key: "old-1", StartRevision: first.Revision},
		{Filter: intent.Filter{Tenant: "default", States: []intent.State{intent.StateCompleted}}, StartRevision: first.Revision},
	} {
		errc := make(chan error, 1)
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		go func() {
			errc <- s.Watch(wctx, q, func(e intent.WatchEvent) error {
				return fmt.Errorf("event %s@%d from a compacted revision", e.Intent.Key, e.Revision)
			})
		}()
		select {
		case err := <-errc:
			var ce *intent.CompactedError
			if !errors.As(err, &ce) || ce.Requested != first.Revision || ce.Compacted < last.Revision {
				t.Errorf("Watch(key %q) from compacted revision %d: err = %v, want a *intent.CompactedError naming it and compaction %d", q.Key, first.Revision, err, last.Revision)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Watch(key %q) from compacted revision %d still running after 5s, want a CompactedError", q.Key, first.Revision)
		}
		cancel()
	}
}

// When the janitor removes a record after its retention, a watcher sees a
// deletion carrying the tombstone's facts.
func TestWatchReportsDeletion(t *testing.T) {
	c := newCluster(t)
	clock := newFakeClock(epoch, time.Millisecond)
	s := storeWith(t, c, nil, retentionConfig(clock))
	done := completeNow(t, s, lamp(t, "to-expire", 1), "SO-E")
	clock.Advance(testRetention + time.Minute)
	if r := sweep(t, s); r.Removed != 1 {
		t.Fatalf("Sweep = %+v, want one removal", r)
	}
	for _, q := range []intent.WatchQuery{
		{Key: "to-expire", StartRevision: done.Revision + 1},
		{Filter: intent.Filter{States: []intent.State{intent.StateCompleted}}, StartRevision: done.Revision + 1},
	} {
		got := watchUntil(t, s, q, func(e intent.WatchEvent) bool { return e.Deleted })
		e := got[len(got)-1]
		if len(got) != 1 || e.Intent.Key != "to-expire" || e.Intent.State != intent.StateCompleted || e.Intent.Fingerprint != done.Fingerprint || e.Revision <= done.Revision {
			t.Fatalf("watch (key %q) saw%s (%+v), want one deletion of the COMPLETED record after revision %d", q.Key, describe(got), e.Intent, done.Revision)
		}
	}
}

// A state named twice in a filter (a caller building the review queue from
// user input, say) still lists every intent once.
func TestListRepeatedStateListsOnce(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	sess := openSession(t, s, "w", 30*time.Second)
	var want []string
	for i := range 4 {
		key := fmt.Sprintf("rep-%d", i)
		register(t, s, lamp(t, key, 1))
		a := acquire(t, s, key, sess)
		if _, err := report(t, s, intent.Report{Key: key, Token: a.Lease.Token, Kind: intent.ReportMarkUnknown}); err != nil {
			t.Fatal(err)
		}
		want = append(want, key)
	}
	for _, size := range []int{3, 100} {
		got := keysOf(listAll(t, s, intent.ListQuery{Filter: intent.Filter{States: []intent.State{intent.StateUnknown, intent.StateNeedsReview, intent.StateUnknown}}}, size))
		if !slices.Equal(got, want) {
			t.Fatalf("page size %d listed %v, want each once: %v", size, got, want)
		}
	}
}

// TestIndexEntriesOfEarlierVersionsStillList: index entries as earlier
// versions wrote them, with the intent key as their value, list and name
// children exactly as the empty-valued entries this version writes.
func TestIndexEntriesOfEarlierVersionsStillList(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	for _, key := range []string{"old-a", "old-b", "old-c"} {
		reg := lamp(t, key, 1)
		reg.Labels = map[string]string{"team": "shop"}
		register(t, s, reg)
	}
	child := lamp(t, "old-a/ship", 1)
	child.ParentKey = "old-a"
	register(t, s, child)
	keysOf := func(ins []*intent.Intent) []string {
		var out []string
		for _, in := range ins {
			out = append(out, in.Key)
		}
		return out
	}
	queries := []intent.ListQuery{
		{Filter: intent.Filter{States: []intent.State{intent.StatePending}}},
		{Filter: intent.Filter{Label: &intent.Label{Name: "team", Value: "shop"}}},
		{Filter: intent.Filter{ParentKey: "old-a"}},
	}
	var before [][]string
	for _, q := range queries {
		before = append(before, keysOf(listAll(t, s, q, 2)))
	}
	childrenBefore := get(t, s, "old-a").Children

	// Rewrite every tenant-scoped entry as earlier versions wrote it.
	for k := range rawKVs(t, c, "/intentd/v1/t/default/x/") {
		named := ""
		for _, key := range []string{"old-a", "old-b", "old-c", "old-a/ship"} {
			if strings.HasSuffix(k, "/"+key) && len(key) > len(named) {
				named = key
			}
		}
		if _, err := c.cli.Put(ctx(t), k, named); err != nil {
			t.Fatal(err)
		}
	}
	for i, q := range queries {
		if got := keysOf(listAll(t, s, q, 2)); !slices.Equal(got, before[i]) || len(got) == 0 {
			t.Errorf("List(%+v) over entries valued with the key = %v, want %v", q.Filter, got, before[i])
		}
	}
	if got := get(t, s, "old-a").Children; !slices.Equal(got, childrenBefore) || len(got) != 1 {
		t.Errorf("children over entries valued with the key = %v, want %v", got, childrenBefore)
	}
}
