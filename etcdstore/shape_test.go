package etcdstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// The store is shaped for speed as DESIGN.md asks: a happy-path intent
// costs two etcd writes and no reads once the worker's session is open, and
// a replay of a final intent touches etcd not at all.
func TestHappyPathCostsTwoWritesAndReplaysAreFree(t *testing.T) {
	c := newCluster(t)
	var writes, reads int
	kv := countingKV(c.cli.KV, &writes, &reads)
	counts := func() (int, int) {
		kv.mu.Lock()
		defer kv.mu.Unlock()
		return writes, reads
	}
	s, err := etcdstore.NewWithKV(c.cli, kv, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	sess := openSession(t, s, "w", 30*time.Second)
	w0, r0 := counts()

	reg := lamp(t, "fast-1", 1)
	a, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: sess, RequestID: "r1", Register: &reg})
	if err != nil {
		t.Fatal(err)
	}
	mustOutcome(t, a, intent.OutcomeExecute)
	if _, err := report(t, s, complete(reg.Key, a.Lease.Token, "SO-1")); err != nil {
		t.Fatal(err)
	}
	w1, r1 := counts()
	if w1-w0 != 2 || r1-r0 != 0 {
		t.Fatalf("register+acquire+complete cost %d writes and %d reads, want 2 writes and 0 reads", w1-w0, r1-r0)
	}

	for range 10 {
		mustOutcome(t, acquire(t, s, reg.Key, sess), intent.OutcomeCompleted)
	}
	if w2, r2 := counts(); w2 != w1 || r2 != r1 {
		t.Fatalf("10 replays cost %d writes and %d reads, want none", w2-w1, r2-r1)
	}
}

// A heartbeat's cost grows with workers, not with the intents a worker
// holds: naming 20 held leases costs one read.
func TestHeartbeatCostsOneReadWhateverItNames(t *testing.T) {
	c := newCluster(t)
	var writes, reads int
	kv := countingKV(c.cli.KV, &writes, &reads)
	counts := func() (int, int) {
		kv.mu.Lock()
		defer kv.mu.Unlock()
		return writes, reads
	}
	s, err := etcdstore.NewWithKV(c.cli, kv, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	sess := openSession(t, s, "w", 30*time.Second)
	var held []intent.HeldLease
	for i := range 20 {
		reg := lamp(t, fmt.Sprintf("hb-%d", i), 1)
		a, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: sess, RequestID: "r", Register: &reg})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, intent.HeldLease{Key: reg.Key, Token: a.Lease.Token})
	}
	w0, r0 := counts()
	if _, err := s.Heartbeat(ctx(t), "default", sess, held); err != nil {
		t.Fatal(err)
	}
	if w1, r1 := counts(); w1 != w0 || r1-r0 != 1 {
		t.Fatalf("a heartbeat naming %d leases cost %d writes and %d reads, want 0 and 1", len(held), w1-w0, r1-r0)
	}
}
