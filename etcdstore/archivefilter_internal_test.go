package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
)

func TestArchiveFilterRulesOut(t *testing.T) {
	in, out := tombstones.HashOf("t1", "archived"), tombstones.HashOf("t1", "new")
	for _, tc := range []struct {
		name       string
		ready      bool
		upTo, rev  int64
		h          tombstones.Hash
		wantRuled  bool
		wantNudged bool
	}{
		{name: "a new key, the filter up to the chunk", ready: true, upTo: 10, rev: 10, h: out, wantRuled: true},
		{name: "a new key, the filter past the chunk", ready: true, upTo: 12, rev: 10, h: out, wantRuled: true},
		{name: "an archived key", ready: true, upTo: 10, rev: 10, h: in},
		{name: "the filter behind the chunk", ready: true, upTo: 9, rev: 10, h: out, wantNudged: true},
		{name: "no chunk read", ready: true, upTo: 10, rev: 0, h: out},
		{name: "not loaded", upTo: 10, rev: 10, h: out},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f archiveFilter
			f.add(in)
			f.advance(tc.upTo)
			f.ready.Store(tc.ready)
			nudged := make(chan struct{}, 1)
			nudge := func() { nudged <- struct{}{} }
			f.nudge.Store(&nudge)
			if got := f.rulesOut(tc.h, tc.rev); got != tc.wantRuled {
				t.Fatalf("rulesOut = %v, want %v", got, tc.wantRuled)
			}
			select {
			case <-nudged:
				if !tc.wantNudged {
					t.Fatal("asked for progress")
				}
			case <-time.After(50 * time.Millisecond):
				if tc.wantNudged {
					t.Fatal("did not ask for progress")
				}
			}
		})
	}
}

// A filter reset for a reload (its watch failed, the archive did not
// answer its load) forgets the revision it covered: once loaded again it
// covers only what the new load and watch gave it, and a lookup never sees
// it half reset.
func TestArchiveFilterResetForgetsItsRevision(t *testing.T) {
	var f archiveFilter
	h := tombstones.HashOf("t1", "moved-while-reloading")
	f.advance(100)
	f.ready.Store(true)
	if !f.rulesOut(h, 50) {
		t.Fatal("a ready filter covering revision 100 does not rule out a key it never held, at 50")
	}
	f.reset()
	if f.rulesOut(h, 50) {
		t.Fatal("a reset filter rules a key out")
	}
	// Loaded again as of revision 10: moves after it are not in it yet.
	f.advance(10)
	f.ready.Store(true)
	if f.rulesOut(h, 50) {
		t.Fatal("a reloaded filter covering revision 10 rules out a key at 50: it kept the revision of before its reset")
	}
}

// The filter grows past its first capacity and keeps every key; a moved
// value of a length not a multiple of a hash is refused.
func TestArchiveFilterGrows(t *testing.T) {
	var f archiveFilter
	f.ready.Store(true)
	f.advance(1)
	n := filterFirstKeys*2 + 10
	for i := range n {
		f.add(tombstones.HashOf("t", fmt.Sprint(i)))
	}
	if len(f.blooms) != 2 || f.keys != uint(n) {
		t.Fatalf("%d filters, %d keys; want 2 and %d", len(f.blooms), f.keys, n)
	}
	for i := range n {
		if f.rulesOut(tombstones.HashOf("t", fmt.Sprint(i)), 1) {
			t.Fatalf("key %d ruled out", i)
		}
	}
	false_ := 0
	for i := range 100000 {
		if !f.rulesOut(tombstones.HashOf("other", fmt.Sprint(i)), 1) {
			false_++
		}
	}
	if false_ > 1000 { // 0.1 % a filter, two filters
		t.Errorf("%d false positives in 100000", false_)
	}
	if err := f.addMoved(make([]byte, 17)); !errors.Is(err, errCorrupt) {
		t.Fatalf("17 bytes: %v", err)
	}
}

// startFilter runs s's filter of archived keys until the test ends, and
// waits until it is loaded.
func startFilter(t testing.TB, s *Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.RunArchiveFilter(ctx, 50*time.Millisecond, func(err error) { t.Logf("filter: %v", err) })
	}()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for !s.archive.filter.ready.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the filter did not load")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With the filter loaded, new keys are registered without asking the
// archive, also while it is stopped; archived keys still ask it (and get
// ARCHIVE_UNAVAILABLE while it is down, the same answer once it is back).
func TestArchiveFilterRegistersWithoutTheArchive(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	for i := range 5 {
		finish(t, s, "t1", fmt.Sprintf("old%d", i), intent.StateCompleted)
	}
	ti.c.Advance(2 * time.Hour)
	if r, err := s.Sweep(ctx); err != nil || r.Archived != 5 {
		t.Fatalf("%+v %v", r, err)
	}
	before := replayOf(t, s, "t1", "old0")
	fresh := ti.store(t, true) // loads the filter from the archive
	startFilter(t, fresh)
	sess, err := fresh.OpenSession(ctx, "t1", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(key string) (*intent.Acquisition, error) {
		return fresh.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: key, SessionID: sess.ID, RequestID: "r-" + key,
			Register: &intent.Registration{Tenant: "t1", Key: key, Params: []byte(`{"n":1}`)}})
	}
	// The first registrations may find the filter behind the chunk
	// (it asks for progress); after them, none asks the archive.
	for i := range 3 {
		if _, err := acquire(fmt.Sprintf("warm%d", i)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	reads := fresh.ArchiveStats().Reads
	for i := range 20 {
		if a, err := acquire(fmt.Sprintf("new%d", i)); err != nil || a.Outcome != intent.OutcomeExecute {
			t.Fatalf("new%d: %v %v", i, a, err)
		}
	}
	st := fresh.ArchiveStats()
	if got := st.Reads - reads; got != 0 {
		t.Fatalf("20 new keys asked the archive %d times, want 0", got)
	}
	if !st.FilterReady || st.FilterKeys != 5 || st.FilterBytes == 0 || st.FilterRuledOut < 20 {
		t.Fatalf("the filter's figures: %+v, want it ready with the 5 archived keys and at least 20 lookups ruled out", st)
	}
	// A retry of an archived intent asks the archive once (its record and
	// tombstone together: two reads), though Acquire looks it up before
	// its optimistic write and again after the read that follows.
	if a, err := acquire("old2"); err != nil || a.Outcome != intent.OutcomeCompleted {
		t.Fatalf("old2, archived: %v %v", a, err)
	}
	if got := fresh.ArchiveStats().Reads - st.Reads; got != 2 {
		t.Errorf("a replay of an archived intent read the archive %d times, want 2 (one lookup)", got)
	}
	if err := ti.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	ok := 0
	for i := range 50 {
		if a, err := acquire(fmt.Sprintf("down%d", i)); err == nil && a.Outcome == intent.OutcomeExecute {
			ok++
		} else {
			t.Logf("down%d: %v", i, err)
		}
	}
	if ok != 50 {
		t.Errorf("%d of 50 new registrations succeeded while the archive was down, want all", ok)
	}
	_, err = acquire("old1")
	if !errors.Is(err, intent.ErrArchiveUnavailable) {
		t.Errorf("an archived key while the archive is down: %v, want ARCHIVE_UNAVAILABLE", err)
	}
	if err := ti.pg.Start(); err != nil {
		t.Fatal(err)
	}
	var after *intent.Acquisition
	for i := 0; i < 50; i++ { // the pool reconnects
		if after, err = fresh.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: "old0", SessionID: sess.ID, RequestID: "again",
			Register: &intent.Registration{Tenant: "t1", Key: "old0", Params: []byte(`{"n":1}`)}}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	after.Memo = nil
	if after.Outcome != before.Outcome || after.Intent.Fingerprint != before.Intent.Fingerprint || after.Intent.State != before.Intent.State {
		t.Fatalf("the archived key's replay: %+v, before %+v", after, before)
	}
}

// A key another replica moves while this replica's filter has not seen
// the move is asked of the archive, never ruled out: the registration
// answers the archived intent, and creates nothing.
func TestArchiveFilterBehindAMove(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s, other := ti.store(t, true), ti.store(t, true)
	finish(t, other, "t1", "first", intent.StateCompleted)
	ti.c.Advance(2 * time.Hour)
	if r, err := other.Sweep(ctx); err != nil || r.Archived != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	startFilter(t, s)
	// s learns the chunk as it is now.
	if _, err := s.Get(ctx, "t1", "first"); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	release := sync.OnceFunc(func() { close(held) })
	hold := func() { <-held }
	archiveFilterHook.Store(&hold)
	// Before startFilter's cleanup, which waits for the filter to stop.
	t.Cleanup(func() { release(); archiveFilterHook.Store(nil) })
	finish(t, other, "t1", "moved", intent.StateCompleted)
	ti.c.Advance(2 * time.Hour)
	if r, err := other.Sweep(ctx); err != nil || r.Archived != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	sess, err := s.OpenSession(ctx, "t1", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: "moved", SessionID: sess.ID, RequestID: "late",
		Register: &intent.Registration{Tenant: "t1", Key: "moved", Params: []byte(`{"n":1}`)}})
	if err != nil || a.Outcome != intent.OutcomeCompleted {
		t.Fatalf("a moved key while the filter is behind: %v %v; want its completed intent", a, err)
	}
	if ti.etcdValue(t, s, "t1", "moved") != nil {
		t.Fatal("a second intent in etcd")
	}
	release()
	archiveFilterHook.Store(nil)
	h := tombstones.HashOf("t1", "moved")
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.archive.filter.mu.RLock()
		caught := s.archive.filter.keys >= 2
		s.archive.filter.mu.RUnlock()
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the filter did not catch up with the move")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s.archive.filter.rulesOut(h, s.archive.filter.upTo.Load()) {
		t.Fatal("the filter rules out a moved key")
	}
}
