package etcdstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// countingKV counts the store's etcd round trips: write transactions (any
// transaction with a put or delete) and reads.
type countingKV struct {
	clientv3.KV
	mu            sync.Mutex
	writes, reads int
}

func (k *countingKV) counts() (writes, reads int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.writes, k.reads
}

func (k *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.mu.Lock()
	k.reads++
	k.mu.Unlock()
	return k.KV.Get(ctx, key, opts...)
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	return &countingTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type countingTxn struct {
	clientv3.Txn
	kv     *countingKV
	writes bool
}

func (t *countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *countingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *countingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		t.writes = t.writes || op.IsPut() || op.IsDelete()
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *countingTxn) Commit() (*clientv3.TxnResponse, error) {
	t.kv.mu.Lock()
	if t.writes {
		t.kv.writes++
	} else {
		t.kv.reads++
	}
	t.kv.mu.Unlock()
	return t.Txn.Commit()
}

// The store is shaped for speed as DESIGN.md asks: a happy-path intent
// costs two etcd writes and no reads once the worker's session is open, and
// a replay of a final intent touches etcd not at all.
func TestHappyPathCostsTwoWritesAndReplaysAreFree(t *testing.T) {
	c := newCluster(t)
	kv := &countingKV{KV: c.cli.KV}
	s, err := etcdstore.NewWithKV(c.cli, kv, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	sess := openSession(t, s, "w", 30*time.Second)
	w0, r0 := kv.counts()

	reg := lamp(t, "fast-1", 1)
	a, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: sess, RequestID: "r1", Register: &reg})
	if err != nil {
		t.Fatal(err)
	}
	mustOutcome(t, a, intent.OutcomeExecute)
	if _, err := report(t, s, complete(reg.Key, a.Lease.Token, "SO-1")); err != nil {
		t.Fatal(err)
	}
	w1, r1 := kv.counts()
	if w1-w0 != 2 || r1-r0 != 0 {
		t.Fatalf("register+acquire+complete cost %d writes and %d reads, want 2 writes and 0 reads", w1-w0, r1-r0)
	}

	for range 10 {
		mustOutcome(t, acquire(t, s, reg.Key, sess), intent.OutcomeCompleted)
	}
	if w2, r2 := kv.counts(); w2 != w1 || r2 != r1 {
		t.Fatalf("10 replays cost %d writes and %d reads, want none", w2-w1, r2-r1)
	}
}
