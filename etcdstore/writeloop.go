package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
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
	// full is set once etcd answered NOSPACE, to the refusal: the store is
	// full, but the write may have been applied anyway (etcd applies the
	// write that crosses the quota, then raises the alarm and answers
	// NOSPACE). It is read back like any ambiguous outcome; only a
	// decision that still needs a write is refused as full.
	var full error
	for attempt := 0; ; attempt++ {
		if v == nil {
			var err error
			if v, err = load(ctx); err != nil {
				if werr := s.again(ctx, attempt, classify(err, false)); werr != nil {
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
				if werr := s.again(ctx, attempt, classify(err, false)); werr != nil {
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
		if full != nil {
			return machine.Answer{}, full
		}
		cctx, span := s.startSpan(ctx, "etcd txn", tenant, key)
		res, w, err := s.commit(cctx, tenant, v, &d)
		e := classify(err, true)
		endCommit(span, attempt, &d, res, e)
		switch e.class {
		case refuse:
			return machine.Answer{}, e.err
		case retry:
			// Nothing was written: decide again on the same view and
			// send the write again.
			if werr := s.backoff(ctx, attempt, e.err); werr != nil {
				return machine.Answer{}, werr
			}
			continue
		case readBack:
			// The write may or may not have committed: read back and
			// decide again. The compare keeps a committed write from
			// applying twice; the decision recognizes its own effect.
			s.stats.ambiguous.Add(1)
			s.cfg.Logger.Debug("etcdstore: ambiguous commit, reading back", "tenant", tenant, "key", key, "err", err)
			if e.full {
				full = e.err
			}
			if werr := s.backoff(ctx, attempt, e.err); werr != nil {
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
		committed := s.committed(tenant, key, &d, w, res.rev)
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
// revision rev, as w, and returns the record as a reader now sees it
// (tokens materialized; nil when the record was removed).
func (s *Store) committed(tenant, key string, d *machine.Decision, w written, rev int64) *machine.Record {
	var committed *machine.Record
	for _, c := range w.tomb.chunks {
		s.chunks.observe(c, rev)
	}
	s.stats.tombstonesDropped.Add(int64(w.tomb.dropped))
	if d.Next != nil {
		// The cache and the caller see exactly what a reader would.
		committed = asCommitted(d.Next, rev)
		if checkCommitted != nil {
			checkCommitted(tenant, key, committed, w.next, rev)
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

// written is what a commit wrote besides compares and index keys: the
// value of the decision's next record, if any, and the tombstone's write.
type written struct {
	next []byte
	tomb packed
}

// commit writes a decision: its guards become the transaction's compares,
// its writes the operations, with the index keys each written record gains
// and loses. The write goes with others in one etcd transaction when some
// are waiting (group.go); a decision too large for a transaction of its
// own is refused here, before it could share one.
func (s *Store) commit(ctx context.Context, tenant string, v *machine.View, d *machine.Decision) (outcome, written, error) {
	// The record, its index entries, a tombstone's chunks, and each child
	// with its entries: room for all but unusual label counts.
	m := &member{
		cmps:  make([]clientv3.Cmp, 0, len(d.Guards)+2),
		reads: make([]string, 0, len(d.Guards)+2),
		ops:   make([]clientv3.Op, 0, 8+6*len(d.Create)),
	}
	for _, g := range d.Guards {
		m.cmps = append(m.cmps, s.compares(tenant, v, g)...)
	}
	if d.Issues() {
		m.slot = int(s.slots.Add(1)%machine.TokenSlots) + 1
		d.Next.Lease.Slot = m.slot
	}
	k := s.keys.intent(tenant, v.Key)
	var w written
	if d.Next != nil {
		var err error
		if w.next, err = encodeRecord(d.Next); err != nil {
			return outcome{}, w, err
		}
		m.ops = append(m.ops, clientv3.OpPut(k, string(storedValue(d.Next, w.next))))
		m.ops = s.keys.appendIndexOps(m.ops, v.Rec, d.Next)
	}
	if t := d.Tombstone; t != nil {
		var err error
		if w.tomb, err = s.pack(tenant, v, t); err != nil {
			return outcome{}, w, err
		}
		m.cmps = append(m.cmps, w.tomb.cmp)
		m.ops = append(m.ops, clientv3.OpDelete(k))
		m.ops = append(m.ops, w.tomb.ops...)
		m.ops = s.keys.appendIndexOps(m.ops, v.Rec, nil)
	}
	for _, c := range d.Create {
		val, err := encodeRecord(c)
		if err != nil {
			return outcome{}, w, err
		}
		m.ops = append(m.ops, clientv3.OpPut(s.keys.intent(tenant, c.Key), string(val)))
		m.ops = s.keys.appendIndexOps(m.ops, nil, c)
	}
	if len(m.ops) > maxTxnOps || len(m.cmps) > maxTxnOps {
		return outcome{}, w, fmt.Errorf("%w: %d operations, more than etcd's %d per transaction", intent.ErrTooLarge, len(m.ops), maxTxnOps)
	}
	if m.bytes = opsBytes(m.ops); m.bytes > maxTxnBytes {
		return outcome{}, w, fmt.Errorf("%w: %d bytes, more than the %d one transaction may carry", intent.ErrTooLarge, m.bytes, maxTxnBytes)
	}
	for _, c := range m.cmps {
		m.reads = append(m.reads, string(c.KeyBytes()))
	}
	m.writes = make([]string, len(m.ops))
	for i, op := range m.ops {
		m.writes[i] = string(op.KeyBytes())
	}
	o := s.group.commit(ctx, m)
	return o, w, o.err
}

// compares is a guard of a decision made from v as etcd compares.
func (s *Store) compares(tenant string, v *machine.View, g machine.Guard) []clientv3.Cmp {
	switch g.Kind {
	case machine.RecordAt:
		return []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.keys.intent(tenant, g.Key)), "=", g.Rev)}
	case machine.SessionAlive:
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.keys.session(tenant, g.Session)), "=", g.Rev)}
	case machine.SessionGone:
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.keys.session(tenant, g.Session)), "!=", g.Rev)}
	case machine.NoTombstone:
		return s.spotCompares(tenant, v, g.Key)
	case machine.Exists:
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.keys.intent(tenant, g.Key)), ">", 0)}
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
// caller's context was canceled, or the operation ran out of time; then it
// returns outOfTime, what the last failure answers (the store is
// unavailable, and the caller may retry the same call safely).
func (s *Store) backoff(ctx context.Context, attempt int, outOfTime error) error {
	d := min(10*time.Millisecond<<min(attempt, 6), 500*time.Millisecond)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err()
		}
		return outOfTime
	case <-t.C:
		return nil
	}
}

// again acts on the verdict of a failed call that is sent again as it is
// (a read, or a create-if-absent write whose else branch reads back):
// nil once it may be sent again, after a backoff, or the error to return.
func (s *Store) again(ctx context.Context, attempt int, e verdict) error {
	if e.class == refuse {
		return e.err
	}
	return s.backoff(ctx, attempt, e.err)
}

// class is what an error of an etcd call means for the call; classify puts
// every error of the store's etcd calls in exactly one.
type class uint8

const (
	// succeeded: there was no error.
	succeeded class = iota
	// retry: transient, and nothing was written: the call read only, or
	// etcd turned the write away before proposing it (no leader, too many
	// requests). Send it again after a backoff.
	retry
	// readBack: the outcome of a write is unknown: it may have been
	// applied (a timeout, a leader change, a lost reply, a full backend).
	// Read the record back and decide again; the compare keeps a write
	// that did apply from applying twice.
	readBack
	// refuse: permanent: sending the call again would fail the same way
	// (the request too large, a full backend for a write that is not read
	// back, etcd's revision went back, permission denied, the caller gave
	// up). The call ends with the verdict's error.
	refuse
)

// verdict is an error of an etcd call, classed.
type verdict struct {
	class class
	// err is what the caller answers: the refusal; for retry and read
	// back, the unavailability to answer if the operation runs out of
	// time; for a full backend read back, the refusal a decision that
	// still needs a write gets.
	err error
	// full: etcd's backend quota is exhausted (NOSPACE): it serves reads
	// and deletes only, and refuses every write.
	full bool
	// whole: etcd refused the request whole for what it holds (its size,
	// its number of operations, a key written twice): nothing was
	// written, and smaller requests may pass (group.go sends a batch
	// refused so again in halves).
	whole bool
}

// classify is the one place the store tells etcd's errors apart: it classes
// err, the error of an etcd call or of the store's own checks around it.
// write is set for the write loop's commit, whose outcome the loop learns
// by reading back when it is unknown; for any other call (a read, a lease
// call, a create-if-absent write sent again as it is, whose else branch
// reads back) a transient error is retry, and a full backend a refusal.
func classify(err error, write bool) verdict {
	transient := verdict{class: retry, err: fmt.Errorf("%w: %v", intent.ErrUnavailable, err)}
	if write {
		transient.class = readBack
	}
	switch {
	case err == nil:
		return verdict{}
	// The store's own refusals, and the caller's cancellation.
	case errors.Is(err, intent.ErrStoreRolledBack), errors.Is(err, intent.ErrTooLarge), errors.Is(err, errCorrupt),
		errors.Is(err, context.Canceled):
		return verdict{class: refuse, err: err}
	case errors.Is(err, context.DeadlineExceeded):
		// One attempt's deadline (Config.RequestTimeout): a write may
		// have been applied. When the operation ran out of time as a
		// whole, backoff says so.
		return transient
	// etcd's errors, as the client returns them.
	case errors.Is(err, rpctypes.ErrNoSpace):
		// etcd applies the write that crosses the quota, then answers
		// NOSPACE: the write loop reads it back.
		full := verdict{class: refuse, err: fmt.Errorf("%w: etcd's backend quota is exhausted (NOSPACE alarm)", intent.ErrStoreFull), full: true}
		if write {
			full.class = readBack
		}
		return full
	case errors.Is(err, rpctypes.ErrRequestTooLarge), errors.Is(err, rpctypes.ErrTooManyOps):
		// Refused whole: nothing was written.
		return verdict{class: refuse, err: fmt.Errorf("%w: etcd refused it: %v", intent.ErrTooLarge, err), whole: true}
	case errors.Is(err, rpctypes.ErrDuplicateKey):
		// A transaction that writes a key twice: the store's own bug,
		// refused whole.
		return verdict{class: refuse, err: fmt.Errorf("etcdstore: etcd refused the transaction: %w", err), whole: true}
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease behind a session lapsed or was revoked.
		return verdict{class: refuse, err: fmt.Errorf("%w: its etcd lease is gone", intent.ErrSessionNotFound)}
	case errors.Is(err, rpctypes.ErrCompacted):
		return verdict{class: refuse, err: &intent.CompactedError{}}
	case errors.Is(err, rpctypes.ErrNoLeader), errors.Is(err, rpctypes.ErrNotLeader), errors.Is(err, rpctypes.ErrTooManyRequests),
		errors.Is(err, clientv3.ErrNoAvailableEndpoints):
		// Turned away before it was proposed, or never sent.
		transient.class = retry
		return transient
	case errors.Is(err, rpctypes.ErrLeaderChanged), errors.Is(err, rpctypes.ErrStopped), errors.Is(err, rpctypes.ErrTimeout),
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail), errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost),
		errors.Is(err, rpctypes.ErrUnhealthy):
		// A member that cannot answer now: a write may have been
		// proposed, and applied.
		return transient
	case strings.Contains(rpctypes.ErrorDesc(err), "trying to send message larger than max"):
		// gRPC's limit on a message the client sends (a status whose
		// code etcdstore cannot read: it imports none of gRPC's codes):
		// refused whole before it was sent.
		return verdict{class: refuse, err: fmt.Errorf("%w: %v", intent.ErrTooLarge, err), whole: true}
	case errors.As(err, new(rpctypes.EtcdError)):
		// Any other error etcd names (permission denied, an invalid
		// auth token, a corrupt cluster, a future revision, ...)
		// refuses the call as it is, or intentd's credentials: sending
		// it again fails the same way. An operator fixes it; the caller
		// is told the store is unavailable.
		return verdict{class: refuse, err: fmt.Errorf("%w: etcd refused the call: %v", intent.ErrUnavailable, err)}
	}
	// Not one etcd names: a connection lost or refused (a gRPC status
	// etcd's client passes on as it is), a timeout, a member stopping.
	return transient
}

// unavailable is the error a call that does not read back answers for err,
// an error of etcd (nil for none): what classify says.
func unavailable(err error) error {
	return classify(err, false).err
}

// readErr is the error a read at rev (0: now) answers for err: a revision
// etcd compacted away names the one asked for.
func readErr(err error, rev int64) error {
	err = unavailable(err)
	if c, ok := errors.AsType[*intent.CompactedError](err); ok {
		c.Requested = rev
	}
	return err
}
