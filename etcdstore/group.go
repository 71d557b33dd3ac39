package etcdstore

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/internal/core/machine"
)

// Group commit: concurrent transitions on distinct intents share one etcd
// transaction, so that the store sends one request (one raft entry, one
// fsync) for many calls. Each transition's write becomes a nested
// transaction (clientv3.OpTxn) with its own compares; the outer one has
// none. Each caller gets its own outcome: its nested transaction
// succeeded (committed at the batch's revision) or its compare failed
// (a conflict: decide again). An error of the whole request is the error
// of every member, which each handles as it would alone (ambiguous: read
// back; NOSPACE; revision went back).
//
// A batch is sent as soon as a sender is free: no timer, no added delay.
// Up to maxInFlight batches are in flight at once. A caller that finds a
// sender free sends at once (alone, as a plain transaction, exactly the
// request it would send without grouping, when nobody else is waiting);
// callers that arrive while every sender is busy queue up and go together
// in the next batch. More than one sender matters when an etcd member
// stalls: a request on it is held until its timeout, and with a single
// sender every other caller would wait behind it, although the other
// members answer (see docs/OPERATIONS.md, "A stalled etcd member").
//
// What may share a batch:
//   - etcd evaluates every compare of a transaction, nested ones included,
//     against the state before any of its writes. Members whose writes
//     touch no key another member compares or writes are then independent:
//     the batch is as if they had applied one after the other, in any
//     order. A member that would overlap waits for a later batch (etcd
//     would also refuse two writes of one key in one request).
//   - etcd's --max-txn-ops (default 128) bounds, at each level, the
//     largest of a transaction's compares, then-ops and else-ops, and a
//     nested transaction gets what its parent left: members + the largest
//     member's compares or ops must stay within maxTxnOps.
//   - the whole request stays within maxTxnBytes, and a batch never holds
//     more members than a revision has token slots (machine.TokenSlots),
//     nor two that issue a lease in the same slot.
//
// A member too large on its own was refused before it got here (see
// Store.commit), so it cannot make a batch fail. If etcd still refuses a
// batch whole for its size or number of operations (an etcd configured
// below the defaults), nothing was written, and the batch is sent again
// in halves.

// member is one transition's write, waiting for its batch.
type member struct {
	ctx  context.Context
	cmps []clientv3.Cmp
	ops  []clientv3.Op
	// reads are the keys the compares look at, writes the keys the ops put
	// or delete.
	reads, writes []string
	bytes         int
	// slot is the token slot of the lease the write issues, 0 if none.
	slot int
	done chan outcome
}

// outcome is what became of a member's write.
type outcome struct {
	succeeded bool
	rev       int64
	err       error
}

// maxInFlight is how many batches may be in flight at once: enough that
// requests held by a stalled member (until the steering takes it out of
// use, within a second) leave senders for the others, few enough that under
// load callers still queue up and share batches.
const maxInFlight = 8

// committer groups members into batches and sends them.
type committer struct {
	kv      clientv3.KV
	timeout time.Duration
	// observe, if set, is told the members of each request sent (a batch
	// refused whole and sent again in halves counts as the halves only).
	observe func(members int)

	mu      sync.Mutex
	pending []*member
	// senders is how many goroutines are sending batches; each sends
	// until none is waiting.
	senders int
}

// commit sends m, with others when some are waiting, and returns its
// outcome, or the error of ctx if it ends first (the write may still be
// sent: its compares keep it from applying twice, as for any ambiguous
// outcome).
func (c *committer) commit(ctx context.Context, m *member) outcome {
	m.ctx, m.done = ctx, make(chan outcome, 1)
	c.mu.Lock()
	c.pending = append(c.pending, m)
	lead := c.senders < maxInFlight
	if lead {
		c.senders++
	}
	c.mu.Unlock()
	if lead {
		// A sender was free: m's batch goes at once, with whoever else
		// was waiting. Batches that queued up meanwhile go from a
		// goroutine of their own, so that m's caller gets its answer now.
		if batch := c.next(); batch != nil {
			c.send(batch)
			c.mu.Lock()
			more := len(c.pending) > 0
			if !more {
				c.senders--
			}
			c.mu.Unlock()
			if more {
				go c.drain()
			}
		}
	}
	select {
	case o := <-m.done:
		return o
	case <-ctx.Done():
		select {
		case o := <-m.done: // both at once: the outcome is known
			return o
		default:
			return outcome{err: ctx.Err()}
		}
	}
}

// drain sends batches until none is waiting.
func (c *committer) drain() {
	for batch := c.next(); batch != nil; batch = c.next() {
		c.send(batch)
	}
}

// next takes the next batch from the waiting members, oldest first; those
// that do not fit stay, in order. Members whose caller gave up are dropped.
// When none is left, the sender's turn ends (and it is counted out).
func (c *committer) next() []*member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b batch
	rest := c.pending[:0]
	for _, m := range c.pending {
		switch {
		case m.ctx.Err() != nil:
		case b.admit(m):
		default:
			rest = append(rest, m)
		}
	}
	clear(c.pending[len(rest):])
	c.pending = rest
	if b.members == nil {
		c.senders--
	}
	return b.members
}

// batch is a batch being filled.
type batch struct {
	members []*member
	inner   int // the largest member's compares or ops
	bytes   int
	// reads and writes are the members' keys, slots their token slots;
	// made when a second member is considered.
	reads, writes map[string]struct{}
	slots         map[int]struct{}
}

// admit adds m if it fits (see the rules at the top of the file).
func (b *batch) admit(m *member) bool {
	inner := max(len(m.cmps), len(m.ops))
	if len(b.members) == 0 {
		b.members, b.inner, b.bytes = append(b.members, m), inner, m.bytes
		return true
	}
	if len(b.members)+1 > machine.TokenSlots || len(b.members)+1+max(b.inner, inner) > maxTxnOps || b.bytes+m.bytes > maxTxnBytes {
		return false
	}
	if b.writes == nil {
		b.reads, b.writes, b.slots = map[string]struct{}{}, map[string]struct{}{}, map[int]struct{}{}
		b.add(b.members[0])
	}
	if _, taken := b.slots[m.slot]; m.slot != 0 && taken {
		return false
	}
	for _, k := range m.writes {
		if has(b.writes, k) || has(b.reads, k) {
			return false
		}
	}
	for _, k := range m.reads {
		if has(b.writes, k) {
			return false
		}
	}
	b.add(m)
	b.members, b.inner, b.bytes = append(b.members, m), max(b.inner, inner), b.bytes+m.bytes
	return true
}

func (b *batch) add(m *member) {
	for _, k := range m.reads {
		b.reads[k] = struct{}{}
	}
	for _, k := range m.writes {
		b.writes[k] = struct{}{}
	}
	if m.slot != 0 {
		b.slots[m.slot] = struct{}{}
	}
}

func has(set map[string]struct{}, k string) bool {
	_, ok := set[k]
	return ok
}

// send commits a batch and tells each member its outcome.
func (c *committer) send(members []*member) {
	if len(members) == 1 {
		// Alone: the plain transaction, on the caller's own context.
		m := members[0]
		if c.observe != nil {
			c.observe(1)
		}
		ctx, cancel := context.WithTimeout(m.ctx, c.timeout)
		resp, err := c.kv.Txn(ctx).If(m.cmps...).Then(m.ops...).Commit()
		cancel()
		if err != nil {
			m.done <- outcome{err: err}
			return
		}
		m.done <- outcome{succeeded: resp.Succeeded, rev: resp.Header.Revision}
		return
	}
	ops := make([]clientv3.Op, len(members))
	for i, m := range members {
		ops[i] = clientv3.OpTxn(m.cmps, m.ops, nil)
	}
	// The request serves every member: no one caller's cancellation or
	// deadline may cut it short for the others.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(members[0].ctx), c.timeout)
	resp, err := c.kv.Txn(ctx).Then(ops...).Commit()
	cancel()
	if err != nil && classify(err, true).whole {
		// Nothing was written: send the halves.
		half := len(members) / 2
		c.send(members[:half])
		c.send(members[half:])
		return
	}
	if c.observe != nil {
		c.observe(len(members))
	}
	for i, m := range members {
		if err != nil {
			m.done <- outcome{err: err}
			continue
		}
		m.done <- outcome{succeeded: resp.Responses[i].GetResponseTxn().GetSucceeded(), rev: resp.Header.Revision}
	}
}
