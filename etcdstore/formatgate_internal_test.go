package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// formatReplica is one replica of the format protocol in a test: a store
// on the shared client that reads formats up to reads (a number above
// FormatNewest plays a later release, in this test only).
type formatReplica struct {
	s *Store
	m *FormatMember
}

func startFormatReplica(t *testing.T, ctx context.Context, cli *clientv3.Client, id string, reads int, ttl int64) (*formatReplica, error) {
	t.Helper()
	s, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	s.formats.newest = reads
	m, err := s.JoinFormats(ctx, Replica{ID: id, Version: fmt.Sprintf("test-reads-%d", reads)}, FormatConfig{TTL: ttl})
	if err != nil {
		return nil, err
	}
	return &formatReplica{s: s, m: m}, nil
}

func mustFormatReplica(t *testing.T, ctx context.Context, cli *clientv3.Client, id string, reads int) *formatReplica {
	t.Helper()
	r, err := startFormatReplica(t, ctx, cli, id, reads, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.m.leave)
	return r
}

func clusterVersion(t *testing.T, ctx context.Context, s *Store) int {
	t.Helper()
	st, err := s.Formats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.Cluster.Version
}

func TestFormatVersionAdvancesOnlyWhenEveryLiveReplicaReadsIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	a := mustFormatReplica(t, ctx, cli, "a", 1)
	b := mustFormatReplica(t, ctx, cli, "b", 1)
	steps := []struct {
		name string
		do   func() *formatReplica // the replica whose pass follows
		want int                   // the cluster's version after it
		// writes is what a writes after the pass.
		writes int
	}{
		{"two replicas of the first release: the version is written as 1", func() *formatReplica { return a }, 1, 1},
		{"b upgraded to a release reading 2: a still reads 1 only", func() *formatReplica {
			b.m.leave()
			b = mustFormatReplica(t, ctx, cli, "b", 2)
			return b
		}, 1, 1},
		{"a upgraded too: both read 2, the version advances", func() *formatReplica {
			a.m.leave()
			a = mustFormatReplica(t, ctx, cli, "a", 2)
			return a
		}, 2, 2},
		{"a third replica reading 3 joins: b reads 2 only", func() *formatReplica {
			return mustFormatReplica(t, ctx, cli, "c", 3)
		}, 2, 2},
	}
	for _, st := range steps {
		r := st.do()
		if err := r.m.Pass(ctx); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := clusterVersion(t, ctx, a.s); got != st.want {
			t.Fatalf("%s: cluster format version %d, want %d", st.name, got, st.want)
		}
		if err := a.m.Pass(ctx); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := a.s.WritesFormat(); got != st.writes {
			t.Fatalf("%s: a writes format %d, want %d", st.name, got, st.writes)
		}
		if a.s.formats.allows(st.writes+1) || !a.s.formats.allows(st.writes) {
			t.Fatalf("%s: the gate allows %d: %v, %d: %v", st.name, st.writes, a.s.formats.allows(st.writes), st.writes+1, a.s.formats.allows(st.writes+1))
		}
	}
	if got := a.m.Replica().Writes; got != 2 {
		t.Fatalf("a announces it writes %d, want 2", got)
	}
}

func TestUnannouncedReplicaHoldsTheVersionAtTheFirstFormat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	// A replica of the first release: in the janitor's election under its
	// listen address, announcing nothing.
	a := mustFormatReplica(t, ctx, cli, "a", 2)
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, a.s.keys.election()+fmt.Sprintf("%x", lease.ID), "127.0.0.1:9090", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := a.s.Formats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Cluster.Version != 0 || st.Target() != FormatFirst || len(st.Unannounced) != 1 || st.Unannounced[0] != "127.0.0.1:9090" || st.Settled() {
		t.Fatalf("with a replica of the first release: %+v, want no version written, target 1, it unannounced, not settled", st)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := clusterVersion(t, ctx, a.s); got != 2 {
		t.Fatalf("once the first release's replica is gone: version %d, want 2", got)
	}

	// A replica of the first release started again now cannot check the
	// version: it serves, and the others say so, once.
	var logs strings.Builder
	a.s.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	lease, err = cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, a.s.keys.election()+fmt.Sprintf("%x", lease.ID), "127.0.0.1:9091", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.m.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), "127.0.0.1:9091") || !strings.Contains(logs.String(), "cluster_format_version=2") {
		t.Fatalf("a first-release replica on a cluster at version 2: %d errors logged, want one naming it and the version:\n%s", n, logs.String())
	}
}

func TestDeadReplicaStopsHoldingTheVersionWhenItsLeaseLapses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	a := mustFormatReplica(t, ctx, cli, "a", 2)
	// The old replica dies without revoking: its keep-alive stops, its
	// lease (TTL 2s) lapses.
	old, err := startFormatReplica(t, ctx, cli, "old", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := clusterVersion(t, ctx, a.s); got != 1 {
		t.Fatalf("with the old replica alive: version %d, want 1", got)
	}
	old.m.mu.Lock()
	old.m.cancel()
	old.m.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for clusterVersion(t, ctx, a.s) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the version did not advance to 2 within 20s of the old replica's keep-alive stopping")
		}
		time.Sleep(200 * time.Millisecond)
		if err := a.m.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReplicaTooOldForTheClusterRefusesToStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	a := mustFormatReplica(t, ctx, cli, "a", 2)
	if err := a.m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := startFormatReplica(t, ctx, cli, "old", 1, 10)
	var tooNew *FormatTooNewError
	if !errors.As(err, &tooNew) || tooNew.Cluster.Version != 2 || tooNew.Reads != 1 {
		t.Fatalf("a replica reading 1 on a cluster at 2: %v, want a FormatTooNewError naming 2 and 1", err)
	}
	msg := err.Error()
	for _, want := range []string{"version is 2", "a (test-reads-2)", "test-reads-1", "up to 1", "run a release that reads format 2"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("the refusal is more than one line: %q", msg)
	}
	st, err := a.s.Formats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Replicas) != 1 {
		t.Fatalf("the refused replica announced itself: %+v", st.Replicas)
	}
}

// A running replica whose lease lapsed while the version advanced past it
// stops: Run returns the refusal when it announces again.
func TestRunningReplicaStopsWhenTheVersionPassedIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	old := mustFormatReplica(t, ctx, cli, "old", 1)
	done := make(chan error, 1)
	go func() { done <- old.m.Run(ctx, time.Hour) }()
	// Another replica advances while old's announcement is gone.
	if _, err := cli.Delete(ctx, old.s.keys.replica("old")); err != nil {
		t.Fatal(err)
	}
	b := mustFormatReplica(t, ctx, cli, "b", 2)
	if err := b.m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := clusterVersion(t, ctx, b.s); got != 2 {
		t.Fatalf("version %d, want 2", got)
	}
	old.m.mu.Lock()
	lease := old.m.lease
	old.m.mu.Unlock()
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var tooNew *FormatTooNewError
		if !errors.As(err, &tooNew) {
			t.Fatalf("Run returned %v, want a FormatTooNewError", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run went on for 30s on a cluster past what it reads")
	}
}

func TestConcurrentAdvancersAdvanceOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	const n = 8
	rs := make([]*formatReplica, n)
	for i := range rs {
		rs[i] = mustFormatReplica(t, ctx, cli, fmt.Sprintf("r%d", i), 2)
	}
	before, err := cli.Get(ctx, rs[0].s.keys.clusterFormat())
	if err != nil {
		t.Fatal(err)
	}
	st, err := rs[0].s.Formats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var advanced atomic.Int64
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			ok, err := r.m.advance(ctx, st)
			if err != nil {
				t.Error(err)
			}
			if ok {
				advanced.Add(1)
			}
		})
	}
	wg.Wait()
	after, err := cli.Get(ctx, rs[0].s.keys.clusterFormat())
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Kvs) != 0 || advanced.Load() != 1 || len(after.Kvs) != 1 || after.Kvs[0].Version != 1 {
		t.Fatalf("%d advancers of one read: %d succeeded, the key written %v times, want once", n, advanced.Load(), after.Kvs)
	}
}

// A replica that joins between an advancer's read and its write makes the
// write fail: the advance compares the announcements it read.
func TestAdvanceFailsWhenAReplicaJoinedSinceItsRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	a := mustFormatReplica(t, ctx, cli, "a", 2)
	if err := a.m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := a.s.Formats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := mustFormatReplica(t, ctx, cli, "b", 3)
	_ = b
	st.Replicas[0].Reads = 3 // as if a read 3 too: the read is stale anyway
	ok, err := a.m.advance(ctx, st)
	if err != nil || ok {
		t.Fatalf("an advance from a read older than b's announcement: %v, %v; want refused", ok, err)
	}
	if got := clusterVersion(t, ctx, a.s); got != 2 {
		t.Fatalf("version %d, want 2", got)
	}
}

func TestAdvanceWaitsToSettle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)

	s, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	const settle = 2 * time.Second
	m, err := s.JoinFormats(ctx, Replica{ID: "a", Version: "test"}, FormatConfig{Settle: settle})
	if err != nil {
		t.Fatal(err)
	}
	defer m.leave()
	if err := m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := clusterVersion(t, ctx, s); got != 0 {
		t.Fatalf("version %d at the first pass, want none yet (settling)", got)
	}
	// A replica joining restarts the wait, even past the settling time.
	time.Sleep(settle + 100*time.Millisecond)
	mustFormatReplica(t, ctx, cli, "b", FormatNewest)
	if err := m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := clusterVersion(t, ctx, s); got != 0 {
		t.Fatalf("version %d just after a replica joined, want none yet (settling again)", got)
	}
	time.Sleep(settle + 100*time.Millisecond)
	if err := m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := clusterVersion(t, ctx, s); got != FormatNewest {
		t.Fatalf("version %d after settling, want %d", got, FormatNewest)
	}
}
