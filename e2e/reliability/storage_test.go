package reliability

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
)

// etcd's storage is maintained or runs out: compaction and defragmentation,
// the backend quota exhausted, a restore from a snapshot.

// compactAndDefrag compacts the cluster to its current revision (waiting
// for the physical compaction) and defragments every member, one after
// the other, on its own client URL: what an operator's maintenance job
// does. It returns the revision compacted to and each defragmentation's
// duration.
func compactAndDefrag(t *testing.T, c *Cluster, admin *clientv3.Client) (int64, []time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := admin.Get(ctx, "/reliability-maintenance", clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("etcd revision: %v", err)
	}
	rev := resp.Header.GetRevision()
	if _, err := admin.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact to %d: %v", rev, err)
	}
	var took []time.Duration
	for _, m := range c.Members {
		start := time.Now()
		if _, err := admin.Defragment(ctx, m.ClientURL); err != nil {
			t.Fatalf("defragment etcd %s: %v", m.Name, err)
		}
		took = append(took, time.Since(start).Round(time.Millisecond))
	}
	return rev, took
}

// Scenario 10. Frequent compaction and defragmentation under load: three
// rounds of "compact to the current revision, defragment every member"
// while the workers run (each member carries 32 MiB of ballast besides the
// intents, so that every defragmentation copies a real backend and blocks
// its member for a while). A Watch opened from a revision before the
// compaction must end promptly with FAILED_PRECONDITION, reason
// REVISION_COMPACTED (naming the compaction) — never hang, never skip
// silently to the present; a re-list and a Watch from the listing's
// revision then delivers changes, and keeps delivering through a further
// round. CAS is unaffected: the invariants and porcupine hold. The refused
// Watch is the call that proves the fault was seen: a defragmentation of
// this size blocks its member for about 100 ms, and intentd steers calls off
// a member that does not answer its probe, so the workers' calls may notice
// nothing.
func TestEtcdCompactionAndDefrag(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	admin, err := e.Cluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ballast := strings.Repeat("b", 1<<20)
	for i := range 32 {
		if _, err := admin.Put(ctx, fmt.Sprintf("/reliability-ballast/%02d", i), ballast); err != nil {
			t.Fatal(err)
		}
	}
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	// The watcher is an operator's tool, not part of the checked history.
	cc, err := harness.Dial(e.Addrs()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	wc := client.New(cc, client.WithCallTimeout(5*time.Second))
	page, err := wc.List(ctx, &intentv1.ListRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	before := page.GetRevision()

	ev := e.Faults.Inject("compact-defrag", "3 rounds: compact to the current revision, defragment every member")
	var compacted int64
	for round := range 3 {
		rev, took := compactAndDefrag(t, e.Cluster, admin)
		compacted = rev
		t.Logf("round %d: compacted to %d, defragmentations took %v", round, rev, took)
		time.Sleep(500 * time.Millisecond)
	}
	if compacted <= before+1 {
		t.Fatalf("compacted to %d, not past the listing's revision %d: the load wrote nothing", compacted, before)
	}

	// A watch from before the compaction: refused at once, naming it.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	start := time.Now()
	events := 0
	err = wc.Watch(wctx, &intentv1.WatchRequest{StartRevision: before + 1}, func(*intentv1.WatchResponse) bool { events++; return true })
	took := time.Since(start)
	cancel()
	var ce *client.Error
	refused := 0 // calls that saw the compaction
	switch {
	case !errors.As(err, &ce) || !errors.Is(err, client.ErrCompacted):
		t.Errorf("Watch from revision %d after compaction to %d ended after %v with %v (%d events), want FAILED_PRECONDITION REVISION_COMPACTED", before+1, compacted, took, err, events)
	case ce.Code != codes.FailedPrecondition || ce.Reason != "REVISION_COMPACTED":
		t.Errorf("Watch from a compacted revision: code %s reason %s, want FAILED_PRECONDITION REVISION_COMPACTED", ce.Code, ce.Reason)
	case events != 0:
		t.Errorf("Watch from compacted revision %d delivered %d events before its error: it skipped the compacted gap", before+1, events)
	case took > 3*time.Second:
		t.Errorf("Watch from a compacted revision took %v to fail, want promptly (3s)", took)
	default:
		if cr, _ := strconv.ParseInt(ce.Metadata["compact_revision"], 10, 64); cr < compacted {
			t.Errorf("REVISION_COMPACTED names compaction %q, want at least %d", ce.Metadata["compact_revision"], compacted)
		}
		t.Logf("Watch from revision %d refused after %v: %s (compact_revision %s)", before+1, took.Round(time.Millisecond), ce.Reason, ce.Metadata["compact_revision"])
		refused = 1
	}

	// Re-list, then watch from the listing's revision: it delivers, in
	// order, and keeps delivering through one more round.
	page, err = wc.List(ctx, &intentv1.ListRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	after := page.GetRevision()
	wctx, cancel = context.WithCancel(ctx)
	var got atomic.Int64
	var mu sync.Mutex
	var last int64
	var order []string
	done := make(chan error, 1)
	go func() {
		done <- wc.Watch(wctx, &intentv1.WatchRequest{StartRevision: after + 1}, func(r *intentv1.WatchResponse) bool {
			mu.Lock()
			if r.GetRevision() <= after || r.GetRevision() < last {
				order = append(order, fmt.Sprintf("revision %d after %d (listed at %d)", r.GetRevision(), last, after))
			}
			last = r.GetRevision()
			mu.Unlock()
			got.Add(1)
			return true
		})
	}()
	waitEvents := func(n int64, what string) {
		deadline := time.Now().Add(5 * time.Second)
		for got.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the watch from the listing's revision %d delivered %d events within 5s %s", after+1, got.Load(), what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitEvents(5, "")
	rev, dtook := compactAndDefrag(t, e.Cluster, admin)
	t.Logf("round 3 (watch open): compacted to %d, defragmentations took %v", rev, dtook)
	n := got.Load()
	waitEvents(n+5, "after a further compaction")
	e.Faults.Heal(ev)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the watch from the listing's revision ended with %v, want only our cancel", err)
	}
	mu.Lock()
	if len(order) > 0 {
		t.Errorf("the watch delivered out of order: %v", order[:min(5, len(order))])
	}
	mu.Unlock()
	t.Logf("the watch from revision %d delivered %d events through a further compaction", after+1, got.Load())
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{Noticed: func(FaultEvent, []Call) int { return refused }})
}

// bigParams are the approved terms of the n-th large intent: about 48 KiB.
func bigParams(n int) *structpb.Struct {
	p, err := structpb.NewStruct(map[string]any{"item": fmt.Sprintf("item-%d", n), "quantity": 1, "merchant": "M",
		"attachment": strings.Repeat(string(rune('a'+n%26)), 48<<10)})
	if err != nil {
		panic(err)
	}
	return p
}

// dbSizes are the members' backend sizes, asked on their own URLs.
func dbSizes(ctx context.Context, c *Cluster, admin *clientv3.Client) []string {
	var out []string
	for _, m := range c.Members {
		st, err := admin.Status(ctx, m.ClientURL)
		if err != nil {
			out = append(out, m.Name+"=?")
			continue
		}
		out = append(out, fmt.Sprintf("%s=%.1fMiB", m.Name, float64(st.DbSize)/(1<<20)))
	}
	return out
}

// Scenario 11. The etcd backend quota is exhausted: the members run with
// --quota-backend-bytes 16 MiB, and large intents (48 KiB of params, each
// registered, leased and completed, so that every transition rewrites its
// record) fill it until etcd raises its NOSPACE alarm. Every write is then
// refused clearly — RESOURCE_EXHAUSTED, reason STORE_FULL, nothing written —
// while reads (Get of existing intents) are still served. Then the
// operator's recovery, which this test performs and documents:
//
//	# 1. compact the history away (old revisions are what fills the quota):
//	rev=$(etcdctl --endpoints=$EPS endpoint status --write-out=json | jq '.[0].Status.header.revision')
//	etcdctl --endpoints=$EPS compaction --physical $rev
//	# 2. give the space back to the file system, one member at a time:
//	etcdctl --endpoints=$EP1 defrag; etcdctl --endpoints=$EP2 defrag; ...
//	# 3. lift the alarm, or etcd keeps refusing writes:
//	etcdctl --endpoints=$EPS alarm disarm
//
// (If the live data alone exceeds the quota, compaction frees nothing:
// raise --quota-backend-bytes with a rolling restart, or let retention
// remove final intents.) After it, writes work again: a new intent
// registers, and every intent caught mid-way completes, once.
func TestEtcdBackendQuotaExhausted(t *testing.T) {
	const quota = 16 << 20
	e := NewEnv(t, report, EnvConfig{})
	ctx := context.Background()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if err := e.Cluster.RestartWithFlags(rctx, "--quota-backend-bytes", strconv.Itoa(quota)); err != nil {
		t.Fatal(err)
	}
	cancel()
	admin, err := e.Cluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	addr := e.Intentds[0].Addr
	c := recordedClient(t, e, addr)
	r := newReconciler(e.MerchantURL)

	// Load before the fault: small intents, carried to COMPLETED.
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("%s-small-%03d", sanitize(t.Name()), i))
	}
	registerAll(t, c, keys, func(i int) *intentv1.RegisterRequest { return &intentv1.RegisterRequest{Params: params(i)} })
	if left := r.runAll(t, e, addr, keys, 4); len(left) > 0 {
		t.Fatalf("%d small intents did not complete before the fault", len(left))
	}

	ev := e.Faults.Inject("quota-exhausted", "etcd --quota-backend-bytes %d filled with 48KiB intents", quota)
	sess, err := c.OpenSession(ctx, "filler", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	shop := &harness.Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, Merchant: e.MerchantURL}
	var full *client.Error
	var fullAt string
	fillStart := time.Now()
	filled := 0
	for i := 0; full == nil && time.Since(fillStart) < 60*time.Second; i++ {
		key := fmt.Sprintf("%s-big-%04d", sanitize(t.Name()), i)
		step := func(what string, err error) bool {
			if err == nil {
				return true
			}
			if !errors.As(err, &full) {
				t.Fatalf("%s %s: %v", what, key, err)
			}
			fullAt = what + " " + key
			return false
		}
		_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: bigParams(i)})
		if !step("Register", err) {
			break
		}
		keys = append(keys, key)
		acq, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: sess.ID(), RequestId: "fill-" + key})
		if !step("Acquire", err) {
			break
		}
		o, err := shop.CreateOrder(ctx, key+":create-order", fakes.OrderRequest{Reference: key})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: acq.GetLease().GetToken(),
			Result: &intentv1.Result{ExternalRefs: map[string]string{RefOrder: o.ID}}})
		if !step("Complete", err) {
			break
		}
		filled++
	}
	if full == nil {
		t.Fatalf("60s of large intents did not fill a %d-byte quota", quota)
	}
	t.Logf("after %d large intents (%v) intentd refused %s: %s %s %q; backends %v", filled, time.Since(fillStart).Round(time.Millisecond),
		fullAt, full.Code, full.Reason, full.Message, dbSizes(ctx, e.Cluster, admin))
	if full.Code != codes.ResourceExhausted || full.Reason != "STORE_FULL" {
		t.Errorf("a write to a full store was answered %s %s, want RESOURCE_EXHAUSTED STORE_FULL", full.Code, full.Reason)
	}

	// Still full: every write is refused the same way, at once; reads are
	// served.
	start := time.Now()
	_, err = c.Register(ctx, &intentv1.RegisterRequest{Key: sanitize(t.Name()) + "-while-full", Params: params(1)})
	var e2 *client.Error
	if !errors.As(err, &e2) || e2.Code != codes.ResourceExhausted || e2.Reason != "STORE_FULL" || time.Since(start) > 2*time.Second {
		t.Errorf("Register while the store is full: %v after %v, want RESOURCE_EXHAUSTED STORE_FULL at once", err, time.Since(start))
	}
	// Opening a session grants an etcd lease, which a NOSPACE alarm also
	// refuses: the worker must hear STORE_FULL at once, not UNAVAILABLE
	// (which it would retry as if etcd were down).
	octx, ocancel := context.WithTimeout(ctx, 3*time.Second)
	start = time.Now()
	if s2, err := c.OpenSession(octx, "while-full", 10*time.Second); err != nil {
		var e3 *client.Error
		if !errors.As(err, &e3) || e3.Code != codes.ResourceExhausted || e3.Reason != "STORE_FULL" || time.Since(start) > 2*time.Second {
			t.Errorf("OpenSession while the store is full: %v after %v, want RESOURCE_EXHAUSTED STORE_FULL at once", err, time.Since(start))
		}
	} else {
		t.Logf("OpenSession while full: served (%s)", s2.ID())
		_ = s2.Close(octx)
	}
	ocancel()
	reads := 0
	for _, k := range []string{keys[0], keys[len(keys)/2], keys[len(keys)-1]} {
		gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.Get(gctx, &intentv1.GetRequest{Key: k})
		gcancel()
		if err != nil {
			t.Errorf("Get %s while the store is full: %v, want it served", k, err)
			continue
		}
		reads++
		t.Logf("Get %s while full: %s", k, resp.GetIntent().GetState())
	}

	// The operator's recovery: compact, defragment every member, disarm.
	before := dbSizes(ctx, e.Cluster, admin)
	rev, took := compactAndDefrag(t, e.Cluster, admin)
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	alarms, err := admin.AlarmList(actx)
	if err == nil {
		t.Logf("alarms before disarm: %v", alarms.Alarms)
		_, err = admin.AlarmDisarm(actx, &clientv3.AlarmMember{})
	}
	acancel()
	if err != nil {
		t.Fatalf("alarm disarm: %v", err)
	}
	e.Faults.Heal(ev)
	t.Logf("recovery: compacted to %d, defragmented in %v, alarm disarmed; backends %v → %v", rev, took, before, dbSizes(ctx, e.Cluster, admin))

	// Writes work again: a new intent registers and completes; every intent
	// caught mid-way completes, once.
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	_ = sess.Close(sctx) // its lease, if any, becomes UNKNOWN: reconciled below
	scancel()
	after := sanitize(t.Name()) + "-after"
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: after, Params: params(2)})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Register after the recovery still fails: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	keys = append(keys, after)
	if left := r.runAll(t, e, addr, keys, 4); len(left) > 0 {
		t.Errorf("%d intents did not complete after the recovery (first %v)", len(left), left[:min(5, len(left))])
	}
	t.Logf("%d large intents filled the quota; %d reads served while full; every one of %d intents COMPLETED after recovery", filled, reads, len(keys))
	e.FinishKeys(keys, FinishOptions{MinLoad: 50, Noticed: refusedWith(codes.ResourceExhausted, "STORE_FULL")})
}

// Scenario 13. etcd is restored from a snapshot taken under load, after
// which more transitions were acknowledged. Fencing tokens are etcd
// revisions, so a restore that keeps the snapshot's revision would hand out
// tokens already handed out. intentd remembers the highest revision it saw
// (in its data directory) and must refuse to serve the store restored that
// way; restored as the documented procedure says (etcdutl snapshot restore
// --bump-revision --mark-compacted), it serves again with every new token
// above every old one. The transitions acknowledged after the snapshot are
// lost with the restore (that is what a restore is); the intents they
// finished come back unfinished and the workers finish them again under
// the same operation keys, so the merchant still holds one order each.
//
// The run before the restore passes every check of the suite; after it,
// the world and the tokens are checked (porcupine's model starts every
// intent unregistered, which a restored history is not).
func TestRestoreFromSnapshot(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)
	time.Sleep(2 * time.Second)

	snapshot := filepath.Join(t.TempDir(), "snapshot.db")
	snapRev, err := e.Cluster.Snapshot(ctx, leader(t, e.Cluster), snapshot)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // transitions acknowledged after the snapshot
	e.Finish(load, FinishOptions{FaultAfter: true})
	keys := load.Keys()
	orders := load.Settled()
	before := highestToken(e.Rec.Calls())

	admin, err := e.Cluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	st, err := admin.Get(ctx, "/intentd/v1/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	lastRev := st.Header.Revision
	d := e.Intentds[0]
	t.Logf("snapshot at revision %d; %d intents, highest token %d, last revision %d", snapRev, len(keys), before, lastRev)

	// The restore an operator gets wrong: the snapshot's own revision,
	// under a running intentd, which must stop serving on its own; and
	// started again, refuse to.
	ev := e.Faults.Inject("restore-unbumped", "snapshot at revision %d restored as is; the replica saw %d", snapRev, lastRev)
	if err := e.Cluster.Restore(ctx, e.Bins.Etcdutl, snapshot, 0); err != nil {
		t.Fatal(err)
	}
	if !d.Exited(10 * time.Second) {
		t.Error("intentd kept running for 10s on an etcd whose revision went back")
		d.Stop()
	}
	err = d.Restart()
	e.Faults.Heal(ev)
	switch {
	case err == nil:
		t.Fatalf("intentd served an etcd whose revision went back from %d to %d: tokens would repeat", lastRev, snapRev)
	case !strings.Contains(err.Error(), "--bump-revision"):
		t.Errorf("intentd refused the restored store but did not say how to restore it (want --bump-revision named):\n%v", err)
	default:
		t.Logf("intentd refused the un-bumped restore:\n%v", err)
	}

	// The documented restore.
	const bump = 1_000_000_000
	ev = e.Faults.Inject("restore-bumped", "snapshot at revision %d restored with --bump-revision %d", snapRev, bump)
	if err := e.Cluster.Restore(ctx, e.Bins.Etcdutl, snapshot, bump); err != nil {
		t.Fatal(err)
	}
	if err := d.Restart(); err != nil {
		t.Fatalf("intentd does not serve the store restored with --bump-revision: %v", err)
	}
	e.Faults.Heal(ev)

	// What the restore lost: registrations (the approver submits them
	// again, with the same terms, as the business system would) and
	// transitions (the intents are no longer COMPLETED).
	cc, err := harness.Dial(e.Addrs()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	approver := client.New(cc, client.WithCallTimeout(5*time.Second))
	var lost, rolledBack int
	for _, k := range keys {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		got, err := approver.Get(rctx, &intentv1.GetRequest{Key: k})
		switch {
		case errors.Is(err, client.ErrNotFound):
			lost++
			var n int
			if _, err := fmt.Sscanf(k[strings.LastIndex(k, "-")+1:], "%d", &n); err != nil {
				t.Fatalf("key %s: %v", k, err)
			}
			if _, err := approver.Register(rctx, &intentv1.RegisterRequest{Key: k, Params: params(n)}); err != nil {
				t.Fatalf("register %s again: %v", k, err)
			}
		case err != nil:
			t.Fatalf("read %s: %v", k, err)
		case got.GetIntent().GetState() != intentv1.State_STATE_COMPLETED:
			rolledBack++
		}
		rcancel()
	}
	t.Logf("after the restore, of %d intents %d were not registered (registered again) and %d no longer COMPLETED", len(keys), lost, rolledBack)
	if lost+rolledBack == 0 {
		t.Fatal("fault proof: the restore rolled back nothing; the snapshot was taken too late to test anything")
	}

	// The workers are handed every intent again, as a queue redelivering
	// unacknowledged messages would.
	rec := NewRecorder()
	again, err := StartLoad(rec, LoadConfig{Name: "after-restore", Max: -1, Seed: harness.Seed(), Merchant: e.MerchantURL,
		Dial: func(int) (*grpc.ClientConn, error) { return harness.Dial(e.Addrs()...) }})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop()
	again.Adopt(keys)
	if left := again.Drain(45 * time.Second); len(left) > 0 {
		t.Errorf("%d intents not COMPLETED again after the restore (first: %v)", len(left), left[:min(5, len(left))])
	}
	again.Stop()
	for _, p := range again.Problems() {
		t.Error(p)
	}
	for k, order := range again.Settled() {
		if orders[k] != order {
			t.Errorf("intent %s completed with order %s before the restore and %s after it", k, orders[k], order)
		}
	}
	calls := rec.Calls()
	for _, c := range calls {
		if leaseIssued(c) && c.Out.Token <= before {
			t.Errorf("after the restore %s of %s issued token %d, not above the %d issued before it", c.Method, c.In.Key, c.Out.Token, before)
		}
	}
	finals := readAll(t, e, keys)
	f := Analyze(calls, finals, e.Merchant.ByReference(), RefOrder)
	reportProblems(t, f.Problems)
	if f.Orders != len(keys) {
		t.Errorf("the merchant holds %d orders for %d intents", f.Orders, len(keys))
	}
	st2 := again.Stats()
	t.Logf("after the restore: %d calls, runs=%d executed=%d (the merchant answered with the existing order) replayed=%d; orders %d for %d intents, duplicates %d",
		len(calls), st2.Runs, st2.Executed, st2.Replayed, f.Orders, len(keys), f.Duplicates)
	report.Add(RunFigures{
		Name: t.Name() + "/after-restore", Operations: len(calls), Intents: len(finals),
		Faults: e.Faults.Events(), Findings: f, Duration: time.Since(e.started),
	})
}

// highestToken is the highest token any call was given or told of.
func highestToken(calls []Call) uint64 {
	var top uint64
	for _, c := range calls {
		top = max(top, c.Out.Token, c.Out.Current)
	}
	return top
}
