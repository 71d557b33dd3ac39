package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
	"google.golang.org/grpc"
)

// soakFault is one kind of fault the soak picks from: inject starts it and
// returns what heals it.
type soakFault struct {
	kind   string
	weight int
	// hold is how long the fault lasts; zero draws 1–3s.
	hold   time.Duration
	inject func(s *soak) (detail string, heal func())
}

// soak is the state of a soak run.
type soak struct {
	t       *testing.T
	e       *Env
	rng     *rand.Rand
	workers []*harness.Proxy // the links of the first workers to intentd
	procs   *WorkerProcs
}

func (s *soak) proc() *WorkerProc { return s.procs.Procs[s.rng.IntN(len(s.procs.Procs))] }

func (s *soak) member() *Member { return s.e.Cluster.Members[s.rng.IntN(len(s.e.Cluster.Members))] }

func (s *soak) worker() (int, *harness.Proxy) {
	i := s.rng.IntN(len(s.workers))
	return i, s.workers[i]
}

var soakFaults = []soakFault{
	{"kill-leader", 3, 0, func(s *soak) (string, func()) {
		m := leader(s.t, s.e.Cluster)
		m.Kill()
		return "etcd " + m.Name, func() { restart(s.t, m) }
	}},
	{"kill-follower", 2, 0, func(s *soak) (string, func()) {
		m := s.e.Cluster.Followers(leader(s.t, s.e.Cluster))[s.rng.IntN(2)]
		m.Kill()
		return "etcd " + m.Name, func() { restart(s.t, m) }
	}},
	{"pause-member", 3, 0, func(s *soak) (string, func()) {
		m := s.member()
		if err := m.Stop(); err != nil {
			s.t.Fatal(err)
		}
		return "etcd " + m.Name, func() { _ = m.Cont() }
	}},
	{"drop-replies", 3, 0, func(s *soak) (string, func()) {
		m := s.member()
		m.Proxy.DropReplies()
		return "etcd " + m.Name + "'s client link", m.Proxy.Heal
	}},
	{"slow-etcd-link", 2, 0, func(s *soak) (string, func()) {
		m := s.member()
		d := time.Duration(50+s.rng.IntN(250)) * time.Millisecond
		m.Proxy.Set(harness.Upstream, harness.Delay(d))
		m.Proxy.Set(harness.Downstream, harness.Delay(d))
		return fmt.Sprintf("etcd %s's client link +%v each way", m.Name, d), m.Proxy.Heal
	}},
	{"cut-etcd-link", 2, 0, func(s *soak) (string, func()) {
		m := s.member()
		m.Proxy.Cut()
		return "etcd " + m.Name + "'s client link", m.Proxy.Heal
	}},
	{"kill-intentd", 2, 0, func(s *soak) (string, func()) {
		d := s.e.Intentds[s.rng.IntN(len(s.e.Intentds))]
		d.Kill()
		return "replica " + d.Name, func() {
			if err := d.Restart(); err != nil {
				s.t.Fatal(err)
			}
		}
	}},
	{"pause-worker", 2, 4 * time.Second, func(s *soak) (string, func()) {
		// A stopped worker process: nothing it sends arrives, heartbeats
		// included, until it continues, past its session TTL.
		i, p := s.worker()
		p.Set(harness.Upstream, harness.Blackhole)
		return fmt.Sprintf("worker %d's link to intentd", i), p.Heal
	}},
	{"worker-lost-replies", 2, 0, func(s *soak) (string, func()) {
		i, p := s.worker()
		p.DropReplies()
		return fmt.Sprintf("worker %d's link to intentd", i), p.Heal
	}},
	{"kill-worker-process", 2, 0, func(s *soak) (string, func()) {
		// Whatever it was doing: the key it ran goes back to the queue,
		// a call it was in is an unknown outcome.
		w := s.proc()
		w.Kill()
		return "worker process " + w.Name + ", SIGKILL, restarted at the heal", func() {
			if err := w.Start(); err != nil {
				s.t.Fatal(err)
			}
		}
	}},
	{"pause-worker-process", 2, 4 * time.Second, func(s *soak) (string, func()) {
		w := s.proc()
		if err := w.Stop(); err != nil {
			s.t.Fatal(err)
		}
		return "worker process " + w.Name + ", SIGSTOP past its session TTL", func() {
			if err := w.Cont(); err != nil {
				s.t.Fatal(err)
			}
		}
	}},
	{"quorum-loss", 1, 0, func(s *soak) (string, func()) {
		m := leader(s.t, s.e.Cluster)
		f := s.e.Cluster.Followers(m)[s.rng.IntN(2)]
		m.Kill()
		f.Kill()
		return "etcd " + m.Name + " and " + f.Name, func() { restart(s.t, m); restart(s.t, f) }
	}},
}

func (s *soak) pick() soakFault {
	total := 0
	for _, f := range soakFaults {
		total += f.weight
	}
	r := s.rng.IntN(total)
	for _, f := range soakFaults {
		if r < f.weight {
			return f
		}
		r -= f.weight
	}
	panic("unreachable")
}

// Scenario 14. A seeded mixed-fault soak: two intentd replicas, eight
// worker goroutines (the first two behind links of their own) and two
// worker processes, intents delivered twice a third of the time, and one
// fault after another drawn from the plan above — etcd members killed,
// paused and cut off, replies lost on either side of intentd, replicas
// killed, workers paused past their session TTL (a blackholed link, or a
// SIGSTOPped process), worker processes killed, quorum lost — each held
// for 1–3s (a paused worker 4s), then healed. CI runs 20s of it; -soak runs -soak-duration (an hour by
// default). At the end the merchant holds exactly one order per intent,
// every acknowledged transition is present, and porcupine passes.
func TestSoak(t *testing.T) {
	duration := 20 * time.Second
	every := 40 * time.Millisecond
	if harness.Soak() {
		duration, every = harness.SoakDuration(), 100*time.Millisecond
	}
	seed := harness.Seed()
	t.Logf("soak: seed %d (-seed to repeat), %v of faults", seed, duration)
	s := &soak{t: t, rng: rand.New(rand.NewPCG(seed, 14))}
	s.e = NewEnv(t, report, EnvConfig{Replicas: 2})
	addrs := s.e.Addrs()
	for range 2 {
		p, err := harness.NewProxy(addrs[len(s.workers)%len(addrs)])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		s.workers = append(s.workers, p)
	}
	load := s.e.StartLoad(LoadConfig{
		Workers: 8, Every: every, Redeliver: 33, Seed: seed, ExecuteDelay: 20 * time.Millisecond,
		Dial: func(i int) (*grpc.ClientConn, error) {
			if i >= 0 && i < len(s.workers) {
				return harness.Dial(s.workers[i].Addr())
			}
			return harness.Dial(addrs...)
		},
	})
	s.procs = s.e.StartWorkerProcs(load, 2)
	s.e.WaitOK(100, 20*time.Second)

	end := time.Now().Add(duration)
	for n := 0; time.Now().Before(end); n++ {
		f := s.pick()
		detail, heal := f.inject(s)
		ev := s.e.Faults.Inject(f.kind, "%s", detail)
		hold := f.hold
		if hold == 0 {
			hold = time.Second + time.Duration(s.rng.IntN(2000))*time.Millisecond
		}
		time.Sleep(hold)
		heal()
		s.e.Faults.Heal(ev)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if _, err := s.e.Cluster.WaitLeader(ctx); err != nil {
			t.Fatalf("after healing %s (%s): %v", f.kind, detail, err)
		}
		cancel()
		time.Sleep(500*time.Millisecond + time.Duration(s.rng.IntN(1500))*time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	s.e.Finish(load, FinishOptions{Drain: time.Minute, AnySeen: true})
	t.Logf("worker processes: %s", s.procs.Stats())
}
