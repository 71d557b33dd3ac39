package etcdstore

import (
	"context"
	"errors"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// SweepReport is what one janitor pass did and saw.
type SweepReport struct {
	// Lapsed counts IN_PROGRESS intents whose holder's session had ended,
	// now marked UNKNOWN.
	Lapsed int
	// Removed counts final records removed after their retention (each
	// leaves a tombstone); TombstonesRemoved, tombstones past theirs.
	Removed           int
	TombstonesRemoved int
	// Archived counts final records moved to the archive (with an archive
	// configured: records past their retention move too, and the archive
	// keeps their tombstones, so Removed stays zero).
	Archived int
	// Overdue counts intents registered longer than the default retention
	// ago and still not final. They are never removed, only reported: they
	// need a worker or a human.
	Overdue int
}

// sweepBatch bounds the keys one janitor step reads at once.
const sweepBatch = 256

// Sweep makes one janitor pass: it marks lapsed leases UNKNOWN, removes
// final records past their retention (leaving tombstones), or with an
// archive moves final records to it (archiver.go), removes
// tombstones past theirs, and counts overdue unfinished intents. Every
// change is a compare-and-swap, so a pass racing another (or a worker) does
// no harm; RunJanitor makes sure one replica sweeps at a time anyway.
func (s *Store) Sweep(ctx context.Context) (SweepReport, error) {
	var r SweepReport
	var err error
	now := s.cfg.Now()
	if r.Lapsed, err = s.sweepLapsed(ctx); err != nil {
		return r, err
	}
	dropped := s.stats.tombstonesDropped.Load()
	// An archive that cannot be reached pauses the archiver, not the rest
	// of the sweep: its error is returned at the end. Records move only
	// while every replica asks the archive (archiveMayMove); until then
	// they are removed as without an archive.
	var archiveErr error
	move := false
	if s.archive.on() {
		if move, err = s.archiveMayMove(ctx); err != nil {
			return r, err
		}
	}
	if move {
		r.Archived, archiveErr = s.sweepArchive(ctx, now)
		if !errors.Is(archiveErr, intent.ErrArchiveUnavailable) {
			err, archiveErr = archiveErr, nil
		}
	} else {
		r.Removed, err = s.sweepRetained(ctx, now)
	}
	// Removals also drop expired entries from the chunks they rewrite.
	r.TombstonesRemoved += int(s.stats.tombstonesDropped.Load() - dropped)
	if err != nil {
		return r, err
	}
	n, err := s.sweepTombstones(ctx, now)
	r.TombstonesRemoved += n
	if err != nil {
		return r, err
	}
	n, err = s.sweepChunks(ctx, now)
	r.TombstonesRemoved += n
	if err != nil {
		return r, err
	}
	overdue, err := s.get(ctx, s.keys.unfinished(), 0,
		clientv3.WithRange(s.keys.unfinished()+timeKey(now.Add(-s.cfg.DefaultRetention))), clientv3.WithCountOnly())
	if err != nil {
		return r, err
	}
	r.Overdue = int(overdue.Count)
	return r, archiveErr
}

// sweepLapsed finds intents held by sessions that no longer exist and marks
// them UNKNOWN, so that the review queue and watchers see them without
// waiting for the next Acquire.
func (s *Store) sweepLapsed(ctx context.Context) (int, error) {
	n := 0
	start, end := s.keys.holders(), clientv3.GetPrefixRangeEnd(s.keys.holders())
	for {
		resp, err := s.get(ctx, start, 0, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(sweepBatch))
		if err != nil {
			return n, err
		}
		alive := map[string]bool{} // "tenant/session" → alive
		for _, kv := range resp.Kvs {
			// <prefix>x/h/<tenant>/<session>/<key>
			parts := strings.SplitN(strings.TrimPrefix(string(kv.Key), s.keys.holders()), "/", 3)
			if len(parts) != 3 {
				continue
			}
			tenant, session, key := parts[0], parts[1], parts[2]
			ts := tenant + "/" + session
			ok, seen := alive[ts]
			if !seen {
				skv, err := s.getSession(ctx, tenant, session)
				if err != nil {
					return n, unavailable(err)
				}
				ok = skv != nil
				alive[ts] = ok
			}
			if ok {
				continue
			}
			marked, err := s.markLapsed(ctx, tenant, key, session)
			if err != nil {
				return n, err
			}
			if marked {
				n++
			}
		}
		if !resp.More {
			return n, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// markLapsed turns an IN_PROGRESS intent whose holder session lapsed into
// UNKNOWN (or NEEDS_REVIEW, past its attempts limit), provided the holder
// is still gone when etcd applies the write.
func (s *Store) markLapsed(ctx context.Context, tenant, key, session string) (marked bool, err error) {
	a, err := s.transition(ctx, tenant, key, nil, s.loadWithHolder(tenant, key), func(v *machine.View) machine.Decision {
		return s.rules.MarkLapsed(v, session, s.cfg.Now())
	})
	return a.Written, err
}

// sweepRetained removes final records whose retention ended, each with its
// index keys, leaving a tombstone in the same transaction; records due
// together whose tombstones go into one chunk are removed together
// (removeDue). It sweeps the retention index in both layouts (see
// keys.go).
func (s *Store) sweepRetained(ctx context.Context, now time.Time) (int, error) {
	n := 0
	for _, r := range inBothLayouts(s.keys.retentionsIn) {
		removed, err := s.sweepDuePages(ctx, r, now, func(page []dueEntry) (int, error) {
			return s.removeDue(ctx, page, now)
		})
		n += removed
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// dueEntry is an entry of an end-of-retention index: its etcd key, and the
// tenant and key of the record or tombstone it names.
type dueEntry struct{ entry, tenant, key string }

// parseDue is the entry of the end-of-retention index r whose etcd key is
// key: <prefix><until, 8 bytes><tenant>/<key> or <prefix><until, 20
// digits>/<tenant>/<key>.
func parseDue(r indexRange, key string) (dueEntry, bool) {
	rest := key[len(r.prefix):]
	if r.layout == layoutCompact && len(rest) > 8 {
		rest = rest[8:]
	} else if _, after, ok := strings.Cut(rest, "/"); ok && r.layout == layoutDecimal {
		rest = after
	} else {
		return dueEntry{}, false
	}
	tenant, k, ok := strings.Cut(rest, "/")
	if !ok {
		return dueEntry{}, false
	}
	return dueEntry{key, tenant, k}, true
}

// sweepDue calls each for every entry of the end-of-retention index r due
// at now, <prefix><until, 8 bytes><tenant>/<key> or <prefix><until, 20
// digits>/<tenant>/<key>, and counts those it reports done.
func (s *Store) sweepDue(ctx context.Context, r indexRange, now time.Time, each func(entry, tenant, key string) (bool, error)) (int, error) {
	return s.sweepDuePages(ctx, r, now, func(page []dueEntry) (int, error) {
		n := 0
		for _, e := range page {
			done, err := each(e.entry, e.tenant, e.key)
			if err != nil {
				return n, err
			}
			if done {
				n++
			}
		}
		return n, nil
	})
}

// sweepDuePages is sweepDue a page (up to sweepBatch entries) at a time:
// it counts what each page reports done.
func (s *Store) sweepDuePages(ctx context.Context, r indexRange, now time.Time, each func(page []dueEntry) (int, error)) (int, error) {
	n := 0
	due := now.Add(time.Nanosecond)
	start, end := r.prefix, r.prefix+timeKey(due)
	if r.layout == layoutCompact {
		end = r.prefix + timeBytes(due)
	}
	for {
		resp, err := s.get(ctx, start, 0, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(sweepBatch))
		if err != nil {
			return n, err
		}
		done, err := each(dueEntries(r, resp.Kvs))
		n += done
		if err != nil {
			return n, err
		}
		if !resp.More {
			return n, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// remove deletes a final record past its retention and its index keys, and
// adds its tombstone to the chunk that covers its hash, in one
// compare-and-swap transaction (of the record and the chunk). After an
// ambiguous commit it reads back: a record gone is done.
func (s *Store) remove(ctx context.Context, tenant, key string, now time.Time) (bool, error) {
	load := func(ctx context.Context) (*machine.View, error) { return s.readView(ctx, tenant, key, true, nil, nil) }
	a, err := s.transition(ctx, tenant, key, nil, load, func(v *machine.View) machine.Decision {
		return s.rules.Remove(v, now)
	})
	return a.Written, err
}

// sweepTombstones removes tombstones of earlier versions (a key each)
// past their own retention, found in their index in both layouts; packed
// ones go in sweepChunks' walk (packed.go). After that a late retry of
// the key finds nothing at all (NOT_FOUND): a tombstone is kept much
// longer than any retry is expected to arrive.
func (s *Store) sweepTombstones(ctx context.Context, now time.Time) (int, error) {
	n := 0
	for _, r := range inBothLayouts(s.keys.tombRetentionsIn) {
		removed, err := s.sweepDue(ctx, r, now, func(entry, tenant, key string) (bool, error) {
			dctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
			defer cancel()
			if _, err := s.kv.Txn(dctx).Then(clientv3.OpDelete(s.keys.tombstone(tenant, key)), clientv3.OpDelete(entry)).Commit(); err != nil {
				return false, unavailable(err) // deleting twice is harmless: the next pass retries
			}
			return true, nil
		})
		n += removed
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// RunJanitor sweeps every interval while this replica holds the janitor
// election, so that several intentd replicas never sweep at once (and a
// replica that loses its etcd session stops sweeping). It returns when ctx
// ends; report, if not nil, receives every pass's report or error. Every
// replica also learns the packed tombstones' chunks when it starts
// (LearnTombstones).
func (s *Store) RunJanitor(ctx context.Context, cli *clientv3.Client, id string, interval time.Duration, report func(SweepReport, error)) {
	// Every replica runs this, elected or not: it learns the tombstone
	// chunks meanwhile (LearnTombstones), until it has or ctx ends.
	learnt := make(chan struct{})
	defer func() { <-learnt }()
	go func() {
		defer close(learnt)
		for attempt := 0; ctx.Err() == nil; attempt++ {
			if s.LearnTombstones(ctx) == nil {
				return
			}
			_ = s.backoff(ctx, attempt, nil)
		}
	}()
	elected := 0
	for attempt := 0; ctx.Err() == nil; attempt++ {
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(10), concurrency.WithContext(ctx))
		if err != nil {
			_ = s.backoff(ctx, attempt, nil) // tried again until ctx ends
			continue
		}
		el := concurrency.NewElection(sess, s.keys.election())
		if err := el.Campaign(ctx, id); err == nil {
			attempt = 0
			// The walk over the chunks goes by what this replica knows of
			// them: all of them once it has learnt them; anew after
			// another replica swept meanwhile.
			if elected++; elected == 1 {
				<-learnt
			} else {
				_ = s.LearnTombstones(ctx)
			}
			// The archiver's backfill walks the retention index once
			// more: another replica may have finalized records meanwhile
			// that only it finds (see archiver.go).
			s.archive.backfill.restart()
			s.sweepWhileLeader(ctx, sess, interval, report)
			rctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
			_ = el.Resign(rctx)
			cancel()
		}
		_ = sess.Close()
	}
}

// sweepWhileLeader sweeps every interval until ctx ends or the election
// session is lost.
func (s *Store) sweepWhileLeader(ctx context.Context, sess *concurrency.Session, interval time.Duration, report func(SweepReport, error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := s.Sweep(ctx)
		if report != nil {
			report(r, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
			return
		case <-t.C:
		}
	}
}
