package reliability

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
	"google.golang.org/grpc"
)

// intentd's links to etcd fail: cut, half-open (replies dropped), slow.

// cutFor cuts links for d, heals them, and returns when the cut was in
// effect and when it ended (as offsets in the history).
func (e *Env) cutFor(links []*harness.Proxy, d time.Duration) (from, until time.Duration) {
	for _, p := range links {
		p.Cut()
	}
	// The window starts once every link is cut, not when the fault was
	// announced: on a loaded machine the cuts can come tens of
	// milliseconds later, and a call that reached etcd before them is
	// rightly decided.
	from = e.Rec.Since()
	time.Sleep(d)
	until = e.Rec.Since()
	for _, p := range links {
		p.Heal()
	}
	return from, until
}

// noDecisions fails the test for every call of the given clients (all
// clients when nil) that started and was answered within (from, to) with a
// decision only etcd could back (Call.Decided); it returns how many such
// calls were answered without one.
func noDecisions(t *testing.T, calls []Call, clients map[int]bool, from, to time.Duration, why string) (refused int) {
	t.Helper()
	for _, c := range calls {
		if c.Start <= from || c.End >= to || (clients != nil && !clients[c.Client]) {
			continue
		}
		if c.Decided() {
			t.Errorf("%s: %s %s started at %v and was answered %s: a decision without etcd",
				why, c.Method, c.In.Key, c.Start.Round(time.Millisecond), describeOp(c.In, c.Out))
		} else if !c.OK() {
			refused++
		}
	}
	return refused
}

// Scenario 4. intentd's links to every etcd member are cut for 4s while the
// workers still reach intentd: no decision without etcd. Every call that
// arrives meanwhile is answered UNAVAILABLE (or, for an intent already
// COMPLETED, with its replay from memory); no lease, report, registration
// or heartbeat is acknowledged until the links are back.
func TestEtcdUnreachable(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	ev := e.Faults.Inject("cut-etcd-links", "every link from intentd to etcd cut for 4s")
	cutFrom, cutUntil := e.cutFor(e.Links[0], 4*time.Second)
	e.Faults.Heal(ev)
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{})
	refused := noDecisions(t, e.Rec.Calls(), nil, cutFrom, cutUntil, "intentd cut off from etcd")
	t.Logf("while cut off: %d calls answered without a decision", refused)
	if refused == 0 {
		t.Errorf("no call reached intentd while it was cut off from etcd")
	}
}

// Scenario 5. A half-open link: for 4s the leader's client link forwards
// every request and drops every reply, so etcd applies writes whose
// answers intentd never gets. intentd must resolve each ambiguous commit by
// reading back — never by issuing a second lease — and the world must
// still hold one order per intent.
func TestEtcdRepliesLost(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	m := leader(t, e.Cluster)
	before := m.Proxy.Stats()
	ev := e.Faults.Inject("drop-replies", "etcd %s's client link: requests pass, replies dropped, 4s", m.Name)
	m.Proxy.DropReplies()
	time.Sleep(4 * time.Second)
	m.Proxy.Heal()
	e.Faults.Heal(ev)
	after := m.Proxy.Stats()
	sent := after.Forwarded[harness.Upstream] - before.Forwarded[harness.Upstream]
	dropped := after.Discarded[harness.Downstream] - before.Discarded[harness.Downstream]
	t.Logf("during the fault the link forwarded %d request bytes and dropped %d reply bytes", sent, dropped)
	if sent == 0 || dropped == 0 {
		t.Errorf("the half-open link carried %d request bytes and dropped %d reply bytes: no write lost its answer", sent, dropped)
	}
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{})
}

// Scenario 7. Two replicas, each with links of its own to the members;
// half the workers talk to one, half to the other. Replica r1 is cut off
// from etcd for 4s: it decides nothing meanwhile (its workers get
// UNAVAILABLE and retry), while r0 goes on serving its own; an intent held
// by one of r1's workers whose session lapses meanwhile is r0's workers' to
// reconcile (half the intents are delivered twice). No split brain: one
// order per intent, no lease taken from a live session, porcupine passes.
func TestReplicaCutOff(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{Replicas: 2, PrivateLinks: true})
	addrs := e.Addrs()
	load := e.StartLoad(LoadConfig{
		Workers: 8, Redeliver: 50, Seed: harness.Seed(), WaitInProgress: 5 * time.Second,
		Dial: func(i int) (*grpc.ClientConn, error) {
			if i < 0 {
				return harness.Dial(addrs[0])
			}
			return harness.Dial(addrs[i%2])
		},
	})
	e.WaitOK(100, 20*time.Second)

	ev := e.Faults.Inject("cut-off-replica", "replica r1's links to etcd cut for 4s; r0 keeps its own")
	cutFrom, cutUntil := e.cutFor(e.Links[1], 4*time.Second)
	e.Faults.Heal(ev)
	time.Sleep(3 * time.Second)
	e.Finish(load, FinishOptions{})

	onR1, onR0 := map[int]bool{}, map[int]bool{}
	for i := range 8 {
		if i%2 == 1 {
			onR1[load.ClientID(i)] = true
		} else {
			onR0[load.ClientID(i)] = true
		}
	}
	calls := e.Rec.Calls()
	refused := noDecisions(t, calls, onR1, cutFrom, cutUntil, "replica r1 cut off from etcd")
	served := 0
	for _, c := range calls {
		if onR0[c.Client] && c.Start > cutFrom && c.End < cutUntil && c.Transition() {
			served++
		}
	}
	t.Logf("while r1 was cut off: r1 answered %d calls without a decision, r0 acknowledged %d transitions", refused, served)
	if refused == 0 {
		t.Errorf("no call reached replica r1 while it was cut off")
	}
	if served == 0 {
		t.Errorf("replica r0 acknowledged nothing while r1 was cut off: one cut-off replica stopped the service")
	}
}

// Scenario 8. A slow link, then late heartbeats. First one etcd member's
// client link and three of eight workers' links to intentd turn slow. Then,
// at the moment one of the slow workers has placed its order and is still
// finishing its side effect, those workers' requests stop arriving for
// blackhole (8s), well over their 3s session TTL: their heartbeats are late
// and their leases lapse in etcd. (The lapse is noted some 3.5 to 5 s into
// the blackhole: the TTL after the last heartbeat that got through, etcd's
// half-second expiry check, the janitor's pass; with 5 s, the late
// Complete once arrived before the takeover, and was rightly
// accepted, there being no newer token.) The intent is delivered again to the other workers,
// which wait on the lease, see it lapse, take over by reconciling (they
// find the order) and complete under a newer token; the slow worker's
// Complete, arriving after the heal, is refused as stale. No intent is
// completed twice; the merchant holds one order per intent.
func TestSlowLinkLateHeartbeats(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	slow, err := harness.NewProxy(e.Intentds[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Close() })
	const slowWorkers = 3
	var armed atomic.Bool
	striking := make(chan string, 1)
	load := e.StartLoad(LoadConfig{
		Workers: 8, Every: 60 * time.Millisecond, Redeliver: 30, Seed: harness.Seed(),
		ExecuteDelay: 200 * time.Millisecond, WaitInProgress: 10 * time.Second,
		Dial: func(i int) (*grpc.ClientConn, error) {
			if i >= 0 && i < slowWorkers {
				return harness.Dial(slow.Addr())
			}
			return harness.Dial(e.Intentds[0].Addr)
		},
		Executed: func(worker int, key string) {
			if worker < slowWorkers && armed.CompareAndSwap(true, false) {
				striking <- key
			}
		},
	})
	e.WaitOK(100, 20*time.Second)

	m := e.Cluster.Followers(leader(t, e.Cluster))[0]
	ev := e.Faults.Inject("slow-link", "etcd %s's client link +100ms each way; workers 0-%d's link to intentd +300ms each way", m.Name, slowWorkers-1)
	m.Proxy.Set(harness.Upstream, harness.Delay(100*time.Millisecond))
	m.Proxy.Set(harness.Downstream, harness.Delay(100*time.Millisecond))
	slow.Set(harness.Upstream, harness.Delay(300*time.Millisecond))
	slow.Set(harness.Downstream, harness.Delay(300*time.Millisecond))
	time.Sleep(2 * time.Second)
	armed.Store(true)
	var key string
	select {
	case key = <-striking:
	case <-time.After(15 * time.Second):
		t.Fatal("no slow worker placed an order within 15s")
	}
	const blackhole = 8 * time.Second
	late := e.Faults.Inject("late-heartbeats", "workers 0-%d's requests to intentd blackholed for %s (session TTL 3s), while one finishes %s", slowWorkers-1, blackhole, key)
	slow.Set(harness.Upstream, harness.Blackhole)
	// Whichever worker is idle takes a delivery, slow ones included, and a
	// slow one then hangs in the blackhole with it: the striking worker is
	// busy finishing, so the other slowWorkers-1 take at most as many, and
	// slowWorkers deliveries reach a fast worker. (With two, both once went
	// to slow workers: nobody took over, the lease lapsed with no newer
	// token, and the late Complete was rightly accepted, testing nothing.)
	for range slowWorkers {
		load.Deliver(key)
	}
	time.Sleep(blackhole)
	slow.Heal()
	m.Proxy.Heal()
	e.Faults.Heal(late)
	e.Faults.Heal(ev)
	time.Sleep(3 * time.Second)
	run := e.Finish(load, FinishOptions{})
	if run.Findings.Lapsed == 0 {
		t.Errorf("no lease lapsed: the late heartbeats did not make any session lapse")
	}
	if run.Findings.StaleRefused == 0 {
		t.Errorf("no late Complete was refused as stale (stale reports of any kind: %d)", run.Findings.StaleReports)
		for _, c := range e.Rec.Calls() {
			if c.In.Key == key {
				t.Logf("%s: client %d [%v, %v] %s", key, c.Client, c.Start.Round(time.Millisecond), c.End.Round(time.Millisecond), describeOp(c.In, c.Out))
			}
		}
	}
}
