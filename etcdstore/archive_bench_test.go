package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/intentd/intentd/archive"
	"github.com/intentd/intentd/intent"
)

// BenchmarkArchiveTiers measures, on one etcd and one PostgreSQL in the
// same run, what the archive adds to a new key's registration against a
// store without one — with the filter of archived keys loaded (as intentd
// runs: one etcd write), and without it (a replica whose filter loads or
// failed: etcd's read, then the archive asked whether it holds the key) —
// the cycle (Acquire registering a new key, Complete) likewise, and a Get
// of an archived intent (etcd's read that misses, then the archive's
// record):
//
//	go test -run '^$' -bench ArchiveTiers -benchtime 2000x ./etcdstore
func BenchmarkArchiveTiers(b *testing.B) {
	ti := startTiers(b)
	ctx := context.Background()
	// One move first: it writes the tombstone chunk that guards every new
	// key, as an installation's first move does. Until then the filter
	// cannot rule a key out (a key whose chunk etcd does not hold asks
	// the archive: see archivefilter.go).
	first := ti.store(b, true)
	finish(b, first, "t1", "first-moved", intent.StateCompleted)
	ti.c.Advance(2 * time.Hour)
	if r, err := first.Sweep(ctx); err != nil || r.Archived != 1 {
		b.Fatalf("the first move: %+v %v", r, err)
	}
	// What intentd runs (its filter of archived keys loaded) against a
	// replica whose filter is not (loading, or its watch failed), against
	// no archive.
	variants := []struct {
		name            string
		archive, filter bool
	}{{"etcd-only", false, false}, {"with-archive", true, true}, {"with-archive-no-filter", true, false}}
	store := func(archive, filter bool) *Store {
		s := ti.store(b, archive)
		if filter {
			startFilter(b, s)
		}
		return s
	}
	for _, v := range variants {
		name := "register/" + v.name
		s := store(v.archive, v.filter)
		next := 0
		b.Run(name, func(b *testing.B) {
			for ; b.Loop(); next++ {
				reg := intent.Registration{Tenant: "t1", Key: fmt.Sprintf("%s-%d", name, next), Params: []byte(`{"n":1}`)}
				if _, _, err := s.Register(ctx, reg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, v := range variants {
		name := "cycle/" + v.name
		s := store(v.archive, v.filter)
		sess, err := s.OpenSession(ctx, "t1", "w", time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		next := 0 // keys never repeat, whatever how often b.Run calls this
		b.Run(name, func(b *testing.B) {
			for ; b.Loop(); next++ {
				key := fmt.Sprintf("%s-%d", name, next)
				a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "t1", Key: key, SessionID: sess.ID, RequestID: "r",
					Register: &intent.Registration{Tenant: "t1", Key: key, Params: []byte(`{"n":1}`)}})
				if err != nil || a.Outcome != intent.OutcomeExecute {
					b.Fatal(a, err)
				}
				if _, err := s.Report(ctx, intent.Report{Tenant: "t1", Key: key, Token: a.Lease.Token, Kind: intent.ReportComplete,
					Result: &intent.Result{Payload: []byte(`{}`)}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	s := ti.store(b, true)
	// Archived intents in bulk: one record's value under many keys.
	if _, _, err := s.Register(ctx, intent.Registration{Tenant: "t1", Key: "model", Params: []byte(`{"n":1}`)}); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Cancel(ctx, intent.Cancellation{Tenant: "t1", Key: "model", Actor: "bench", Reason: "x"}); err != nil {
		b.Fatal(err)
	}
	resp, err := ti.cli.Get(ctx, s.keys.intent("t1", "model"))
	if err != nil || len(resp.Kvs) != 1 {
		b.Fatal(err)
	}
	kv := resp.Kvs[0]
	rec, err := decodeRecord("t1", "model", kv.Value, kv.ModRevision)
	if err != nil {
		b.Fatal(err)
	}
	const n = 4096
	recs := make([]archive.Record, n)
	for i := range recs {
		recs[i] = archive.Record{Tenant: "t1", Key: fmt.Sprintf("a%d", i), State: rec.State, Fingerprint: rec.Fingerprint,
			RegisteredAt: rec.CreatedAt, CompletedAt: rec.CompletedAt, RetainUntil: rec.RetainUntil, Revision: kv.ModRevision, Data: kv.Value}
	}
	if err := ti.a.Put(ctx, recs); err != nil {
		b.Fatal(err)
	}
	b.Run("get-archived", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := s.Get(ctx, "t1", fmt.Sprintf("a%d", i%n)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
