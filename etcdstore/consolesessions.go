package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
)

// The review console's sign-in sessions, kept in etcd so that every
// replica sees the same ones: a reviewer whose requests a load balancer
// spreads over replicas stays signed in, and a sign-out on one replica
// ends the session on all of them at once.
//
//	console/s/<id>   one session: an opaque value the console sealed,
//	                 attached to an etcd lease of the session's idle
//	                 timeout
//
// The console names a session by the hex SHA-256 of the secret its cookie
// holds and stores it sealed under a key only that secret gives (package
// internal/run/console), so this package keeps bytes it cannot read, under
// names that sign nobody in: a copy of etcd reveals no bearer token and
// no cookie. Idle expiry is the lease's (etcd decides it, as for workers'
// sessions); the console refreshes the lease as the session is used and
// checks its maximum age itself.

// ConsoleSessions keeps the review console's sessions in the store's etcd,
// under the store's prefix. Safe for concurrent use.
type ConsoleSessions struct{ s *Store }

// ConsoleSessions returns the store's keeper of console sessions.
func (s *Store) ConsoleSessions() *ConsoleSessions { return &ConsoleSessions{s: s} }

func (k keys) consoleSessions() string         { return k.prefix + "console/s/" }
func (k keys) consoleSession(id string) string { return k.consoleSessions() + id }

// consoleSessionID reports whether id is what the console names sessions
// with: 64 lowercase hex digits. Anything else never becomes a key.
func consoleSessionID(id string) error {
	if len(id) != 64 {
		return fmt.Errorf("etcdstore: console session id of %d characters, want 64 hex digits", len(id))
	}
	for i := range len(id) {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("etcdstore: console session id holds %q, want 64 lowercase hex digits", c)
		}
	}
	return nil
}

// Create stores value as the session id, on a new etcd lease of ttl
// (rounded up to whole seconds): without a Refresh within ttl, etcd
// deletes it. An id already present is refused (ids are random; a clash
// is a caller's bug, and must not replace another browser's session).
func (c *ConsoleSessions) Create(ctx context.Context, id string, value []byte, ttl time.Duration) error {
	if err := consoleSessionID(id); err != nil {
		return err
	}
	if _, err := c.s.floor.admit(); err != nil {
		return err // etcd went back: grant it no lease
	}
	gctx, cancel := context.WithTimeout(ctx, c.s.cfg.RequestTimeout)
	defer cancel()
	grant, err := c.s.leases.Grant(gctx, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return fmt.Errorf("etcdstore: console session: %w", unavailable(err))
	}
	k := c.s.keys.consoleSession(id)
	resp, err := c.s.kv.Txn(gctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(value), clientv3.WithLease(grant.ID))).
		Commit()
	if err != nil || !resp.Succeeded {
		// No key holds the lease (or its write is unknown): revoking it
		// leaves nothing behind. If the write did land, it goes with it,
		// and the caller, told it failed, never hands out the id.
		c.revoke(grant.ID)
		if err != nil {
			return fmt.Errorf("etcdstore: console session: %w", unavailable(err))
		}
		return errors.New("etcdstore: console session: id already taken")
	}
	return nil
}

// Get returns the value of session id, nil when there is none (never
// created, signed out, or idle past its lease). Linearizable: a session
// ended on another replica is gone here too.
func (c *ConsoleSessions) Get(ctx context.Context, id string) ([]byte, error) {
	if err := consoleSessionID(id); err != nil {
		return nil, err
	}
	gctx, cancel := context.WithTimeout(ctx, c.s.cfg.RequestTimeout)
	defer cancel()
	resp, err := c.s.kv.Get(gctx, c.s.keys.consoleSession(id))
	if err != nil {
		return nil, fmt.Errorf("etcdstore: console session: %w", unavailable(err))
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0].Value, nil
}

// Put replaces the value of session id while it exists, keeping its lease
// (and so its expiry); ok is false when it ended, and then nothing is
// written: a session ended elsewhere is never brought back.
func (c *ConsoleSessions) Put(ctx context.Context, id string, value []byte) (ok bool, err error) {
	if err := consoleSessionID(id); err != nil {
		return false, err
	}
	pctx, cancel := context.WithTimeout(ctx, c.s.cfg.RequestTimeout)
	defer cancel()
	k := c.s.keys.consoleSession(id)
	resp, err := c.s.kv.Txn(pctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0)).
		Then(clientv3.OpPut(k, string(value), clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return false, fmt.Errorf("etcdstore: console session: %w", unavailable(err))
	}
	return resp.Succeeded, nil
}

// Refresh restarts session id's lease at its full ttl and replaces its
// value, as Put does; ok is false when the session ended.
func (c *ConsoleSessions) Refresh(ctx context.Context, id string, value []byte) (ok bool, err error) {
	if err := consoleSessionID(id); err != nil {
		return false, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.s.cfg.RequestTimeout)
	defer cancel()
	k := c.s.keys.consoleSession(id)
	got, err := c.s.kv.Get(rctx, k)
	if err != nil {
		return false, fmt.Errorf("etcdstore: console session: %w", unavailable(err))
	}
	if len(got.Kvs) == 0 || got.Kvs[0].Lease == 0 {
		return false, nil
	}
	kv := got.Kvs[0]
	if _, err := c.s.leases.KeepAliveOnce(rctx, clientv3.LeaseID(kv.Lease)); err != nil {
		err = unavailable(err)
		if errors.Is(err, intent.ErrSessionNotFound) {
			return false, nil // lapsed since the read
		}
		return false, fmt.Errorf("etcdstore: console session: %w", err)
	}
	// The same incarnation only: one deleted and created anew since the
	// read (which a random id never is) keeps its own value.
	resp, err := c.s.kv.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision)).
		Then(clientv3.OpPut(k, string(value), clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return false, fmt.Errorf("etcdstore: console session: %w", unavailable(err))
	}
	return resp.Succeeded, nil
}

// Delete ends session id on every replica, and revokes its lease so that
// none lingers in etcd until its ttl. Ending a session that is gone is
// no error.
func (c *ConsoleSessions) Delete(ctx context.Context, id string) error {
	if err := consoleSessionID(id); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, c.s.cfg.RequestTimeout)
	defer cancel()
	resp, err := c.s.kv.Delete(dctx, c.s.keys.consoleSession(id), clientv3.WithPrevKV())
	if err != nil {
		return fmt.Errorf("etcdstore: console session: %w", unavailable(err))
	}
	if len(resp.PrevKvs) > 0 && resp.PrevKvs[0].Lease != 0 {
		c.revoke(clientv3.LeaseID(resp.PrevKvs[0].Lease))
	}
	return nil
}

// Count returns how many sessions exist, across replicas: the console
// refuses new sign-ins past its bound.
func (c *ConsoleSessions) Count(ctx context.Context) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, c.s.cfg.RequestTimeout)
	defer cancel()
	resp, err := c.s.kv.Get(cctx, c.s.keys.consoleSessions(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("etcdstore: console session: %w", unavailable(err))
	}
	return resp.Count, nil
}

// revoke revokes a lease no key needs any more, at best: one left behind
// expires by itself at its ttl.
func (c *ConsoleSessions) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), c.s.cfg.RequestTimeout)
	defer cancel()
	_, _ = c.s.leases.Revoke(ctx, id)
}
