// Package etcdfence is a fencing.Checker whose memory is etcd, for a
// resource spread over several processes (or one that must remember the
// highest token across restarts). Every process of the resource shares one
// Checker state: one etcd key per resource, holding the highest token
// admitted, changed only by an etcd compare-and-swap.
//
// # What it guarantees
//
// Admit is one etcd transaction: it either finds a higher token and refuses,
// or stores t; no two processes can both pass the check with tokens out of
// order. A retried Admit with the same token is admitted again (equal tokens
// are the same lease retrying), so an Admit whose commit is ambiguous (a
// timeout, a leader change) may simply be repeated.
//
// # What it does not guarantee
//
// Admit does not make the resource's own write atomic with the check. After
// Admit returns nil the caller may pause; meanwhile a newer token can be
// admitted and the newer holder can write, and then the stale caller's write
// lands anyway. Only a write that goes into the same etcd transaction as the
// check is fenced: a resource that keeps its data in etcd puts Cmp and Op in
// its own Txn, as etcd's concurrency.Mutex hands out IsOwner for the same
// purpose. A resource whose data lives elsewhere must make its own store
// refuse the write (a conditional write on the token it stored with the data)
// or accept that Admit narrows the window and does not close it.
//
// The keys under the prefix belong to the Checker: anything else writing
// there can break the byte-wise ordering the compare relies on.
package etcdfence

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/intentd/intentd/fencing"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTimeout bounds every etcd call a Checker makes when the caller's
// context has no deadline of its own, so that an unreachable etcd yields an
// error instead of a hung resource.
const DefaultTimeout = 5 * time.Second

// width is the length of an encoded token: math.MaxUint64 has 20 decimal
// digits.
const width = 20

// Checker is a fencing.Checker backed by etcd. It is safe for concurrent
// use, and any number of Checkers in any number of processes that share a
// prefix share their state.
type Checker struct {
	kv      clientv3.KV
	prefix  string
	timeout time.Duration // applied when ctx has no deadline
}

var _ fencing.Checker = (*Checker)(nil)

// New returns a Checker that keeps the highest token of resource r at key
// prefix+r in the etcd that c talks to. The prefix should end in a separator
// (for example "fence/orders/") and must not be shared with other data.
func New(c *clientv3.Client, prefix string) *Checker {
	return &Checker{kv: c, prefix: prefix, timeout: DefaultTimeout}
}

// Key returns the etcd key that holds resource's highest admitted token.
func (c *Checker) Key(resource string) string { return c.prefix + resource }

// Admit admits t for resource if t is at least the highest token admitted
// for it by any process sharing this Checker's prefix, and stores t as the
// new highest. It returns a *fencing.StaleError carrying the stored highest
// if t is older, an error matching fencing.ErrMalformed for the zero Token,
// and a wrapped etcd or context error if etcd could not be asked; in every
// error case the caller must not write.
//
// The check is one etcd Txn:
//
//	If(Value(key) > enc(t)) Then(Get(key)) Else(Put(key, enc(t)))
//
// etcd's Value compare always fails on a key that does not exist, so the
// first Admit for a resource falls into Else and creates the key, which is
// what a resource that has seen no token must do.
func (c *Checker) Admit(ctx context.Context, resource string, t fencing.Token) error {
	if t == 0 {
		return fmt.Errorf("etcdfence: admit %q: %w: zero token is never issued", resource, fencing.ErrMalformed)
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	key := c.Key(resource)
	resp, err := c.kv.Txn(ctx).
		If(c.Cmp(resource, t)).
		Then(clientv3.OpGet(key)).
		Else(c.Op(resource, t)).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdfence: admit %q: %w", resource, err)
	}
	if !resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		// The compare saw the key in this same revision, so Get must too.
		return fmt.Errorf("etcdfence: admit %q: stale compare held but key %q is missing", resource, key)
	}
	h, err := decode(kvs[0].Value)
	if err != nil {
		return fmt.Errorf("etcdfence: admit %q: key %q: %w", resource, key, err)
	}
	return &fencing.StaleError{Resource: resource, Token: t, Highest: h}
}

// Highest returns the highest token admitted for resource, or the zero
// Token if none was. The read is linearizable.
func (c *Checker) Highest(ctx context.Context, resource string) (fencing.Token, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	key := c.Key(resource)
	resp, err := c.kv.Get(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("etcdfence: highest %q: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	h, err := decode(resp.Kvs[0].Value)
	if err != nil {
		return 0, fmt.Errorf("etcdfence: highest %q: key %q: %w", resource, key, err)
	}
	return h, nil
}

// Cmp returns the comparison that holds when t is STALE for resource: the
// stored highest token is greater than t. It is the If of Admit, exported so
// that a resource which stores its data in etcd can fence its own write in
// the same transaction:
//
//	resp, err := kv.Txn(ctx).
//		If(fc.Cmp(r, t)).
//		// stale: refused; read the highest to report it
//		Then(clientv3.OpGet(fc.Key(r))).
//		// admitted: record t and write, in one step
//		Else(fc.Op(r, t), clientv3.OpPut(dataKey, data)).
//		Commit()
//
// resp.Succeeded then means refused. The sense is inverted (unlike
// concurrency.Mutex.IsOwner) because etcd's Value compare always fails on a
// missing key: a "t is current" compare would refuse the first writer of
// every resource, while this one sends a missing key to Else, which creates
// it. The guarded write therefore belongs in Else, next to Op.
func (c *Checker) Cmp(resource string, t fencing.Token) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(c.Key(resource)), ">", encode(t))
}

// Op returns the Put that records t as resource's highest token. Use it in
// the Else branch of a Txn whose If is Cmp(resource, t), with the same t;
// elsewhere it could lower the stored token.
func (c *Checker) Op(resource string, t fencing.Token) clientv3.Op {
	return clientv3.OpPut(c.Key(resource), encode(t))
}

// bound gives ctx a deadline of c.timeout unless it already has one.
func (c *Checker) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.timeout)
}

// encode writes t as exactly 20 decimal digits, zero-padded, so that
// etcd's byte-wise Value compare orders encodings as it orders tokens.
func encode(t fencing.Token) string {
	return fmt.Sprintf("%0*d", width, uint64(t))
}

// decode reads a value written by encode.
func decode(b []byte) (fencing.Token, error) {
	if len(b) != width {
		return 0, fmt.Errorf("%w: stored value %q is not %d digits", fencing.ErrMalformed, b, width)
	}
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("%w: stored value %q is not %d digits", fencing.ErrMalformed, b, width)
		}
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: stored value %q: %v", fencing.ErrMalformed, b, err)
	}
	return fencing.Token(v), nil
}
