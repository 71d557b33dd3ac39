package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
)

// The archiver moves nothing while the cluster is below the archive's
// format, nor while a live replica has no archive or is unannounced; once
// it has moved, a replica without an archive refuses to join.
func TestArchiverWaitsForEveryReplica(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	for i := range 3 {
		finish(t, s, "t1", fmt.Sprintf("g%d", i), intent.StateCancelled)
	}
	ti.c.Advance(2 * time.Hour)
	sweep := func(what string, want int) {
		t.Helper()
		r, err := s.Sweep(ctx)
		if err != nil || r.Archived != want {
			t.Fatalf("%s: swept %+v, %v; want %d archived", what, r, err, want)
		}
	}

	s.formats.cluster.Store(FormatFirst)
	sweep("the cluster at the first format", 0)
	if ti.etcdValue(t, s, "t1", "g0") == nil {
		t.Fatal("a record left etcd below the archive's format")
	}
	s.formats.cluster.Store(FormatArchive)

	// A replica without an archive announced: nothing moves.
	plain := ti.store(t, false)
	m, err := plain.JoinFormats(ctx, Replica{ID: "plain"}, FormatConfig{TTL: 5})
	if err != nil {
		t.Fatal(err)
	}
	sweep("a live replica without an archive", 0)
	m.leave()

	// An unannounced candidate of the janitor's election (a replica of a
	// release before announcements): nothing moves.
	if _, err := s.kv.Put(ctx, s.keys.election()+"old", "old-replica"); err != nil {
		t.Fatal(err)
	}
	sweep("an unannounced replica", 0)
	if _, err := s.kv.Delete(ctx, s.keys.election()+"old"); err != nil {
		t.Fatal(err)
	}

	// Every replica with an archive: they move, and the cluster is marked.
	withArchive, err := s.JoinFormats(ctx, Replica{ID: "archiving"}, FormatConfig{TTL: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer withArchive.leave()
	s.formats.cluster.Store(FormatArchive) // as its member would advance it
	sweep("every replica with an archive", 3)

	_, err = ti.store(t, false).JoinFormats(ctx, Replica{ID: "late"}, FormatConfig{TTL: 5})
	var inUse *ArchiveInUseError
	if !errors.As(err, &inUse) {
		t.Fatalf("a replica without an archive joining a marked cluster: %v, want an ArchiveInUseError", err)
	}
	st, err := s.Formats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Replicas {
		if r.ID == "late" {
			t.Errorf("the refused replica's announcement is still there: %+v", r)
		}
	}
}

// An archived tombstone past its retention answers as a dropped one: the
// key is new again, as it is once a packed chunk drops its entry.
func TestArchivedTombstonePastItsRetentionIsGone(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	now := ti.c.Now()
	e := tombstones.NewEntry("t1", "long-gone", intent.StateCompleted, now.Add(-800*24*time.Hour), now.Add(-24*time.Hour))
	if err := ti.a.PutTombstones(ctx, []tombstones.Entry{e}); err != nil {
		t.Fatal(err)
	}
	if _, created, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "long-gone", Params: []byte(`{}`)}); err != nil || !created {
		t.Fatalf("register: created %v, %v; want a new intent", created, err)
	}
}

// A call that would write evidence on an archived record (an escalation
// under a superseded token) answers its refusal at once, without the
// write; one that must ask an archive that is down fails at once.
func TestCallsOnArchivedIntentsAnswerAtOnce(t *testing.T) {
	ti := startTiers(t)
	ctx := context.Background()
	s := ti.store(t, true)
	finish(t, s, "t1", "moved", intent.StateCompleted)
	ti.c.Advance(2 * time.Hour)
	if r, err := s.Sweep(ctx); err != nil || r.Archived != 1 {
		t.Fatalf("swept %+v, %v; want 1 archived", r, err)
	}
	start := time.Now()
	// Token 1: below any token issued (a revision times 128), so superseded.
	_, err := s.Escalate(ctx, intent.Escalation{Tenant: "t1", Key: "moved", Token: 1, Actor: "w", Reason: "late"})
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("escalation under another token of an archived intent: %v after %v, want a refusal at once", err, time.Since(start))
	}
	if _, err := s.Cancel(ctx, intent.Cancellation{Tenant: "t1", Key: "moved", Actor: "a", Reason: "x"}); !errors.Is(err, intent.ErrInvalidTransition) {
		t.Fatalf("cancel of an archived COMPLETED intent: %v, want an invalid transition", err)
	}

	if err := ti.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = s.Cancel(ctx, intent.Cancellation{Tenant: "t1", Key: "never-seen", Actor: "a", Reason: "x"})
	if !errors.Is(err, intent.ErrArchiveUnavailable) || time.Since(start) > 3*time.Second {
		t.Fatalf("cancel of a key etcd does not hold, the archive down: %v after %v, want ErrArchiveUnavailable at once", err, time.Since(start))
	}
}
