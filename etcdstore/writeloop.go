package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// The write loop: a transition decides (package machine, pure), turns the
// decision's guards into compares and commits its writes in one etcd
// transaction, and on a failed compare or an ambiguous commit reads again
// and decides again; etcd's errors are classed here (retry after backoff,
// read back, or refuse). Group commit (group.go) batches commits of
// distinct intents into one transaction.

// decideFunc is one call's decide function of package machine, bound to
// its call and clock. It may be called several times, once per attempt.
type decideFunc func(v *machine.View) machine.Decision

// transition decides on a view of the intent and commits the decision's
// writes with compare-and-swap, deciding again on a fresh read whenever a
// guard fails or the outcome of a commit is ambiguous. It never writes
// without comparing the revision the decision was made from, so a retried
// write can never apply twice. It returns the decision's answer, or its
// refusal (after writing the evidence the decision keeps, if any).
func (s *Store) transition(ctx context.Context, tenant, key string, start *machine.View, load func(context.Context) (*machine.View, error), decide decideFunc) (machine.Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OperationTimeout)
	defer cancel()
	v := start
	// full is set once etcd answered NOSPACE: the store is full, but the
	// write may have been applied anyway (etcd applies the write that
	// crosses the quota, then raises the alarm and answers NOSPACE). Read
	// back like any ambiguous outcome; only a decision that still needs a
	// write is refused as full.
	full := false
	for attempt := 0; ; attempt++ {
		if v == nil {
			var err error
			if v, err = load(ctx); err != nil {
				if errors.Is(err, errCorrupt) {
					return machine.Answer{}, err
				}
				if werr := s.backoff(ctx, attempt, err); werr != nil {
					return machine.Answer{}, werr
				}
				continue
			}
		}
		d := decide(v)
		if id := d.NeedSession; id != "" {
			// The decision shows a holder the view did not read: read
			// it, then decide again on the same view.
			kv, err := s.getSession(ctx, tenant, id)
			if err != nil {
				if werr := s.backoff(ctx, attempt, err); werr != nil {
					return machine.Answer{}, werr
				}
				continue
			}
			if v.Sessions == nil {
				v.Sessions = map[string]int64{}
			}
			v.Sessions[id] = createRevision(kv)
			continue
		}
		if (d.Err != nil || !d.Writes()) && !v.Fresh {
			v = nil // confirm a refusal or a no-op on a fresh read
			continue
		}
		if !d.Writes() {
			return answered(d.Answer, d.Err)
		}
		if full {
			return machine.Answer{}, fmt.Errorf("%w: etcd's backend quota is exhausted (NOSPACE alarm)", intent.ErrStoreFull)
		}
		cctx, span := s.startSpan(ctx, "etcd txn", tenant, key)
		res, next, err := s.commit(cctx, tenant, v, &d)
		endCommit(span, attempt, &d, res, err)
		if errors.Is(err, intent.ErrTooLarge) {
			return machine.Answer{}, err
		}
		if errors.Is(err, rpctypes.ErrNoSpace) {
			full, v = true, nil // reads are still served
			continue
		}
		if errors.Is(err, ErrRevisionWentBack) {
			// Refused, not ambiguous: the write may have been applied by
			// the etcd that went back, but nothing of it reaches the
			// caller, and trying again would be refused the same way.
			return machine.Answer{}, err
		}
		if errors.Is(err, rpctypes.ErrRequestTooLarge) {
			// etcd refused the request whole: nothing was written, and
			// sending it again would fail the same way.
			return machine.Answer{}, fmt.Errorf("%w: etcd refused it: %v", intent.ErrTooLarge, err)
		}
		if err != nil {
			// The write may or may not have committed: read back and
			// decide again. The compare keeps a committed write from
			// applying twice; the decision recognizes its own effect.
			s.stats.ambiguous.Add(1)
			s.cfg.Logger.Debug("etcdstore: ambiguous commit, reading back", "tenant", tenant, "key", key, "err", err)
			if werr := s.backoff(ctx, attempt, err); werr != nil {
				return machine.Answer{}, werr
			}
			v = nil
			continue
		}
		if !res.succeeded {
			s.stats.conflicts.Add(1)
			v = nil
			continue
		}
		s.stats.commits.Add(1)
		committed := s.committed(tenant, key, &d, next, res.rev)
		return answered(d.Finish(committed, res.rev), d.Err)
	}
}

// answered is a decision's answer, or its refusal and no answer.
func answered(a machine.Answer, refusal error) (machine.Answer, error) {
	if refusal != nil {
		return machine.Answer{}, refusal
	}
	return a, nil
}

// committed updates the cache and the counters after d committed at
// revision rev, with next the value written for d.Next, and returns the
// record as a reader now sees it (tokens materialized; nil when the record
// was removed).
func (s *Store) committed(tenant, key string, d *machine.Decision, next []byte, rev int64) *machine.Record {
	var committed *machine.Record
	if d.Next != nil {
		// The cache and the caller see exactly what a reader would.
		committed = asCommitted(d.Next, rev)
		if checkCommitted != nil {
			checkCommitted(tenant, key, committed, next, rev)
		}
		s.remember(tenant, key, committed, rev)
	} else {
		s.records.Remove(cacheKey(tenant, key))
	}
	switch d.Ended {
	case machine.EndedMarkedUnknown:
		s.stats.markedUnknown.Add(1)
	case machine.EndedLapsedAtAcquire:
		s.stats.lapsesByAcquire.Add(1)
	case machine.EndedLapsedAtSweep:
		s.stats.lapsesByJanitor.Add(1)
	}
	if d.Exhausted {
		s.stats.exhausted.Add(1)
		s.cfg.Logger.Warn("etcdstore: intent needs review: too many attempts ended without a report",
			"tenant", tenant, "key", key, "attempts", committed.Attempts, "max_attempts", machine.AttemptLimit(committed, s.cfg.MaxAttempts))
	}
	return committed
}

// checkCommitted, set by the store's tests, is told each record committed
// and the value it was written as, to check that asCommitted is what
// decodeRecord would give.
var checkCommitted func(tenant, key string, committed *machine.Record, value []byte, rev int64)

// maxTxnOps is etcd's default limit of operations in one transaction
// (--max-txn-ops; the embedded etcd keeps it).
const maxTxnOps = 128

// commit writes a decision: its guards become the transaction's compares,
// its writes the operations, with the index keys each written record gains
// and loses. The write goes with others in one etcd transaction when some
// are waiting (group.go); a decision too large for a transaction of its
// own is refused here, before it could share one. It returns the value
// written for d.Next, if any.
func (s *Store) commit(ctx context.Context, tenant string, v *machine.View, d *machine.Decision) (outcome, []byte, error) {
	// The record, its index entries, a tombstone's three writes, and each
	// child with its entries: room for all but unusual label counts.
	m := &member{
		cmps:  make([]clientv3.Cmp, len(d.Guards)),
		reads: make([]string, 0, len(d.Guards)),
		ops:   make([]clientv3.Op, 0, 8+6*len(d.Create)),
	}
	for i, g := range d.Guards {
		m.cmps[i] = s.compare(tenant, g)
		m.reads = append(m.reads, string(m.cmps[i].KeyBytes()))
	}
	if d.Issues() {
		m.slot = int(s.slots.Add(1)%machine.TokenSlots) + 1
		d.Next.Lease.Slot = m.slot
	}
	k := s.keys.intent(tenant, v.Key)
	var next []byte
	if d.Next != nil {
		var err error
		if next, err = encodeRecord(d.Next); err != nil {
			return outcome{}, nil, err
		}
		m.ops = append(m.ops, clientv3.OpPut(k, string(storedValue(d.Next, next))))
		m.ops = s.keys.appendIndexOps(m.ops, v.Rec, d.Next)
	}
	if t := d.Tombstone; t != nil {
		tomb, err := encodeTombstone(t)
		if err != nil {
			return outcome{}, nil, err
		}
		m.ops = append(m.ops, clientv3.OpDelete(k), clientv3.OpPut(s.keys.tombstone(tenant, v.Key), string(tomb)),
			clientv3.OpPut(s.keys.tombRetention(t.Until, tenant, v.Key), ""))
		m.ops = s.keys.appendIndexOps(m.ops, v.Rec, nil)
	}
	for _, c := range d.Create {
		val, err := encodeRecord(c)
		if err != nil {
			return outcome{}, nil, err
		}
		m.ops = append(m.ops, clientv3.OpPut(s.keys.intent(tenant, c.Key), string(val)))
		m.ops = s.keys.appendIndexOps(m.ops, nil, c)
	}
	if len(m.ops) > maxTxnOps || len(m.cmps) > maxTxnOps {
		return outcome{}, nil, fmt.Errorf("%w: %d operations, more than etcd's %d per transaction", intent.ErrTooLarge, len(m.ops), maxTxnOps)
	}
	if m.bytes = opsBytes(m.ops); m.bytes > maxTxnBytes {
		return outcome{}, nil, fmt.Errorf("%w: %d bytes, more than the %d one transaction may carry", intent.ErrTooLarge, m.bytes, maxTxnBytes)
	}
	m.writes = make([]string, len(m.ops))
	for i, op := range m.ops {
		m.writes[i] = string(op.KeyBytes())
	}
	o := s.group.commit(ctx, m)
	return o, next, o.err
}

// compare is a guard as an etcd compare.
func (s *Store) compare(tenant string, g machine.Guard) clientv3.Cmp {
	switch g.Kind {
	case machine.RecordAt:
		return clientv3.Compare(clientv3.ModRevision(s.keys.intent(tenant, g.Key)), "=", g.Rev)
	case machine.SessionAlive:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.session(tenant, g.Session)), "=", g.Rev)
	case machine.SessionGone:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.session(tenant, g.Session)), "!=", g.Rev)
	case machine.NoTombstone:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.tombstone(tenant, g.Key)), "=", 0)
	case machine.Exists:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.intent(tenant, g.Key)), ">", 0)
	}
	panic(fmt.Sprintf("etcdstore: guard kind %d has no compare", g.Kind))
}

// maxTxnBytes bounds what one transaction writes, well under etcd's default
// request limit of 1.5 MiB.
const maxTxnBytes = 1 << 20

// opsBytes estimates the request size of a transaction's writes.
func opsBytes(ops []clientv3.Op) int {
	n := 0
	for _, op := range ops {
		n += len(op.KeyBytes()) + len(op.ValueBytes())
	}
	return n
}

// backoff waits before the next attempt, or returns why it must not: the
// caller's context ended, or the operation ran out of time (then the store
// is unavailable, and the caller may retry the same call safely).
func (s *Store) backoff(ctx context.Context, attempt int, cause error) error {
	if errors.Is(cause, ErrRevisionWentBack) {
		return cause // every retry would be refused the same way
	}
	d := min(10*time.Millisecond<<min(attempt, 6), 500*time.Millisecond)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", intent.ErrUnavailable, cause)
	case <-t.C:
		return nil
	}
}

// unavailable wraps an etcd error of a call that wrote nothing: the store
// did not answer — or, for a full backend, refused.
func unavailable(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrRevisionWentBack) {
		return err // a refusal below the floor is already ErrUnavailable
	}
	if errors.Is(err, rpctypes.ErrNoSpace) {
		return fmt.Errorf("%w: %v", intent.ErrStoreFull, err)
	}
	return fmt.Errorf("%w: %v", intent.ErrUnavailable, err)
}
