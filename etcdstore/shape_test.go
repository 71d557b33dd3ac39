package etcdstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// The store is shaped for speed as DESIGN.md asks: a happy-path intent
// costs two etcd writes and no reads once the worker's session is open (and
// the store knows the tombstone chunks, as it does from its start under
// RunJanitor), and a replay of a final intent touches etcd not at all.
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
	if err := s.LearnTombstones(ctx(t)); err != nil {
		t.Fatal(err)
	}
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

// A heartbeat answers from the cached records only when etcd confirms,
// in the same read, that none changed: a lease another replica took over
// since this one cached the record is reported as superseded.
func TestHeartbeatSeesALeaseTakenThroughAnotherReplica(t *testing.T) {
	c := newCluster(t)
	var writes, reads int
	kv := countingKV(c.cli.KV, &writes, &reads)
	a, err := etcdstore.NewWithKV(c.cli, kv, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	b := c.store(t)
	sess := openSession(t, a, "w", 30*time.Second)
	var held []intent.HeldLease
	for i := range 3 {
		reg := lamp(t, fmt.Sprintf("hb-other-%d", i), 1)
		got, err := a.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: sess, RequestID: "r", Register: &reg})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, intent.HeldLease{Key: reg.Key, Token: got.Lease.Token})
	}
	if _, err := a.Heartbeat(ctx(t), "default", sess, held); err != nil {
		t.Fatalf("heartbeat naming current leases: %v", err)
	}

	// Through the other replica, the second lease is released and taken
	// by another worker: its token is superseded, which a holds no news of.
	taken := held[1].Key
	if _, err := report(t, b, intent.Report{Key: taken, Token: held[1].Token, Kind: intent.ReportRelease}); err != nil {
		t.Fatalf("Release through the other replica: %v", err)
	}
	other := openSession(t, b, "w2", 30*time.Second)
	now := acquire(t, b, taken, other)
	mustOutcome(t, now, intent.OutcomeExecute)

	_, err = a.Heartbeat(ctx(t), "default", sess, held)
	mustStale(t, err, now.Lease.Token)
	if in := get(t, b, taken); in.Lease.Token != now.Lease.Token || in.Lease.SessionID != other {
		t.Fatalf("after the stale heartbeat: lease %+v, want token %d of session %s", in.Lease, now.Lease.Token, other)
	}
}
