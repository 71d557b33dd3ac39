package reliability

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// intentd replicas' wall clocks jump.

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
	e := NewEnv(t, report, EnvConfig{Replicas: 2, Intentd: harness.IntentdConfig{InjectedClock: true}})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
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
func janitorReplica(t *testing.T, e *Env) (sweeper, other *harness.Intentd) {
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

func setClock(t *testing.T, d *harness.Intentd, offset time.Duration) {
	t.Helper()
	if err := d.SetClock(offset); err != nil {
		t.Fatalf("clock of intentd %s: %v", d.Name, err)
	}
}
