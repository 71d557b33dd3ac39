package reliability

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// clockJump is how far scenario 9 moves a replica's clock.
const clockJump = 5 * time.Minute

// Scenario 9. Two replicas' clocks jump five minutes in opposite directions
// under load, twice: first the janitor's replica forward and the other
// back, then the other way round. intentd reads the wall clock only for
// history times and retention; whether a lease is live is etcd's to say.
// So nothing may change but the times written: no lease lapses, no session
// is lost, and every check of the suite holds. The proof that the fault
// happened is in the histories: entries written during each jump carry a
// time five minutes off.
func TestClockJumps(t *testing.T) {
	e := NewEnv(t, bins, report, EnvConfig{Replicas: 2, Intentd: IntentdConfig{InjectedClock: true}})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: *seedFlag})
	e.WaitOK(100, 20*time.Second)

	sweeper, other := janitorReplica(t, e)
	t.Logf("intentd %s runs the janitor", sweeper.Name)
	wall := map[*FaultEvent]time.Time{}
	jump := func(a, b time.Duration) {
		ev := e.Faults.Inject("clock-jump", "intentd %s %+v, intentd %s %+v", sweeper.Name, a, other.Name, b)
		wall[ev] = time.Now()
		setClock(t, sweeper, a)
		setClock(t, other, b)
		time.Sleep(4 * time.Second)
		setClock(t, sweeper, 0)
		setClock(t, other, 0)
		time.Sleep(200 * time.Millisecond) // intentd rereads the file within 100ms
		e.Faults.Heal(ev)
		time.Sleep(time.Second)
	}
	jump(clockJump, -clockJump)
	jump(-clockJump, clockJump)
	time.Sleep(time.Second)

	// Count, per jump, the history entries whose time is five minutes off
	// the real time of the jump: entries written under the jumped clocks.
	skewed := map[string]int{}
	byDetail := map[string]time.Time{}
	for ev, start := range wall {
		byDetail[ev.Detail] = start
	}
	for _, in := range readAll(t, e, load.Keys()) {
		for _, h := range in.GetHistory() {
			at := h.GetTime().AsTime()
			for detail, start := range byDetail {
				end := start.Add(5 * time.Second)
				for _, off := range []time.Duration{clockJump, -clockJump} {
					if !at.Before(start.Add(off-time.Second)) && !at.After(end.Add(off+time.Second)) {
						skewed[detail]++
					}
				}
			}
		}
	}
	run := e.Finish(load, FinishOptions{Noticed: func(ev FaultEvent, _ []Call) int { return skewed[ev.Detail] }})
	t.Logf("history entries written under a jumped clock: %v", skewed)
	if run.Findings.Lapsed > 0 {
		t.Errorf("%d leases lapsed: a clock jump must not end a lease (etcd decides liveness)", run.Findings.Lapsed)
	}
	if st := load.Stats(); st.SessionsLost > 0 {
		t.Errorf("%d sessions lost: a clock jump must not end a session", st.SessionsLost)
	}
}

// janitorReplica returns the replica holding the janitor election and
// another one. The election's oldest key holds the sweeper's address.
func janitorReplica(t *testing.T, e *Env) (sweeper, other *Intentd) {
	t.Helper()
	admin, err := e.Cluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := admin.Get(ctx, "/intentd/v1/janitor/", clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		cancel()
		if err == nil && len(resp.Kvs) == 1 {
			addr := string(resp.Kvs[0].Value)
			for i, d := range e.Intentds {
				if d.Addr == addr || strings.HasSuffix(addr, d.Addr[strings.LastIndex(d.Addr, ":"):]) {
					return d, e.Intentds[(i+1)%len(e.Intentds)]
				}
			}
			t.Fatalf("the janitor election names %q, no replica of %v", addr, e.Addrs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no replica holds the janitor election after 10s")
	return nil, nil
}

func setClock(t *testing.T, d *Intentd, offset time.Duration) {
	t.Helper()
	if err := d.SetClock(offset); err != nil {
		t.Fatalf("clock of intentd %s: %v", d.Name, err)
	}
}

// readAll reads every key with its history through an unrecorded client.
func readAll(t *testing.T, e *Env, keys []string) map[string]*intentv1.Intent {
	t.Helper()
	cc, err := Dial(e.Addrs()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := client.New(cc, client.WithCallTimeout(5*time.Second))
	out := map[string]*intentv1.Intent{}
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		resp, err := c.Get(ctx, &intentv1.GetRequest{Key: k})
		cancel()
		if err != nil {
			t.Fatalf("read %s: %v", k, err)
		}
		out[k] = resp.GetIntent()
	}
	return out
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
	e := NewEnv(t, bins, report, EnvConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: *seedFlag})
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
	if err := e.Cluster.Restore(ctx, bins.Etcdutl, snapshot, 0); err != nil {
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
	if err := e.Cluster.Restore(ctx, bins.Etcdutl, snapshot, bump); err != nil {
		t.Fatal(err)
	}
	if err := d.Restart(); err != nil {
		t.Fatalf("intentd does not serve the store restored with --bump-revision: %v", err)
	}
	e.Faults.Heal(ev)

	// What the restore lost: registrations (the approver submits them
	// again, with the same terms, as the business system would) and
	// transitions (the intents are no longer COMPLETED).
	cc, err := Dial(e.Addrs()...)
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
	again, err := StartLoad(rec, LoadConfig{Name: "after-restore", Max: -1, Seed: *seedFlag, Merchant: e.MerchantURL,
		Dial: func(int) (*grpc.ClientConn, error) { return Dial(e.Addrs()...) }})
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

// Faults on etcd's peer links. The leader is partitioned from the other
// two members for 5s while every client still reaches all three: the
// majority elects a new leader, the old one steps down (it can no longer
// hear a quorum), and intentd's calls that land on it fail or wait rather
// than decide anything on a minority. Then the partition heals.
func TestEtcdLeaderPartitioned(t *testing.T) {
	e := NewEnv(t, bins, report, EnvConfig{Cluster: ClusterConfig{PeerProxies: true}})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: *seedFlag})
	e.WaitOK(100, 20*time.Second)

	old := leader(t, e.Cluster)
	ev := e.Faults.Inject("partition-leader", "etcd %s cut off from its peers", old.Name)
	if err := e.Cluster.Partition(old); err != nil {
		t.Fatal(err)
	}
	next := majorityLeader(t, e.Cluster, old)
	t.Logf("etcd %s partitioned; %s leads the majority after %v", old.Name, next.Name, e.Rec.Since()-ev.Injected)
	time.Sleep(4 * time.Second)
	e.Cluster.HealPartition()
	e.Faults.Heal(ev)
	leader(t, e.Cluster)
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{})
	for _, m := range e.Cluster.Members {
		st := m.PeerProxy.Stats()
		t.Logf("etcd %s peer proxy: accepted %d, refused %d, reset %d", m.Name, st.Accepted, st.Refused, st.Reset)
	}
	if st := old.PeerProxy.Stats(); st.Refused+st.Reset == 0 {
		t.Error("fault proof: the partitioned member's peer proxy refused and reset nothing")
	}
}

// majorityLeader waits up to 10s until the members other than cut agree on
// a leader that is not cut.
func majorityLeader(t *testing.T, c *Cluster, cut *Member) *Member {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var lead uint64
		agree := true
		byID := map[uint64]*Member{}
		for _, m := range c.Members {
			if m == cut {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := m.status(ctx)
			cancel()
			if err != nil || st.Leader == 0 || (lead != 0 && st.Leader != lead) {
				agree = false
				break
			}
			lead = st.Leader
			byID[st.Header.GetMemberId()] = m
		}
		if m, ok := byID[lead]; agree && ok {
			return m
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the members other than %s elected no leader among themselves within 10s", cut.Name)
	return nil
}
