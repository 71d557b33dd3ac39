package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// cluster is one real etcd member and the client the test's stores share.
type cluster struct {
	srv *etcdtest.Server
	cli *clientv3.Client
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	srv := etcdtest.Start(t)
	return &cluster{srv: srv, cli: srv.Client(t)}
}

// store returns a new Store on the cluster: each is like one intentd
// replica, with its own caches.
func (c *cluster) store(t testing.TB) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(c.cli, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// lamp is the approved purchase of the seed article.
func lamp(t *testing.T, key string, quantity float64) intent.Registration {
	t.Helper()
	params, err := intent.Canonical(map[string]any{
		"item": "desk lamp", "quantity": quantity, "merchant": "M", "max_amount": "89.00", "currency": "EUR",
	})
	if err != nil {
		t.Fatal(err)
	}
	return intent.Registration{Tenant: "default", Key: key, Params: params}
}

func register(t *testing.T, s *etcdstore.Store, reg intent.Registration) *intent.Intent {
	t.Helper()
	in, _, err := s.Register(ctx(t), reg)
	if err != nil {
		t.Fatalf("Register(%s): %v", reg.Key, err)
	}
	return in
}

func openSession(t *testing.T, s *etcdstore.Store, worker string, ttl time.Duration) string {
	t.Helper()
	sess, err := s.OpenSession(ctx(t), "default", worker, ttl)
	if err != nil {
		t.Fatalf("OpenSession(%s): %v", worker, err)
	}
	return sess.ID
}

var requestSeq atomic.Int64

func acquire(t *testing.T, s *etcdstore.Store, key, session string) *intent.Acquisition {
	t.Helper()
	a, err := s.Acquire(ctx(t), intent.AcquireRequest{
		Tenant: "default", Key: key, SessionID: session,
		RequestID: fmt.Sprintf("req-%d", requestSeq.Add(1)),
	})
	if err != nil {
		t.Fatalf("Acquire(%s, %s): %v", key, session, err)
	}
	return a
}

func mustOutcome(t *testing.T, a *intent.Acquisition, want intent.Outcome) {
	t.Helper()
	if a.Outcome != want {
		t.Fatalf("Acquire outcome = %v, want %v", a.Outcome, want)
	}
}

func report(t *testing.T, s *etcdstore.Store, r intent.Report) (*intent.ReportOutcome, error) {
	t.Helper()
	if r.Tenant == "" {
		r.Tenant = "default"
	}
	return s.Report(ctx(t), r)
}

func complete(key string, token fencing.Token, orderID string) intent.Report {
	return intent.Report{
		Key: key, Kind: intent.ReportComplete, Token: token,
		Result: &intent.Result{Payload: []byte(`{"order":"` + orderID + `"}`), ExternalRefs: map[string]string{"supplier_order_id": orderID}},
	}
}

func get(t *testing.T, s *etcdstore.Store, key string) *intent.Intent {
	t.Helper()
	in, err := s.Get(ctx(t), "default", key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return in
}

// lapse ends a session as if its worker stopped heartbeating, without
// waiting for the TTL (one test waits for a real expiry).
func lapse(t *testing.T, s *etcdstore.Store, session string) {
	t.Helper()
	if err := s.CloseSession(ctx(t), "default", session); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
}

func mustStale(t *testing.T, err error, current fencing.Token) {
	t.Helper()
	var stale *intent.StaleTokenError
	if !errors.As(err, &stale) {
		t.Fatalf("err = %v, want a *intent.StaleTokenError", err)
	}
	if stale.Current != current {
		t.Fatalf("StaleTokenError.Current = %d, want %d", stale.Current, current)
	}
}

// hookedKV passes every call to etcd and lets a test watch and alter what
// the store's calls see: each Get, and each transaction after etcd answered
// it (write says whether its Then branch puts or deletes). Hooks run under
// one mutex.
type hookedKV struct {
	clientv3.KV
	mu          sync.Mutex
	onGet       func()
	afterCommit func(write bool, resp *clientv3.TxnResponse, err error) (*clientv3.TxnResponse, error)
}

func (k *hookedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if k.onGet != nil {
		k.mu.Lock()
		k.onGet()
		k.mu.Unlock()
	}
	return k.KV.Get(ctx, key, opts...)
}

func (k *hookedKV) Txn(ctx context.Context) clientv3.Txn {
	return &hookedTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type hookedTxn struct {
	clientv3.Txn
	kv    *hookedKV
	write bool
}

func (t *hookedTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *hookedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		t.write = t.write || op.IsPut() || op.IsDelete() || op.IsTxn()
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *hookedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *hookedTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if t.kv.afterCommit == nil {
		return resp, err
	}
	t.kv.mu.Lock()
	defer t.kv.mu.Unlock()
	return t.kv.afterCommit(t.write, resp, err)
}

// lossyKV throws away the reply of every write transaction etcd applied:
// the worst case of an ambiguous commit (a timeout or a leader change after
// the commit). It counts the replies it dropped.
func lossyKV(kv clientv3.KV, dropped *int) *hookedKV {
	return &hookedKV{KV: kv, afterCommit: func(write bool, resp *clientv3.TxnResponse, err error) (*clientv3.TxnResponse, error) {
		if err != nil || !write {
			return resp, err
		}
		*dropped++
		return nil, status.Error(codes.Unavailable, "lossyKV: reply dropped after commit")
	}}
}

// countingKV counts round trips: write transactions, and reads (Gets and
// read-only transactions).
func countingKV(kv clientv3.KV, writes, reads *int) *hookedKV {
	return &hookedKV{
		KV:    kv,
		onGet: func() { *reads++ },
		afterCommit: func(write bool, resp *clientv3.TxnResponse, err error) (*clientv3.TxnResponse, error) {
			if write {
				*writes++
			} else {
				*reads++
			}
			return resp, err
		},
	}
}
