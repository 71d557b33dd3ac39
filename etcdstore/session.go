package etcdstore

import (
	"context"
	"errors"
	"math"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// OpenSession starts a worker session backed by one etcd lease of the given
// TTL (rounded up to whole seconds, as etcd leases are). Every intent the
// worker acquires under it lives as long as the session.
func (s *Store) OpenSession(ctx context.Context, tenant, worker string, ttl time.Duration) (*intent.Session, error) {
	if _, err := s.floor.admit(); err != nil {
		return nil, err // etcd went back: grant it no lease at all
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OperationTimeout)
	defer cancel()
	secs := int64(math.Ceil(ttl.Seconds()))
	gctx, gcancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	grant, err := s.leases.Grant(gctx, secs)
	gcancel()
	if err != nil {
		// A grant that committed unseen only leaks a lease that expires
		// on its own after ttl.
		return nil, unavailable(err)
	}
	id := sessionID(grant.ID)
	rec := sessionRecord{Worker: worker, TTL: time.Duration(grant.TTL) * time.Second}
	val, err := encodeSession(rec)
	if err != nil {
		return nil, err
	}
	k := s.keys.session(tenant, id)
	for attempt := 0; ; attempt++ {
		// Create-if-absent, so that a retry after an ambiguous commit
		// finds the first write and its create revision.
		pctx, pcancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		resp, err := s.kv.Txn(pctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, string(val), clientv3.WithLease(grant.ID)),
				clientv3.OpPut(s.keys.openSession(tenant, id), "", clientv3.WithLease(grant.ID))).
			Else(clientv3.OpGet(k)).
			Commit()
		pcancel()
		if err != nil {
			// Refused: the lease lapsed while opening, or the store is
			// full (a session key that did land lapses with its lease).
			// Else sent again: it reads back what landed.
			if werr := s.again(ctx, attempt, classify(err, false)); werr != nil {
				return nil, werr
			}
			continue
		}
		rev := resp.Header.Revision
		if !resp.Succeeded {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue // lapsed between compare and read: try again
			}
			rev = kvs[0].CreateRevision
		}
		sess := session{tenant: tenant, id: id, rev: rev, lease: grant.ID, rec: rec}
		s.sessions.Add(id, sess)
		return &intent.Session{Tenant: tenant, ID: id, Worker: worker, TTL: rec.TTL}, nil
	}
}

// session returns the session id of tenant, from memory or etcd. A session
// of another tenant is reported as not found.
func (s *Store) session(ctx context.Context, tenant, id string) (session, error) {
	if sess, ok := s.sessions.Get(id); ok {
		if sess.tenant != tenant {
			return session{}, intent.ErrSessionNotFound
		}
		return sess, nil
	}
	lease, ok := parseSessionID(id)
	if !ok {
		return session{}, intent.ErrSessionNotFound
	}
	kv, err := s.getSession(ctx, tenant, id)
	if err != nil {
		return session{}, unavailable(err)
	}
	if kv == nil {
		return session{}, intent.ErrSessionNotFound
	}
	rec, err := decodeSession(kv.Value)
	if err != nil {
		return session{}, err
	}
	sess := session{tenant: tenant, id: id, rev: kv.CreateRevision, lease: lease, rec: rec}
	s.sessions.Add(id, sess)
	return sess, nil
}

// CloseSession ends a session at once; every intent it still holds reads as
// UNKNOWN from then on.
func (s *Store) CloseSession(ctx context.Context, tenant, id string) error {
	sess, err := s.session(ctx, tenant, id)
	if err != nil {
		return err
	}
	before, err := s.floor.admit()
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.leases.Revoke(rctx, sess.lease)
	if err := unavailable(err); err != nil && !errors.Is(err, intent.ErrSessionNotFound) {
		return err
	}
	s.sessions.Remove(id)
	if err == nil {
		return s.confirmFloor(ctx, before, (*pb.LeaseRevokeResponse)(resp).GetHeader())
	}
	return nil // its lease was gone already
}

// Heartbeat keeps a session alive and returns its remaining TTL. Leases
// named in held are checked: one under a superseded token fails the call
// with a *intent.StaleTokenError (after the session was kept alive) and is
// recorded in the intent's history as evidence.
func (s *Store) Heartbeat(ctx context.Context, tenant, id string, held []intent.HeldLease) (time.Duration, error) {
	sess, err := s.session(ctx, tenant, id)
	if err != nil {
		return 0, err
	}
	before, err := s.floor.admit()
	if err != nil {
		return 0, err
	}
	kctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	ka, err := s.leases.KeepAliveOnce(kctx, sess.lease)
	cancel()
	if err := unavailable(err); err != nil {
		if errors.Is(err, intent.ErrSessionNotFound) {
			s.sessions.Remove(id)
			return 0, intent.ErrSessionNotFound
		}
		return 0, err
	}
	// A restored etcd restores its leases too: a keep-alive it answers
	// must not tell the worker its leases are fine.
	if err := s.confirmFloor(ctx, before, ka.ResponseHeader); err != nil {
		return 0, err
	}
	ttl := time.Duration(ka.TTL) * time.Second
	if len(held) == 0 {
		return ttl, nil
	}
	views, err := s.heldViews(ctx, tenant, held)
	if err != nil {
		return ttl, err
	}
	for i, h := range held {
		call := machine.HeldCall{Held: h, Index: i, Session: sess.machine(), Principal: intent.PrincipalFrom(ctx)}
		decide := func(v *machine.View) machine.Decision { return machine.CheckHeld(v, call, s.cfg.Now()) }
		if d := decide(views[i]); !d.Writes() && d.Err == nil && d.NeedSession == "" {
			continue // the current token: the common case, decided on the one read
		}
		// Rare: a superseded (or never issued) token. Decide it on its own
		// record, with its holder, keeping the evidence.
		if _, err := s.transition(ctx, tenant, h.Key, nil, s.loadWithHolder(tenant, h.Key), decide); err != nil {
			return ttl, err
		}
	}
	return ttl, nil
}

// heldViews reads the records of every named intent in one transaction, so
// that a heartbeat costs one read however many leases the worker holds.
//
// Most named records are in the cache, unchanged since this replica wrote
// or read them. For those, the transaction only compares their mod
// revision with the cached one; when every compare holds, etcd sends back
// just the records that were not cached, and the cached ones are the
// current versions (a mod revision names one version of one key), as
// fresh as a read: no record is sent and decoded for nothing. When any
// compare fails (another replica changed a record, or it was removed), the
// else branch reads every named record, as without a cache.
func (s *Store) heldViews(ctx context.Context, tenant string, held []intent.HeldLease) ([]*machine.View, error) {
	out := make([]*machine.View, len(held))
	all := make([]clientv3.Op, len(held))
	var cmps []clientv3.Cmp
	var then []clientv3.Op
	var thenOf []int // the index in held of each of then's reads
	for i, h := range held {
		k := s.keys.intent(tenant, h.Key)
		all[i] = clientv3.OpGet(k)
		if c, ok := s.records.Get(cacheKey(tenant, h.Key)); ok {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", c.rev))
			out[i] = &machine.View{Key: h.Key, Rec: c.rec, Rev: c.rev, Fresh: true}
			continue
		}
		then, thenOf = append(then, all[i]), append(thenOf, i)
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	txn := s.kv.Txn(rctx).If(cmps...).Then(then...)
	if len(cmps) > 0 {
		txn = txn.Else(all...)
	}
	resp, err := txn.Commit()
	if err != nil {
		return nil, unavailable(err)
	}
	read := thenOf
	if !resp.Succeeded {
		read = make([]int, len(held))
		for i := range read {
			read[i] = i
		}
	}
	for j, r := range resp.Responses {
		i := read[j]
		v := &machine.View{Key: held[i].Key, Fresh: true}
		if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
			if v.Rec, err = decodeRecord(tenant, held[i].Key, kvs[0].Value, kvs[0].ModRevision); err != nil {
				return nil, err
			}
			v.Rev = kvs[0].ModRevision
			s.remember(tenant, held[i].Key, v.Rec, v.Rev)
		}
		out[i] = v
	}
	return out, nil
}
