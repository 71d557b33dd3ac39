package etcdstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// rawRevision is etcd's current revision, read past every store.
func rawRevision(t *testing.T, c *cluster) int64 {
	t.Helper()
	resp, err := c.cli.Get(ctx(t), "raw-revision-probe", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// mustWentBack checks that err is the refusal of an etcd that went back,
// and that its message names both revisions.
func mustWentBack(t *testing.T, err error, revision, floor int64) {
	t.Helper()
	if !errors.Is(err, intent.ErrStoreRolledBack) || !errors.Is(err, intent.ErrUnavailable) {
		t.Fatalf("err = %v, want intent.ErrStoreRolledBack and intent.ErrUnavailable", err)
	}
	var back *etcdstore.RolledBackError
	if !errors.As(err, &back) {
		t.Fatalf("err = %v, want a *RolledBackError", err)
	}
	if back.Revision < revision || back.Revision >= floor || back.Floor != floor {
		t.Errorf("refusal says revision %d below %d, want a revision from %d below floor %d", back.Revision, back.Floor, revision, floor)
	}
	for _, n := range []int64{back.Revision, back.Floor} {
		if !strings.Contains(err.Error(), fmt.Sprint(n)) {
			t.Errorf("message %q does not name revision %d", err, n)
		}
	}
}

// An etcd whose revision is below the store's floor (as after a snapshot
// restore without --bump-revision) gets every call refused: nothing is
// decided, no token is handed out, and once a store has refused it sends
// that etcd nothing more.
func TestRevisionWentBackIsRefused(t *testing.T) {
	c := newCluster(t)
	setup := c.store(t)
	if _, err := setup.Installation(ctx(t)); err != nil {
		t.Fatal(err)
	}
	register(t, setup, lamp(t, "pending-1", 1))
	register(t, setup, lamp(t, "held-1", 1))
	sess := openSession(t, setup, "w1", time.Minute)
	held := acquire(t, setup, "held-1", sess)

	// Every kind of call. prepare runs before the floor is raised, so that
	// a call can find its session in memory and reach the etcd call it
	// would make first in a running replica.
	type call struct {
		name    string
		prepare func(t *testing.T, s *etcdstore.Store) string
		do      func(t *testing.T, s *etcdstore.Store, sess string) error
		// writes is how far a first, not yet latched call may move etcd's
		// revision: a call whose first etcd request writes is refused
		// only on the answer, after etcd applied it.
		writes int64
	}
	ownSession := func(t *testing.T, s *etcdstore.Store) string { return openSession(t, s, "w2", time.Minute) }
	cachedSession := func(t *testing.T, s *etcdstore.Store) string {
		if _, err := s.Heartbeat(ctx(t), "default", sess, nil); err != nil {
			t.Fatal(err)
		}
		return sess
	}
	calls := []call{
		{name: "Ping", do: func(t *testing.T, s *etcdstore.Store, _ string) error { return s.Ping(ctx(t)) }},
		{name: "Installation", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			_, err := s.Installation(ctx(t))
			return err
		}},
		{name: "Register", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			_, _, err := s.Register(ctx(t), lamp(t, "new-1", 1))
			return err
		}},
		{name: "Acquire", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			_, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "pending-1", SessionID: sess, RequestID: "acq-1"})
			return err
		}},
		{name: "Complete", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			r := complete("held-1", held.Lease.Token, "SO-1")
			r.Tenant = "default"
			_, err := s.Report(ctx(t), r)
			return err
		}},
		{name: "Cancel", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			_, err := s.Cancel(ctx(t), intent.Cancellation{Tenant: "default", Key: "pending-1", Reason: "test"})
			return err
		}},
		{name: "Get", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			_, err := s.Get(ctx(t), "default", "held-1")
			return err
		}},
		{name: "List", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			_, err := s.List(ctx(t), intent.ListQuery{Filter: intent.Filter{Tenant: "default"}})
			return err
		}},
		{name: "Heartbeat", prepare: cachedSession, do: func(t *testing.T, s *etcdstore.Store, sess string) error {
			// The session is in memory and no lease is named, so the
			// keep-alive is the only etcd call: its answer is held to the
			// floor too.
			_, err := s.Heartbeat(ctx(t), "default", sess, nil)
			return err
		}},
		{name: "Heartbeat naming a lease", prepare: cachedSession, do: func(t *testing.T, s *etcdstore.Store, sess string) error {
			_, err := s.Heartbeat(ctx(t), "default", sess, []intent.HeldLease{{Key: "held-1", Token: held.Lease.Token}})
			return err
		}},
		{name: "OpenSession", writes: 1, do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			// The lease grant does not move the revision; the session
			// key's create-if-absent does, and is refused on its answer.
			// Its lease lapses unanswered.
			_, err := s.OpenSession(ctx(t), "default", "w3", time.Minute)
			return err
		}},
		{name: "CloseSession", prepare: ownSession, writes: 1, do: func(t *testing.T, s *etcdstore.Store, sess string) error {
			// Revoking deletes the session key; the answer is refused.
			return s.CloseSession(ctx(t), "default", sess)
		}},
		{name: "Sweep", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			_, err := s.Sweep(ctx(t))
			return err
		}},
		{name: "Watch", do: func(t *testing.T, s *etcdstore.Store, _ string) error {
			// A client resuming from a revision it saw before the
			// restore: etcd would wait for it; the store refuses.
			return s.Watch(ctx(t), intent.WatchQuery{Filter: intent.Filter{Tenant: "default"}, StartRevision: s.HighestRevision() - 1},
				func(intent.WatchEvent) error { return errors.New("no event expected") })
		}},
	}

	// Each call on a store of its own, so that each meets the floor in its
	// own etcd call, not in the latch of an earlier refusal.
	for _, tc := range calls {
		t.Run("own check/"+tc.name, func(t *testing.T) {
			s := c.store(t)
			var own string
			if tc.prepare != nil {
				own = tc.prepare(t, s)
			}
			rev := rawRevision(t, c)
			floor := rev + 1000
			s.RaiseFloor(floor)
			err := tc.do(t, s, own)
			mustWentBack(t, err, rev, floor)
			if got := rawRevision(t, c); got > rev+tc.writes {
				t.Errorf("etcd's revision went from %d to %d, want at most %d write(s)", rev, got, tc.writes)
			}
			if got := s.HighestRevision(); got != floor {
				t.Errorf("HighestRevision() = %d, want the floor %d", got, floor)
			}
		})
	}

	// A store that refused once sends nothing more to that etcd: every
	// call is refused before it reaches etcd, writes included.
	t.Run("latched", func(t *testing.T) {
		s := c.store(t)
		prepared := map[string]string{}
		for _, tc := range calls {
			if tc.prepare != nil {
				prepared[tc.name] = tc.prepare(t, s)
			}
		}
		// A final intent this store could replay from memory.
		done := acquire(t, s, "pending-1", sess)
		if _, err := report(t, s, complete("pending-1", done.Lease.Token, "SO-2")); err != nil {
			t.Fatal(err)
		}
		rev := rawRevision(t, c)
		floor := rev + 1000
		s.RaiseFloor(floor)
		mustWentBack(t, s.Ping(ctx(t)), rev, floor)
		for _, tc := range calls {
			err := tc.do(t, s, prepared[tc.name])
			if !errors.Is(err, intent.ErrStoreRolledBack) || !errors.Is(err, intent.ErrUnavailable) {
				t.Errorf("%s: err = %v, want intent.ErrStoreRolledBack and intent.ErrUnavailable", tc.name, err)
			}
		}
		_, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "pending-1", SessionID: sess, RequestID: "replay"})
		if !errors.Is(err, intent.ErrStoreRolledBack) {
			t.Errorf("replay of a final intent from memory: err = %v, want intent.ErrStoreRolledBack", err)
		}
		if got := rawRevision(t, c); got != rev {
			t.Errorf("etcd's revision went from %d to %d: a latched store wrote", rev, got)
		}
	})

	// The check is on answers, so the write that discovers the floor can
	// have been applied. Its token must never reach the caller, not even
	// through the read-back that makes a retried Acquire return the lease
	// it issued.
	t.Run("refused write keeps its token", func(t *testing.T) {
		s := c.store(t)
		own := openSession(t, s, "w4", time.Minute)       // in memory: Acquire writes first
		if err := s.LearnTombstones(ctx(t)); err != nil { // so does a new key's registration
			t.Fatal(err)
		}
		rev := rawRevision(t, c)
		floor := rev + 1000
		s.RaiseFloor(floor)
		reg := lamp(t, "optimistic-1", 1)
		req := intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: own, RequestID: "acq-opt", Register: &reg}
		a, err := s.Acquire(ctx(t), req)
		mustWentBack(t, err, rev, floor)
		if a != nil {
			t.Fatalf("refused Acquire returned %+v, want nothing", a)
		}
		if got := rawRevision(t, c); got != rev+1 {
			t.Fatalf("etcd's revision went from %d to %d, want the one refused write, never a retry", rev, got)
		}
		// etcd did apply it: the lease exists there, under a token no one
		// was told.
		fresh := c.store(t)
		in := get(t, fresh, reg.Key)
		if in.State != intent.StateInProgress || in.Lease == nil || uint64(in.Lease.Token)/machine.TokenSlots != uint64(rev+1) {
			t.Fatalf("etcd holds %v with lease %+v, want IN_PROGRESS under a token of revision %d", in.State, in.Lease, rev+1)
		}
		a, err = s.Acquire(ctx(t), req)
		if !errors.Is(err, intent.ErrStoreRolledBack) || a != nil {
			t.Fatalf("retried Acquire = %+v, %v; want nothing and intent.ErrStoreRolledBack", a, err)
		}
	})
}

// The installation id is created once and read by every store after; it
// survives the store that created it.
func TestInstallationIsCreatedOnce(t *testing.T) {
	c := newCluster(t)
	first, err := c.store(t).Installation(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(first) < 16 {
		t.Fatalf("Installation() = %q, want a random id", first)
	}
	for range 3 {
		got, err := c.store(t).Installation(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if got != first {
			t.Fatalf("Installation() = %q, want the first one %q", got, first)
		}
	}
	other, err := newCluster(t).store(t).Installation(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if other == first {
		t.Fatalf("a new cluster got the same installation id %q", other)
	}
}

// Concurrent calls do not refuse each other: the floor a call is held to is
// the one when it was sent, not what a faster concurrent call raised it to.
func TestFloorAdmitsConcurrentCalls(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	sess := openSession(t, s, "w1", time.Minute)
	errs := make(chan error, 64)
	for i := range cap(errs) {
		go func() {
			key := fmt.Sprintf("k-%d", i)
			a, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess, RequestID: key, Register: new(lamp(t, key, 1))})
			if err == nil {
				r := complete(key, a.Lease.Token, key)
				r.Tenant = "default"
				_, err = s.Report(ctx(t), r)
			}
			if err == nil {
				_, err = s.Get(ctx(t), "default", key)
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if got, want := s.HighestRevision(), rawRevision(t, c); got != want {
		t.Errorf("HighestRevision() = %d, want etcd's revision %d", got, want)
	}
}

// A full etcd refuses every transaction that could write, even one whose
// compare would send it to a read: the installation id is read first, so
// that intentd still starts (and serves reads) on a full store.
func TestInstallationOnAFullStore(t *testing.T) {
	srv := etcdtest.StartWith(t, t.TempDir(), func(c *embed.Config) { c.QuotaBackendBytes = 4 << 20 })
	cli := srv.Client(t)
	s, err := etcdstore.New(cli, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Installation(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 60<<10)
	for i := 0; ; i++ {
		params, _ := intent.Canonical(map[string]any{"note": big, "n": float64(i)})
		_, _, err := s.Register(ctx(t), intent.Registration{Tenant: "default", Key: fmt.Sprintf("fill-%d", i), Params: params})
		if errors.Is(err, intent.ErrStoreFull) {
			break
		}
		if err != nil || i > 400 {
			t.Fatalf("filling the store: %v after %d registrations", err, i)
		}
	}
	restarted, err := etcdstore.New(cli, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := restarted.Installation(ctx(t)); err != nil || got != id {
		t.Fatalf("Installation() on a full store = %q, %v; want %q", got, err, id)
	}
}

// fileFloor is the revision the floor file in dir holds for installation.
func fileFloor(t *testing.T, dir, installation string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, etcdstore.FloorFileName))
	if err != nil {
		t.Fatal(err)
	}
	var floors map[string]int64
	if err := json.Unmarshal(b, &floors); err != nil {
		t.Fatalf("floor file %q: %v", b, err)
	}
	return floors[installation]
}

// The floor kept in a file: HoldFloor writes it for the installation, Run
// writes it as it grows and, as soon as any call finds etcd's revision went
// back, writes it a last time and returns the refusal naming the
// installation and the file, held to the highest revision the store saw.
// A store that then holds to that file refuses the etcd at start.
func TestFloorKeptInAFile(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	dir := t.TempDir()
	file := filepath.Join(dir, etcdstore.FloorFileName)
	f, err := s.HoldFloor(ctx(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	id := f.Installation()
	if got, want := fileFloor(t, dir, id), s.HighestRevision(); got != want || got == 0 {
		t.Fatalf("floor file holds %d after HoldFloor, want the store's %d", got, want)
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- f.Run(runCtx, 10*time.Millisecond) }()

	register(t, s, lamp(t, "kept-1", 1))
	grown := s.HighestRevision()
	for deadline := time.Now().Add(5 * time.Second); fileFloor(t, dir, id) < grown; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("floor file holds %d, want %d once Run wrote it", fileFloor(t, dir, id), grown)
		}
	}
	select {
	case err := <-ran:
		t.Fatalf("Run returned %v while etcd was fine", err)
	default:
	}

	// As if etcd went back: the store was told of a revision etcd never
	// reached, and a Get finds etcd below it.
	floor := grown + 1000
	s.RaiseFloor(floor)
	if _, err := s.Get(ctx(t), "default", "kept-1"); !errors.Is(err, intent.ErrStoreRolledBack) {
		t.Fatalf("Get = %v, want the refusal", err)
	}
	var err2 error
	select {
	case err2 = <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return the refusal")
	}
	back, ok := errors.AsType[*etcdstore.RolledBackError](err2)
	if !ok || !errors.Is(err2, intent.ErrStoreRolledBack) || !errors.Is(err2, intent.ErrUnavailable) {
		t.Fatalf("Run = %v, want a *RolledBackError matching intent.ErrStoreRolledBack and intent.ErrUnavailable", err2)
	}
	if back.Floor != floor || back.Revision >= floor || back.Installation != id || back.File != file {
		t.Errorf("Run's refusal %+v, want a revision below %d, installation %s, file %s", back, floor, id, file)
	}
	for _, want := range []string{fmt.Sprintf("is behind the %d this replica already saw for installation %s", floor, id),
		"--bump-revision <at least", "delete " + file + " only if"} {
		if !strings.Contains(err2.Error(), want) {
			t.Errorf("Run's refusal %q does not say %q", err2, want)
		}
	}
	if got := fileFloor(t, dir, id); got != floor {
		t.Errorf("floor file holds %d after the refusal, want the store's highest %d", got, floor)
	}

	_, err = c.store(t).HoldFloor(ctx(t), dir)
	if back, ok := errors.AsType[*etcdstore.RolledBackError](err); !ok || back.Floor != floor || back.File != file {
		t.Fatalf("HoldFloor of a new store on the kept floor = %v, want the refusal held to %d", err, floor)
	}
}
