package reliability

import (
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
)

// intentd processes fail: killed and restarted, one of two replicas killed.

// Scenario 6a. intentd is killed (kill -9) under load and restarted 1s
// later on the same address: no acknowledged transition is lost, tokens go
// on increasing, and workers carry on through the restart.
func TestIntentdKilled(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	d := e.Intentds[0]
	ev := e.Faults.Inject("kill-intentd", "intentd %s, SIGKILL, restarted after 1s", d.Name)
	d.Kill()
	time.Sleep(time.Second)
	if err := d.Restart(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(ev)
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{})
}

// Scenario 6b. Two intentd replicas share the cluster and the workers'
// calls; one is killed and stays down for 3s while the other serves
// everything, then comes back. Sessions and leases live in etcd, not in a
// replica, so nothing is lost and nothing is done twice.
func TestIntentdReplicaKilled(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{Replicas: 2})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	d, other := e.Intentds[0], e.Intentds[1]
	// Round robin moves the calls to the survivor at once, so that often
	// no call notices the kill. The proof is then that the killed replica
	// had been answering calls, and the survivor answered the rest.
	time.Sleep(time.Second)
	ev := e.Faults.Inject("kill-intentd", "replica %s of 2, SIGKILL, down 3s", d.Name)
	servedBefore, otherBefore := d.Served(), other.Served()
	d.Kill()
	time.Sleep(3 * time.Second)
	otherDuring := other.Served() - otherBefore
	if err := d.Restart(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(ev)
	time.Sleep(2 * time.Second)
	t.Logf("replica %s had answered %d calls when it was killed; %s answered %d while it was down", d.Name, servedBefore, other.Name, otherDuring)
	e.Finish(load, FinishOptions{Noticed: func(FaultEvent, []Call) int {
		if servedBefore == 0 || otherDuring == 0 {
			return 0
		}
		return int(otherDuring)
	}})
}
