package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// put is a member that writes key, guarded by key being absent, and
// optionally compares more keys.
func put(key string, compared ...string) *member {
	m := &member{
		cmps:   []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", 0)},
		ops:    []clientv3.Op{clientv3.OpPut(key, "v")},
		reads:  append([]string{key}, compared...),
		writes: []string{key},
		bytes:  len(key) + 1,
	}
	for _, k := range compared {
		m.cmps = append(m.cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
	}
	return m
}

func withSlot(m *member, slot int) *member { m.slot = slot; return m }

func withOps(m *member, n int) *member {
	for i := len(m.ops); i < n; i++ {
		k := m.writes[0] + "/" + strings.Repeat("x", i)
		m.ops, m.writes = append(m.ops, clientv3.OpPut(k, "v")), append(m.writes, k)
	}
	return m
}

func TestBatchAdmit(t *testing.T) {
	big := put("big")
	big.bytes = maxTxnBytes - 1
	for _, tc := range []struct {
		name    string
		batch   []*member
		next    *member
		admit   bool
		because string
	}{
		{"first is always admitted", nil, withOps(put("a"), maxTxnOps), true, "a batch of one is a plain transaction"},
		{"distinct keys", []*member{put("a"), put("b")}, put("c"), true, ""},
		{"same key written", []*member{put("a"), put("b")}, put("a"), false, "etcd refuses two writes of a key in one request"},
		{"writes what another compares", []*member{put("a", "c")}, put("c"), false, "compares see the state before every write"},
		{"compares what another writes", []*member{put("a")}, put("c", "a"), false, "compares see the state before every write"},
		{"compares what another compares", []*member{put("a", "s")}, put("c", "s"), true, "reads do not conflict"},
		{"same token slot", []*member{withSlot(put("a"), 3)}, withSlot(put("b"), 3), false, "two leases of one revision need two slots"},
		{"different token slots", []*member{withSlot(put("a"), 3)}, withSlot(put("b"), 4), true, ""},
		{"ops within the limit", []*member{withOps(put("a"), maxTxnOps-2)}, put("b"), true, "2 members + 126 nested ops = 128"},
		{"ops past the limit", []*member{withOps(put("a"), maxTxnOps-1)}, put("b"), false, "2 members + 127 nested ops > 128"},
		{"bytes past the limit", []*member{big}, put("b"), false, "the request would pass maxTxnBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b batch
			for _, m := range tc.batch {
				if !b.admit(m) {
					t.Fatalf("setup: member %v not admitted", m.writes)
				}
			}
			if got := b.admit(tc.next); got != tc.admit {
				t.Errorf("admit = %t, want %t (%s)", got, tc.admit, tc.because)
			}
		})
	}
	// One-op members: the outer transaction's ops plus one nested op stay
	// within maxTxnOps, and never more members than token slots.
	var b batch
	for i := range 2 * maxTxnOps {
		b.admit(put(strings.Repeat("k", i+1)))
	}
	if want := min(maxTxnOps-1, machine.TokenSlots); len(b.members) != want {
		t.Errorf("a batch of one-op members holds %d, want %d", len(b.members), want)
	}
}

// Each member of a shared transaction gets its own outcome: a failed
// compare fails that member only, and the others commit at the batch's
// one revision.
func TestSharedTransactionOutcomePerMember(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	if _, err := cli.Put(ctx, "taken", "old"); err != nil {
		t.Fatal(err)
	}
	c := &committer{kv: cli.KV, timeout: DefaultConfig().RequestTimeout}
	members := []*member{put("free-1"), put("taken"), put("free-2")}
	for _, m := range members {
		m.ctx, m.done = ctx, make(chan outcome, 1)
	}
	c.send(members)
	var got []outcome
	for _, m := range members {
		got = append(got, <-m.done)
	}
	if got[0].err != nil || !got[0].succeeded || got[2].err != nil || !got[2].succeeded {
		t.Fatalf("free keys: %+v and %+v, want both committed", got[0], got[2])
	}
	if got[1].err != nil || got[1].succeeded {
		t.Fatalf("taken key: %+v, want a failed compare", got[1])
	}
	if got[0].rev != got[2].rev {
		t.Errorf("members committed at revisions %d and %d, want the batch's one", got[0].rev, got[2].rev)
	}
	resp, err := cli.Get(ctx, "taken")
	if err != nil {
		t.Fatal(err)
	}
	if v := string(resp.Kvs[0].Value); v != "old" {
		t.Errorf("taken = %q, want %q: its member's compare failed", v, "old")
	}
}

// An etcd configured with a lower --max-txn-ops than the default refuses
// a full batch whole; nothing was written, and the batch goes again in
// halves until it passes. The batches observed are the requests etcd
// took, not the refused ones.
func TestSharedTransactionTooManyOpsIsSplit(t *testing.T) {
	cli := etcdtest.StartWith(t, t.TempDir(), func(cfg *embed.Config) { cfg.MaxTxnOps = 4 }).Client(t)
	ctx := context.Background()
	var observed []int
	c := &committer{kv: cli.KV, timeout: DefaultConfig().RequestTimeout, observe: func(n int) { observed = append(observed, n) }}
	var members []*member
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		m := withOps(put(k), 2)
		m.ctx, m.done = ctx, make(chan outcome, 1)
		members = append(members, m)
	}
	c.send(members)
	for _, m := range members {
		if o := <-m.done; o.err != nil || !o.succeeded {
			t.Errorf("member %s: %+v, want committed", m.writes[0], o)
		}
	}
	// 6 members of 2 ops need 6+2 ops: refused; halves of 3 need 5:
	// refused; then 1 and 2 members (3 and 4 ops) pass.
	if want := []int{1, 2, 1, 2}; !slices.Equal(observed, want) {
		t.Errorf("observed batches %v, want %v: the requests etcd took", observed, want)
	}
}

// heldKV holds every transaction until release is closed while held is
// set: a member that stopped answering, with the request on it.
type heldKV struct {
	clientv3.KV
	held    atomic.Bool
	release chan struct{}
}

func (h *heldKV) Txn(ctx context.Context) clientv3.Txn {
	if h.held.Load() {
		select {
		case <-h.release:
		case <-ctx.Done():
		}
	}
	return h.KV.Txn(ctx)
}

// A batch held by a stalled request does not hold up the callers behind
// it: other senders commit theirs (with one sender, every caller would
// wait for the held request's timeout).
func TestHeldBatchDoesNotHoldUpOthers(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	kv := &heldKV{KV: cli.KV, release: make(chan struct{})}
	// The held request waits for its release, not its timeout.
	c := &committer{kv: kv, timeout: time.Minute}
	ctx := context.Background()

	kv.held.Store(true)
	stuck := make(chan outcome, 1)
	go func() { stuck <- c.commit(ctx, put("stuck")) }()
	// The stuck member's sender is inside Txn; the next ones are not held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		n := c.senders
		c.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first member's sender never started")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond) // let it reach the held Txn
	kv.held.Store(false)

	for i := range 3 {
		done := make(chan outcome, 1)
		go func() { done <- c.commit(ctx, put(fmt.Sprintf("free-%d", i))) }()
		select {
		case o := <-done:
			if o.err != nil || !o.succeeded {
				t.Fatalf("free-%d: outcome %+v, want committed", i, o)
			}
		case <-time.After(5 * time.Second):
			close(kv.release)
			t.Fatalf("free-%d waited behind the held batch", i)
		}
	}
	close(kv.release)
	if o := <-stuck; o.err != nil || !o.succeeded {
		t.Errorf("stuck: outcome %+v after its release, want committed", o)
	}
}
