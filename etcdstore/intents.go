package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
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
	if err := s.checkLimits("", &reg); err != nil {
		return nil, false, err
	}
	load := func(ctx context.Context) (*view, error) {
		return s.readExtra(ctx, reg.Tenant, reg.Key, s.parentKeys(&reg))
	}
	err = s.transition(ctx, reg.Tenant, reg.Key, nil, load, func(v *view) (*change, error) {
		in, created = nil, false
		if v.rec != nil {
			if v.rec.Fingerprint != fp {
				return nil, &intent.FingerprintMismatchError{Key: reg.Key, Stored: v.rec.Fingerprint, Given: fp}
			}
			in = v.rec.toIntent(v.rev(), holderGone)
			// Our own write, read back after a lost reply, is still ours.
			first := v.rec.History[0]
			created = reg.RequestID != "" && first.Kind == intent.EventRegistered && first.RequestID == reg.RequestID
			return nil, nil
		}
		rec, cmps, err := s.newRecord(v, &reg, fp, intent.PrincipalFrom(ctx), s.cfg.Now())
		if err != nil {
			return nil, err
		}
		return &change{next: rec, cmps: cmps, done: func(committed *record, rev int64) {
			in, created = committed.toIntent(rev, holderGone), true
		}}, nil
	})
	return in, created, err
}

// checkLimits checks what the store bounds in a registration (under field
// prefix): its retention and its attempts limit.
func (s *Store) checkLimits(prefix string, reg *intent.Registration) error {
	if d := reg.Retention; d < 0 || d > s.cfg.MaxRetention {
		return intent.Invalid(prefix+"retention", "%v is outside [0, %v]", d, s.cfg.MaxRetention)
	}
	if n := reg.MaxAttempts; n < 0 || n > intent.MaxAttemptsLimit {
		return intent.Invalid(prefix+"max_attempts", "%d is outside [0, %d] (0: the server's default)", n, intent.MaxAttemptsLimit)
	}
	return nil
}

// parentKeys lists the extra key a registration's decision reads: its
// parent's record.
func (s *Store) parentKeys(reg *intent.Registration) []string {
	if reg == nil || reg.ParentKey == "" {
		return nil
	}
	return []string{s.keys.intent(reg.Tenant, reg.ParentKey)}
}

// newRecord builds the record of a registration whose key is free, and the
// compares that keep it so until the write: no tombstone appeared, the
// parent (if any) exists. A view that has not read the tombstone and the
// parent (an optimistic one) relies on those compares alone.
func (s *Store) newRecord(v *view, reg *intent.Registration, fp, principal string, now time.Time) (*record, []clientv3.Cmp, error) {
	if v.tomb != nil {
		return nil, nil, v.tomb.expired()
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.keys.tombstone(reg.Tenant, reg.Key)), "=", 0)}
	if reg.ParentKey != "" {
		pk := s.keys.intent(reg.Tenant, reg.ParentKey)
		if kv, read := v.extra[pk]; v.fresh && read && kv == nil {
			return nil, nil, intent.Invalid("parent_key", "no intent %q in this tenant", reg.ParentKey)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(pk), ">", 0))
	}
	retention := reg.Retention
	if retention == 0 {
		retention = s.cfg.DefaultRetention
	}
	maxAttempts := reg.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = s.cfg.MaxAttempts
	}
	return &record{
		Tenant:        reg.Tenant,
		Key:           reg.Key,
		State:         intent.StatePending,
		Params:        reg.Params,
		ParamsVersion: reg.ParamsVersion,
		Fingerprint:   fp,
		Labels:        reg.Labels,
		ParentKey:     reg.ParentKey,
		History:       []intent.Event{{Time: now, Kind: intent.EventRegistered, Accepted: true, Principal: principal, RequestID: reg.RequestID}},
		CreatedAt:     now,
		UpdatedAt:     now,
		Retention:     retention,
		MaxAttempts:   maxAttempts,
	}, cmps, nil
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
		if err := s.checkLimits("register.", req.Register); err != nil {
			return nil, err
		}
	}
	if c, ok := s.finalFromCache(req.Tenant, req.Key); ok {
		if fp != "" && fp != c.rec.Fingerprint {
			return nil, &intent.FingerprintMismatchError{Key: req.Key, Stored: c.rec.Fingerprint, Given: fp}
		}
		s.stats.replays.Add(1)
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
		return s.readWithHolder(ctx, req.Tenant, req.Key, s.parentKeys(req.Register), sess.id)
	}
	var out *intent.Acquisition
	who := intent.PrincipalFrom(ctx)
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
		lapse := lapseNone
		switch {
		case v.rec == nil && v.tomb != nil:
			out = &intent.Acquisition{Outcome: intent.OutcomeExpired, Intent: &intent.Intent{
				Tenant: req.Tenant, Key: req.Key, State: v.tomb.State, Fingerprint: v.tomb.Fingerprint, CompletedAt: v.tomb.CompletedAt,
			}}
			return nil, nil
		case v.rec == nil && req.Register == nil:
			return nil, &intent.NotFoundError{Key: req.Key}
		case v.rec == nil:
			var err error
			if next, cmps, err = s.newRecord(v, req.Register, fp, who, now); err != nil {
				return nil, err
			}
			grant(next, intent.ModeExecute, sess, req.RequestID, who, now)
		case fp != "" && fp != v.rec.Fingerprint:
			return nil, &intent.FingerprintMismatchError{Key: req.Key, Stored: v.rec.Fingerprint, Given: fp}
		case v.rec.State == intent.StateInProgress && v.holderAlive():
			l := v.rec.Lease
			if l.SessionID == sess.id && l.RequestID == req.RequestID {
				// A retry of the call that issued this lease, or our
				// read-back after its commit was ambiguous.
				out = &intent.Acquisition{Outcome: modeOutcome(l.Mode), Intent: v.rec.toIntent(v.rev(), holderLive), Lease: l.toLease(true)}
				return nil, nil
			}
			out = &intent.Acquisition{Outcome: intent.OutcomeInProgress, Intent: v.rec.toIntent(v.rev(), holderLive), Lease: l.toLease(true)}
			return nil, nil
		case v.rec.State == intent.StateInProgress:
			// The holder's session lapsed: the outcome of its attempt is
			// unknown. Reconcile under a new token, provided the holder is
			// still gone when etcd applies the write.
			next = v.rec.clone()
			var exhausted bool
			if cmps, exhausted = s.noteLapse(next, "", now); exhausted {
				// Too many attempts ended so: a human decides, and
				// nobody is handed the intent again.
				return &change{next: next, cmps: cmps, exhausted: true, lapse: lapseByAcquire, done: func(committed *record, rev int64) {
					out = replay(committed, rev)
				}}, nil
			}
			lapse = lapseByAcquire
			grant(next, intent.ModeReconcile, sess, req.RequestID, who, now)
		case v.rec.State == intent.StateUnknown:
			next = v.rec.clone()
			grant(next, intent.ModeReconcile, sess, req.RequestID, who, now)
		case v.rec.State == intent.StatePending:
			next = v.rec.clone()
			grant(next, intent.ModeExecute, sess, req.RequestID, who, now)
		default:
			out = replay(v.rec, v.rev())
			return nil, nil
		}
		return &change{next: next, cmps: append(cmps, sessAlive), lapse: lapse, done: func(committed *record, rev int64) {
			in := committed.toIntent(rev, holderLive)
			out = &intent.Acquisition{Outcome: modeOutcome(in.Lease.Mode), Intent: in, Lease: in.Lease, Fresh: true}
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
func grant(next *record, mode intent.Mode, sess session, requestID, principal string, now time.Time) {
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
	next.appendEvent(intent.Event{Time: now, Kind: intent.EventAcquired, Mode: mode, SessionID: sess.id, Worker: sess.rec.Worker, Accepted: true, Issued: true, Principal: principal})
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
	return &intent.Acquisition{Outcome: o, Intent: rec.toIntent(rev, holderGone)}
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
// *intent.StaleTokenError; under the current token of an intent that waits
// for review it is recorded as evidence too, and refused. A retried report
// that was already applied returns Replayed; Complete retried with another
// result is intent.ErrResultMismatch.
//
// Children of a Complete are registered in the same transaction (the
// outbox): they exist if and only if the completion was recorded.
func (s *Store) Report(ctx context.Context, r intent.Report) (*intent.ReportOutcome, error) {
	if r.Kind != intent.ReportComplete && len(r.Children) > 0 {
		return nil, intent.Invalid("children", "only Complete registers children")
	}
	children := make([]intent.Registration, len(r.Children))
	var extra []string
	for i, c := range r.Children {
		c.Tenant, c.ParentKey = r.Tenant, r.Key
		if c.Key == r.Key || slices.ContainsFunc(children[:i], func(o intent.Registration) bool { return o.Key == c.Key }) {
			return nil, intent.Invalid(fmt.Sprintf("children[%d].key", i), "%q repeats the parent's or another child's key", c.Key)
		}
		if err := s.checkLimits(fmt.Sprintf("children[%d].", i), &c); err != nil {
			return nil, err
		}
		children[i] = c
		extra = append(extra, s.keys.intent(r.Tenant, c.Key), s.keys.tombstone(r.Tenant, c.Key))
	}
	var start *view
	if c, ok := s.records.Get(cacheKey(r.Tenant, r.Key)); ok && len(children) == 0 {
		start = &view{kv: &mvccpb.KeyValue{ModRevision: c.rev}, rec: c.rec}
	}
	load := func(ctx context.Context) (*view, error) { return s.readExtra(ctx, r.Tenant, r.Key, extra) }
	kind := reportEvent(r.Kind)
	var out *intent.ReportOutcome
	var refusal error       // returned after its evidence is recorded
	var holder *leaseRecord // set when a replay finds the intent held again
	err := s.transition(ctx, r.Tenant, r.Key, start, load, func(v *view) (*change, error) {
		out, refusal, holder = nil, nil, nil
		if v.rec == nil {
			return nil, missing(v)
		}
		rec := v.rec
		cur := currentToken(rec)
		if rec.hasEvent(kind, r.Token, true) {
			// Already applied: a retry, or our read-back after an
			// ambiguous commit.
			if r.Kind == intent.ReportComplete && !sameResult(rec.Result, r.Result) {
				return nil, fmt.Errorf("%w: %q was completed under token %s with another result", intent.ErrResultMismatch, r.Key, r.Token)
			}
			out = &intent.ReportOutcome{Intent: rec.toIntent(v.rev(), holderLive), Replayed: true}
			if rec.State == intent.StateInProgress {
				holder = rec.Lease
			}
			return nil, nil
		}
		now := s.cfg.Now()
		ev := intent.Event{Time: now, Kind: kind, Token: r.Token, Failure: r.Failure, Reason: r.Reason, Principal: intent.PrincipalFrom(ctx)}
		ev.Result, ev.PayloadSHA256 = digest(r.Result)
		switch {
		case r.Token < cur:
			refusal = &intent.StaleTokenError{Key: r.Key, Token: r.Token, Current: cur, Intent: rec.toIntent(v.rev(), holderLive)}
			if rec.State == intent.StateInProgress {
				holder = rec.Lease
			}
			return s.evidence(rec, ev), nil
		case r.Token > cur:
			return nil, intent.Invalid("token", "token %s was never issued for %q", r.Token, r.Key)
		case rec.State == intent.StateNeedsReview:
			refusal = &intent.TransitionError{Key: r.Key, State: rec.State, Call: r.Kind.String(), Intent: rec.toIntent(v.rev(), holderGone), Evidence: true}
			return s.evidence(rec, ev), nil
		case rec.State == intent.StateCompleted && r.Kind == intent.ReportComplete:
			return nil, fmt.Errorf("%w: %q is already completed", intent.ErrResultMismatch, r.Key)
		case rec.State != intent.StateInProgress && rec.State != intent.StateUnknown:
			return nil, &intent.TransitionError{Key: r.Key, State: rec.State, Call: r.Kind.String(), Intent: rec.toIntent(v.rev(), holderGone)}
		}
		next := rec.clone()
		ev.Accepted = true
		ev.SessionID, ev.Worker = rec.Lease.SessionID, rec.Lease.Worker
		next.appendEvent(ev)
		next.UpdatedAt = now
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		exhausted := false
		switch r.Kind {
		case intent.ReportComplete:
			next.State, next.Result = intent.StateCompleted, r.Result
			next.finalize(now)
			var err error
			if cmps, ops, err = s.outbox(v, next, children, intent.PrincipalFrom(ctx), now); err != nil {
				return nil, err
			}
		case intent.ReportFail:
			next.State, next.Failure = intent.StateFailed, r.Failure
			next.finalize(now)
		case intent.ReportMarkUnknown:
			next.State = intent.StateUnknown
			exhausted = endAttempt(next, s.cfg.MaxAttempts, endedMarkedUnknown, now)
		case intent.ReportRelease:
			next.State = intent.StatePending
		}
		return &change{next: next, cmps: cmps, ops: ops, exhausted: exhausted, markedUnknown: r.Kind == intent.ReportMarkUnknown, done: func(committed *record, rev int64) {
			out = &intent.ReportOutcome{Intent: committed.toIntent(rev, holderGone)}
		}}, nil
	})
	if err != nil {
		return nil, err
	}
	// A replay or a refusal shows the intent as it is now; if another
	// worker holds it, tell whether that holder is alive, as Get does.
	var stale *intent.StaleTokenError
	switch {
	case holder != nil && errors.As(refusal, &stale):
		if err := s.settle(ctx, stale.Intent, holder); err != nil {
			return nil, err
		}
	case holder != nil && out != nil:
		if err := s.settle(ctx, out.Intent, holder); err != nil {
			return nil, err
		}
	}
	if refusal != nil {
		return nil, refusal
	}
	return out, nil
}

// settle reads whether the holder l of an intent shown as IN_PROGRESS is
// alive, and shows a lapsed one as UNKNOWN.
func (s *Store) settle(ctx context.Context, in *intent.Intent, l *leaseRecord) error {
	kv, err := s.getSession(ctx, in.Tenant, l.SessionID)
	if err != nil {
		return unavailable(err)
	}
	if kv == nil || kv.CreateRevision != l.SessionRev {
		in.State = intent.StateUnknown
		in.Lease.Live = false
	}
	return nil
}

// missing explains an absent record: expired (a tombstone remains) or
// never registered.
func missing(v *view) error {
	if v.tomb != nil {
		return v.tomb.expired()
	}
	return &intent.NotFoundError{Key: v.key}
}

// evidence keeps a refused report in the history (once: a retried refusal
// adds nothing), changing nothing else.
func (s *Store) evidence(rec *record, ev intent.Event) *change {
	if rec.hasEvent(ev.Kind, ev.Token, false) {
		return nil
	}
	next := rec.clone()
	next.appendEvent(ev)
	return &change{next: next}
}

// outbox registers a completing intent's children in the completion's
// transaction. A child that already exists with the same params and parent
// is left alone; with other params, or expired, the completion is refused.
func (s *Store) outbox(v *view, parent *record, children []intent.Registration, principal string, now time.Time) ([]clientv3.Cmp, []clientv3.Op, error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for i, c := range children {
		fp := intent.Fingerprint(c.Params)
		key := s.keys.intent(c.Tenant, c.Key)
		if kv := v.extra[key]; kv != nil {
			existing, err := decodeRecord(kv.Value, kv.ModRevision)
			if err != nil {
				return nil, nil, err
			}
			if existing.Fingerprint != fp || existing.ParentKey != parent.Key {
				return nil, nil, &intent.FingerprintMismatchError{Key: c.Key, Stored: existing.Fingerprint, Given: fp}
			}
			continue
		}
		if v.extra[s.keys.tombstone(c.Tenant, c.Key)] != nil {
			return nil, nil, intent.Invalid(fmt.Sprintf("children[%d].key", i), "%q expired after its retention; register the child under a new key", c.Key)
		}
		// The parent's view read its children: its compares already guard
		// the tombstone and the parent; add the child's own absence.
		rec, _, err := s.newRecord(&view{fresh: true, extra: map[string]*mvccpb.KeyValue{}}, &c, fp, principal, now)
		if err != nil {
			return nil, nil, err
		}
		rec.History[0].Reason = "registered by the completion of " + parent.Key
		val, err := encodeRecord(rec)
		if err != nil {
			return nil, nil, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.keys.tombstone(c.Tenant, c.Key)), "=", 0))
		ops = append(ops, clientv3.OpPut(key, string(val)))
		ops = append(ops, s.keys.indexOps(nil, rec)...)
		parent.appendEvent(intent.Event{Time: now, Kind: intent.EventChildRegistered, Accepted: true, Reason: c.Key, Principal: principal})
	}
	return cmps, ops, nil
}

// maxChildren bounds the children Get lists.
const maxChildren = 100

// Get reads an intent linearizably, history and children included.
func (s *Store) Get(ctx context.Context, tenant, key string) (*intent.Intent, error) {
	v, err := s.readWithHolder(ctx, tenant, key, nil)
	if errors.Is(err, errCorrupt) {
		return nil, err
	}
	if err != nil {
		return nil, unavailable(err)
	}
	if v.rec == nil {
		return nil, missing(v)
	}
	live := v.holderAlive()
	in := v.rec.toIntentWithHistory(v.rev(), holder(live))
	if live {
		in.Lease.ExpiresAt = s.sessionExpiry(ctx, in.Lease.SessionID)
	}
	if in.Children, err = s.children(ctx, tenant, key); err != nil {
		return nil, err
	}
	return in, nil
}

// children lists the first maxChildren children of an intent with their
// states, oldest first.
func (s *Store) children(ctx context.Context, tenant, key string) ([]intent.Child, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	prefix := s.keys.parentIndex(tenant, key)
	idx, err := s.kv.Get(rctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(maxChildren))
	if err != nil || len(idx.Kvs) == 0 {
		return nil, unavailable(err)
	}
	ops := make([]clientv3.Op, len(idx.Kvs))
	for i, kv := range idx.Kvs {
		ops[i] = clientv3.OpGet(s.keys.intent(tenant, string(kv.Value)))
	}
	resp, err := s.kv.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		return nil, unavailable(err)
	}
	out := make([]intent.Child, 0, len(ops))
	for i, r := range resp.Responses {
		st := intent.State(0)
		if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
			if rec, err := decodeRecord(kvs[0].Value, kvs[0].ModRevision); err == nil {
				st = rec.State
			}
		}
		if st != 0 {
			out = append(out, intent.Child{Key: string(idx.Kvs[i].Value), State: st})
		}
	}
	return out, nil
}
