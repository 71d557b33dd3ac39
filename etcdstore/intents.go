package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// Register stores an approved intent in state PENDING. It is idempotent:
// the same key with the same fingerprint returns the stored intent with
// created false; another fingerprint is a *intent.FingerprintMismatchError.
//
// A key whose record was removed after its retention is EXPIRED
// (*intent.ExpiredError): it needs a new approval under a new key. A
// ParentKey must name an existing intent of the same tenant.
func (s *Store) Register(ctx context.Context, reg intent.Registration) (in *intent.Intent, created bool, err error) {
	fp := intent.Fingerprint(reg.Params)
	if err := s.checkRetention("", &reg); err != nil {
		return nil, false, err
	}
	load := func(ctx context.Context) (*machine.View, error) {
		return s.read(ctx, reg.Tenant, reg.Key, parentOf(&reg))
	}
	call := machine.RegisterCall{Reg: &reg, Fingerprint: fp, Principal: intent.PrincipalFrom(ctx)}
	ctx, done := s.archiveScope(ctx)
	a, err := s.transition(ctx, reg.Tenant, reg.Key, nil, load, func(v *machine.View) machine.Decision {
		return s.rules.Register(v, call, s.cfg.Now())
	})
	if err = done(err); err != nil {
		return nil, false, err
	}
	return a.Intent, a.Created, nil
}

// checkRetention checks the one bound of a registration (under field
// prefix) that is this installation's rather than the API's: its retention
// against Config.MaxRetention. Everything else in a registration the
// server has checked (server/validate.go): the store takes domain values
// as given.
func (s *Store) checkRetention(prefix string, reg *intent.Registration) error {
	if d := reg.Retention; d < 0 || d > s.cfg.MaxRetention {
		return intent.Invalid(prefix+"retention", "%v is outside [0, %v]", d, s.cfg.MaxRetention)
	}
	return nil
}

// parentOf lists the other intent a registration's decision reads: its
// parent.
func parentOf(reg *intent.Registration) []string {
	if reg == nil || reg.ParentKey == "" {
		return nil
	}
	return []string{reg.ParentKey}
}

// Acquire decides what the caller of session req.SessionID may do with an
// intent; see intent.Outcome. Only a PENDING intent yields EXECUTE; an
// intent whose last attempt is unknown (reported, or its holder's session
// lapsed) yields RECONCILE with a new, higher token. A retry with the same
// session and request id returns the lease already issued.
func (s *Store) Acquire(ctx context.Context, req intent.AcquireRequest) (*intent.Acquisition, error) {
	fp := req.ExpectedFingerprint
	if req.Register != nil {
		fp = intent.Fingerprint(req.Register.Params)
		if err := s.checkRetention("register.", req.Register); err != nil {
			return nil, err
		}
	}
	entry, known := s.replayEntry(req.Tenant, req.Key)
	// A final record is replayed from memory, unless etcd went back: then
	// nothing is answered, not even from memory.
	// A compact entry answers with its record's head and its memo.
	if v := entry.replayView(req.Tenant, req.Key); v != nil && s.floor.refused.Load() == nil {
		if d, ok := machine.ReplayFinal(v, fp, s.cfg.Now()); ok {
			if d.Err != nil {
				return nil, d.Err
			}
			s.stats.replays.Add(1)
			out := acquisition(d.Answer)
			out.Memo = entry.memo
			if !entry.replayed {
				s.replayedFrom(req.Tenant, req.Key, entry.memo)
			} else {
				s.settle(req.Tenant, req.Key, entry)
			}
			return out, nil
		}
	}
	if (!known || entry.rec == nil) && s.floor.refused.Load() == nil && s.hints().seen(s.cfg.Prefix, req.Tenant, req.Key) {
		// Final once, and no longer in memory: replayed from one read of
		// the record, where registering it would be a write that fails.
		if out, ok, err := s.replayRead(ctx, req.Tenant, req.Key, fp); ok {
			return out, err
		}
	}
	sess, err := s.session(ctx, req.Tenant, req.SessionID)
	if err != nil {
		return nil, err
	}
	ctx, done := s.archiveScope(ctx)
	var start *machine.View
	if req.Register != nil && !known {
		// Optimistically assume a new intent: register and acquire in one
		// write, no read, when the store can tell that the key has no
		// tombstone without reading (certifiedSpot; else it reads first).
		// The guards send us to a fresh read otherwise. With an archive,
		// the archive is asked first, after the spot was taken: a move
		// before the spot's revision wrote the archive before, one after
		// it rewrote the chunk and fails the guard (see the package doc,
		// "Archive").
		if spot, ok := s.certifiedSpot(req.Tenant, req.Key); ok {
			if held, err := s.archiveHolds(ctx, req.Tenant, req.Key, spot.Rev); err != nil {
				return nil, done(err)
			} else if !held {
				start = &machine.View{Key: req.Key, Sessions: map[string]int64{sess.id: sess.rev}, Spots: map[string]machine.TombstoneSpot{req.Key: spot}}
			}
		}
	}
	load := func(ctx context.Context) (*machine.View, error) {
		return s.readWithHolder(ctx, req.Tenant, req.Key, parentOf(req.Register), sess.id)
	}
	call := machine.AcquireCall{Req: &req, Session: sess.machine(), Fingerprint: fp, Principal: intent.PrincipalFrom(ctx)}
	a, err := s.transition(ctx, req.Tenant, req.Key, start, load, func(v *machine.View) machine.Decision {
		return s.rules.Acquire(v, call, s.cfg.Now())
	})
	err = done(err)
	if errors.Is(err, intent.ErrSessionNotFound) {
		s.sessions.Remove(sess.id) // etcd says it is gone
	}
	if err != nil {
		return nil, err
	}
	out := acquisition(a)
	if out.Outcome == intent.OutcomeInProgress {
		// Tell the waiting caller how long the holder has; the caller's
		// own lease lives as long as its heartbeats, which it knows best,
		// so EXECUTE and RECONCILE spend no round trip on this.
		out.Lease.ExpiresAt = s.sessionExpiry(ctx, out.Lease.SessionID)
	}
	return out, nil
}

// acquisition is Acquire's answer.
func acquisition(a machine.Answer) *intent.Acquisition {
	out := &intent.Acquisition{Outcome: a.Outcome, Intent: a.Intent, Fresh: a.Fresh}
	if a.Lease {
		out.Lease = a.Intent.Lease
	}
	return out
}

// sessionExpiry estimates when a session lapses, from the TTL etcd reports
// left on its lease. Best effort: zero when etcd does not say.
func (s *Store) sessionExpiry(ctx context.Context, id string) time.Time {
	lease, ok := parseSessionID(id)
	if !ok {
		return time.Time{}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.leases.TimeToLive(ctx, lease)
	if err != nil || resp.TTL < 0 {
		return time.Time{}
	}
	return s.cfg.Now().Add(time.Duration(resp.TTL) * time.Second)
}

// Report applies a fenced report (Complete, MarkUnknown, Release, Fail).
// It is accepted only under the intent's current token, while the intent is
// IN_PROGRESS or UNKNOWN (a report after the holder's session lapsed, with
// no newer token issued, is the best evidence there is). Under a superseded
// token it changes nothing, is recorded as evidence, and returns a
// *intent.StaleTokenError; under the current token of an intent that waits
// for review it is recorded as evidence too, and refused. A retried report
// that was already applied returns Replayed; Complete retried with another
// result is intent.ErrResultMismatch.
//
// Children of a Complete are registered in the same transaction (the
// outbox): they exist if and only if the completion was recorded. They
// come as the server made them: registrations of the report's tenant, with
// its key as their parent, each key once (machine.ReportCall).
func (s *Store) Report(ctx context.Context, r intent.Report) (*intent.ReportOutcome, error) {
	others := make([]string, len(r.Children)) // the children's keys, read with the record
	for i := range r.Children {
		if err := s.checkRetention(fmt.Sprintf("children[%d].", i), &r.Children[i]); err != nil {
			return nil, err
		}
		others[i] = r.Children[i].Key
	}
	var start *machine.View
	if c, ok := s.cachedEntry(r.Tenant, r.Key); ok && len(r.Children) == 0 {
		start = c.view(r.Key) // optimistic: the guards send us to a fresh read if it changed
	}
	load := func(ctx context.Context) (*machine.View, error) {
		v, err := s.read(ctx, r.Tenant, r.Key, others)
		if err == nil {
			// Children etcd does not hold may be archived: the outbox
			// leaves an existing child alone and refuses a tombstoned one.
			err = s.othersFromArchive(ctx, r.Tenant, v, others)
		}
		return v, err
	}
	call := machine.ReportCall{Report: &r, Principal: intent.PrincipalFrom(ctx)}
	// A late report's evidence is not written to an archived record.
	ctx, decide, done := s.archivable(ctx, func(v *machine.View) machine.Decision { return s.rules.Report(v, call, s.cfg.Now()) })
	a, err := s.transition(ctx, r.Tenant, r.Key, start, load, decide)
	if err = done(err); err != nil {
		return nil, err
	}
	return &intent.ReportOutcome{Intent: a.Intent, Replayed: a.Replayed}, nil
}

// maxChildren bounds the children Get lists.
const maxChildren = 100

// Get reads an intent linearizably, history and children included.
func (s *Store) Get(ctx context.Context, tenant, key string) (*intent.Intent, error) {
	v, err := s.readWithHolder(ctx, tenant, key, nil)
	if errors.Is(err, errCorrupt) || errors.Is(err, intent.ErrArchiveUnavailable) {
		return nil, err
	}
	if err != nil {
		return nil, unavailable(err)
	}
	if v.Rec == nil {
		return nil, v.Missing()
	}
	live := v.HolderAlive()
	in := v.Rec.ToIntentWithHistory(v.Rev, machine.Holder(live))
	if live {
		in.Lease.ExpiresAt = s.sessionExpiry(ctx, in.Lease.SessionID)
	}
	if in.Children, err = s.children(ctx, tenant, key, v.Rec.CreatedAt); err != nil {
		return nil, err
	}
	return in, nil
}

// children lists the first maxChildren children of an intent registered
// at created with their states, oldest first.
func (s *Store) children(ctx context.Context, tenant, key string, created time.Time) ([]intent.Child, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	// The parent index in both layouts, merged by position.
	ranges := inBothLayouts(func(l int) string { return s.keys.parentIndexIn(l, tenant, key) })
	entries, _, _, err := s.scanIndex(rctx, ranges, "", 0, maxChildren)
	if err != nil {
		return nil, err
	}
	var moved []archivedChild
	if s.archive.on() && s.mayHaveArchivedChildren(created) {
		if moved, err = s.archivedChildren(ctx, tenant, key); err != nil {
			return nil, err
		}
	}
	if len(entries) == 0 && len(moved) == 0 {
		return nil, nil
	}
	ops := make([]clientv3.Op, len(entries))
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.key
		ops[i] = clientv3.OpGet(s.keys.intent(tenant, keys[i]))
	}
	resp, err := s.kv.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		return nil, unavailable(err)
	}
	out := make([]archivedChild, 0, len(ops)+len(moved))
	for i, r := range resp.Responses {
		st := intent.State(0)
		if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
			if rec, err := decodeRecord(tenant, keys[i], kvs[0].Value, kvs[0].ModRevision); err == nil {
				st = rec.State
			}
		}
		if st != 0 {
			out = append(out, archivedChild{order: entries[i].order, child: intent.Child{Key: keys[i], State: st}})
		}
	}
	return mergeChildren(out, moved, maxChildren), nil
}
