package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// Register stores an approved intent in state PENDING. It is idempotent:
// the same key with the same fingerprint returns the stored intent with
// created false; another fingerprint is a *intent.FingerprintMismatchError.
func (s *Store) Register(ctx context.Context, reg intent.Registration) (in *intent.Intent, created bool, err error) {
	fp := intent.Fingerprint(reg.Params)
	load := func(ctx context.Context) (*view, error) { return s.read(ctx, reg.Tenant, reg.Key) }
	err = s.transition(ctx, reg.Tenant, reg.Key, nil, load, func(v *view) (*change, error) {
		in, created = nil, false
		if v.rec != nil {
			if v.rec.Fingerprint != fp {
				return nil, &intent.FingerprintMismatchError{Key: reg.Key, Stored: v.rec.Fingerprint, Given: fp}
			}
			in = v.rec.toIntent(v.rev(), false, false)
			return nil, nil
		}
		rec := newRecord(&reg, fp, s.cfg.Now())
		return &change{next: rec, done: func(rev int64) {
			in, created = rec.toIntent(rev, false, false), true
		}}, nil
	})
	return in, created, err
}

func newRecord(reg *intent.Registration, fp string, now time.Time) *record {
	return &record{
		Tenant:        reg.Tenant,
		Key:           reg.Key,
		State:         intent.StatePending,
		Params:        reg.Params,
		ParamsVersion: reg.ParamsVersion,
		Fingerprint:   fp,
		Labels:        reg.Labels,
		ParentKey:     reg.ParentKey,
		History:       []intent.Event{{Time: now, Kind: intent.EventRegistered, Accepted: true}},
		CreatedAt:     now,
		UpdatedAt:     now,
	}
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
	}
	if c, ok := s.finalFromCache(req.Tenant, req.Key); ok {
		if fp != "" && fp != c.rec.Fingerprint {
			return nil, &intent.FingerprintMismatchError{Key: req.Key, Stored: c.rec.Fingerprint, Given: fp}
		}
		return replay(c.rec, c.rev), nil
	}
	sess, err := s.session(ctx, req.Tenant, req.SessionID)
	if err != nil {
		return nil, err
	}
	sessKey := s.keys.session(req.Tenant, sess.id)
	sessAlive := clientv3.Compare(clientv3.CreateRevision(sessKey), "=", sess.rev)

	var start *view
	if _, known := s.records.Get(cacheKey(req.Tenant, req.Key)); req.Register != nil && !known {
		// Optimistically assume a new intent: register and acquire in one
		// write, no read. The compares send us to a fresh read otherwise.
		start = &view{sessions: map[string]*mvccpb.KeyValue{sess.id: {CreateRevision: sess.rev}}}
	}
	load := func(ctx context.Context) (*view, error) {
		return s.readWithHolder(ctx, req.Tenant, req.Key, sess.id)
	}
	var out *intent.Acquisition
	err = s.transition(ctx, req.Tenant, req.Key, start, load, func(v *view) (*change, error) {
		out = nil
		if !v.alive(sess.id, sess.rev) {
			if v.fresh {
				s.sessions.Remove(sess.id)
			}
			return nil, intent.ErrSessionNotFound
		}
		now := s.cfg.Now()
		var next *record
		var cmps []clientv3.Cmp
		switch {
		case v.rec == nil && req.Register == nil:
			return nil, intent.ErrNotFound
		case v.rec == nil:
			next = newRecord(req.Register, fp, now)
			grant(next, intent.ModeExecute, sess, req.RequestID, now)
		case fp != "" && fp != v.rec.Fingerprint:
			return nil, &intent.FingerprintMismatchError{Key: req.Key, Stored: v.rec.Fingerprint, Given: fp}
		case v.rec.State == intent.StateInProgress && v.holderAlive():
			l := v.rec.Lease
			if l.SessionID == sess.id && l.RequestID == req.RequestID {
				// A retry of the call that issued this lease, or our
				// read-back after its commit was ambiguous.
				out = &intent.Acquisition{Outcome: modeOutcome(l.Mode), Intent: v.rec.toIntent(v.rev(), true, false), Lease: l.toLease(true)}
				return nil, nil
			}
			out = &intent.Acquisition{Outcome: intent.OutcomeInProgress, Intent: v.rec.toIntent(v.rev(), true, false), Lease: l.toLease(true)}
			return nil, nil
		case v.rec.State == intent.StateInProgress:
			// The holder's session lapsed: the outcome of its attempt is
			// unknown. Reconcile under a new token, provided the holder is
			// still gone when etcd applies the write.
			l := v.rec.Lease
			next = v.rec.clone()
			next.appendEvent(intent.Event{Time: now, Kind: intent.EventLeaseLapsed, Token: l.Token, SessionID: l.SessionID, Worker: l.Worker, Accepted: true})
			grant(next, intent.ModeReconcile, sess, req.RequestID, now)
			holderKey := s.keys.session(req.Tenant, l.SessionID)
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(holderKey), "!=", l.SessionRev))
		case v.rec.State == intent.StateUnknown:
			next = v.rec.clone()
			grant(next, intent.ModeReconcile, sess, req.RequestID, now)
		case v.rec.State == intent.StatePending:
			next = v.rec.clone()
			grant(next, intent.ModeExecute, sess, req.RequestID, now)
		default:
			out = replay(v.rec, v.rev())
			return nil, nil
		}
		return &change{next: next, cmps: append(cmps, sessAlive), done: func(rev int64) {
			l := next.Lease.toLease(true)
			l.Token = fencing.Token(rev)
			in := next.toIntent(rev, true, false)
			in.Lease = l
			out = &intent.Acquisition{Outcome: modeOutcome(l.Mode), Intent: in, Lease: l, Fresh: true}
		}}, nil
	})
	if err != nil {
		return nil, err
	}
	if out.Outcome == intent.OutcomeInProgress {
		// Tell the waiting caller how long the holder has; the caller's
		// own lease lives as long as its heartbeats, which it knows best,
		// so EXECUTE and RECONCILE spend no round trip on this.
		out.Lease.ExpiresAt = s.sessionExpiry(ctx, out.Lease.SessionID)
		out.Intent.Lease = out.Lease
	}
	return out, nil
}

// grant issues a lease on next to sess. The token is left 0: it becomes the
// revision of the write (see decodeRecord).
func grant(next *record, mode intent.Mode, sess session, requestID string, now time.Time) {
	next.State = intent.StateInProgress
	next.Lease = &leaseRecord{
		Mode:       mode,
		SessionID:  sess.id,
		SessionRev: sess.rev,
		Worker:     sess.rec.Worker,
		RequestID:  requestID,
		AcquiredAt: now,
	}
	next.UpdatedAt = now
	next.appendEvent(intent.Event{Time: now, Kind: intent.EventAcquired, Mode: mode, SessionID: sess.id, Worker: sess.rec.Worker, Accepted: true})
}

func modeOutcome(m intent.Mode) intent.Outcome {
	if m == intent.ModeReconcile {
		return intent.OutcomeReconcile
	}
	return intent.OutcomeExecute
}

// replay answers Acquire for an intent no one may act on now.
func replay(rec *record, rev int64) *intent.Acquisition {
	o := intent.OutcomeNeedsReview
	switch rec.State {
	case intent.StateCompleted:
		o = intent.OutcomeCompleted
	case intent.StateFailed:
		o = intent.OutcomeFailed
	case intent.StateCancelled:
		o = intent.OutcomeCancelled
	}
	return &intent.Acquisition{Outcome: o, Intent: rec.toIntent(rev, false, false)}
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
	return time.Now().Add(time.Duration(resp.TTL) * time.Second)
}

// currentToken is the newest token issued for the intent, 0 if none.
func currentToken(rec *record) fencing.Token {
	if rec.Lease == nil {
		return 0
	}
	return rec.Lease.Token
}

func reportEvent(k intent.ReportKind) intent.EventKind {
	switch k {
	case intent.ReportComplete:
		return intent.EventCompleted
	case intent.ReportMarkUnknown:
		return intent.EventMarkedUnknown
	case intent.ReportRelease:
		return intent.EventReleased
	default:
		return intent.EventFailed
	}
}

// Report applies a fenced report (Complete, MarkUnknown, Release, Fail).
// It is accepted only under the intent's current token, while the intent is
// IN_PROGRESS or UNKNOWN (a report after the holder's session lapsed, with
// no newer token issued, is the best evidence there is). Under a superseded
// token it changes nothing, is recorded as evidence, and returns a
// *intent.StaleTokenError. A retried report that was already applied
// returns Replayed; Complete retried with another result is
// intent.ErrResultMismatch.
func (s *Store) Report(ctx context.Context, r intent.Report) (*intent.ReportOutcome, error) {
	var start *view
	if c, ok := s.records.Get(cacheKey(r.Tenant, r.Key)); ok {
		start = &view{kv: &mvccpb.KeyValue{ModRevision: c.rev}, rec: c.rec}
	}
	load := func(ctx context.Context) (*view, error) { return s.read(ctx, r.Tenant, r.Key) }
	kind := reportEvent(r.Kind)
	var out *intent.ReportOutcome
	var stale *intent.StaleTokenError
	var holder *leaseRecord // set when a replay finds the intent held again
	err := s.transition(ctx, r.Tenant, r.Key, start, load, func(v *view) (*change, error) {
		out, stale, holder = nil, nil, nil
		if v.rec == nil {
			return nil, intent.ErrNotFound
		}
		rec := v.rec
		cur := currentToken(rec)
		if rec.hasEvent(kind, r.Token, true) {
			// Already applied: a retry, or our read-back after an
			// ambiguous commit.
			if r.Kind == intent.ReportComplete && !sameResult(rec.Result, r.Result) {
				return nil, fmt.Errorf("%w: %q was completed under token %s with another result", intent.ErrResultMismatch, r.Key, r.Token)
			}
			out = &intent.ReportOutcome{Intent: rec.toIntent(v.rev(), true, false), Replayed: true}
			if rec.State == intent.StateInProgress {
				holder = rec.Lease
			}
			return nil, nil
		}
		now := s.cfg.Now()
		ev := intent.Event{Time: now, Kind: kind, Token: r.Token, Result: r.Result, Failure: r.Failure, Reason: r.Reason}
		switch {
		case r.Token < cur:
			stale = &intent.StaleTokenError{Key: r.Key, Token: r.Token, Current: cur}
			if rec.hasEvent(kind, r.Token, false) {
				return nil, nil // this evidence is already kept
			}
			next := rec.clone()
			next.appendEvent(ev)
			return &change{next: next}, nil
		case r.Token > cur:
			return nil, intent.Invalid("token", "token %s was never issued for %q", r.Token, r.Key)
		case rec.State == intent.StateCompleted && r.Kind == intent.ReportComplete:
			return nil, fmt.Errorf("%w: %q is already completed", intent.ErrResultMismatch, r.Key)
		case rec.State != intent.StateInProgress && rec.State != intent.StateUnknown:
			return nil, &intent.TransitionError{Key: r.Key, State: rec.State, Call: r.Kind.String()}
		}
		next := rec.clone()
		ev.Accepted = true
		ev.SessionID, ev.Worker = rec.Lease.SessionID, rec.Lease.Worker
		next.appendEvent(ev)
		next.UpdatedAt = now
		switch r.Kind {
		case intent.ReportComplete:
			next.State, next.Result, next.CompletedAt = intent.StateCompleted, r.Result, now
		case intent.ReportFail:
			next.State, next.Failure, next.CompletedAt = intent.StateFailed, r.Failure, now
		case intent.ReportMarkUnknown:
			next.State = intent.StateUnknown
		case intent.ReportRelease:
			next.State = intent.StatePending
		}
		return &change{next: next, done: func(rev int64) {
			out = &intent.ReportOutcome{Intent: next.toIntent(rev, false, false)}
		}}, nil
	})
	if err != nil {
		return nil, err
	}
	if stale != nil {
		return nil, stale
	}
	if out.Replayed && holder != nil {
		// The intent moved on since the report was applied (a reconciler
		// holds it now): tell whether that holder is alive, as Get does.
		kv, err := s.getSession(ctx, r.Tenant, holder.SessionID)
		if err != nil {
			return nil, unavailable(err)
		}
		if kv == nil || kv.CreateRevision != holder.SessionRev {
			out.Intent.State = intent.StateUnknown
			out.Intent.Lease.Live = false
		}
	}
	return out, nil
}

// Get reads an intent linearizably, history included.
func (s *Store) Get(ctx context.Context, tenant, key string) (*intent.Intent, error) {
	v, err := s.readWithHolder(ctx, tenant, key)
	if errors.Is(err, errCorrupt) {
		return nil, err
	}
	if err != nil {
		return nil, unavailable(err)
	}
	if v.rec == nil {
		return nil, intent.ErrNotFound
	}
	live := v.holderAlive()
	in := v.rec.toIntent(v.rev(), live, true)
	if live {
		in.Lease.ExpiresAt = s.sessionExpiry(ctx, in.Lease.SessionID)
	}
	return in, nil
}
