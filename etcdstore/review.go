package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
)

// principal is who a history entry names: the authenticated caller, or,
// without authentication, the actor the request named.
func principal(ctx context.Context, actor string) string {
	if p := intent.PrincipalFrom(ctx); p != "" && p != "anonymous" {
		if actor != "" && actor != p {
			return p + " (as " + actor + ")"
		}
		return p
	}
	return actor
}

// undecided is how a reviewer's call sees an intent's lease: whether the
// intent is held by a live worker, and if its holder lapsed, the compare
// that keeps it lapsed until the write.
func (s *Store) undecided(v *view) (live bool, cmps []clientv3.Cmp) {
	if v.rec.State != intent.StateInProgress {
		return false, nil
	}
	if v.holderAlive() {
		return true, nil
	}
	return false, []clientv3.Cmp{s.holderGone(v.rec)}
}

// holderGone is the compare that keeps a lapsed holder lapsed until the
// write applies: its session key no longer has the recorded revision.
func (s *Store) holderGone(rec *record) clientv3.Cmp {
	l := rec.Lease
	return clientv3.Compare(clientv3.CreateRevision(s.keys.session(rec.Tenant, l.SessionID)), "!=", l.SessionRev)
}

// noteLapse records in next that its holder's session lapsed before a
// report: next becomes UNKNOWN, or NEEDS_REVIEW when that was one attempt
// too many (exhausted; see endAttempt). It returns the compare that makes
// the write conditional on the holder still being gone.
func (s *Store) noteLapse(next *record, principal string, now time.Time) (cmps []clientv3.Cmp, exhausted bool) {
	l := next.Lease
	next.appendEvent(intent.Event{Time: now, Kind: intent.EventLeaseLapsed, Token: l.Token, SessionID: l.SessionID, Worker: l.Worker, Accepted: true, Principal: principal})
	next.State, next.UpdatedAt = intent.StateUnknown, now
	exhausted = endAttempt(next, s.cfg.MaxAttempts, endedLapsed, now)
	return []clientv3.Cmp{s.holderGone(next)}, exhausted
}

// Escalate moves an intent to NEEDS_REVIEW. Under a worker's token it is
// fenced like a report (stale: evidence and *intent.StaleTokenError). A
// reviewer (zero token) may escalate a PENDING or UNKNOWN intent, or one
// whose holder lapsed; an intent under a live lease needs Force, and then
// the lease's token is superseded. Escalating an intent that already waits
// for review changes nothing.
func (s *Store) Escalate(ctx context.Context, e intent.Escalation) (*intent.Intent, error) {
	load := func(ctx context.Context) (*view, error) { return s.readWithHolder(ctx, e.Tenant, e.Key, nil) }
	var out *intent.Intent
	var refusal error
	err := s.transition(ctx, e.Tenant, e.Key, nil, load, func(v *view) (*change, error) {
		out, refusal = nil, nil
		if v.rec == nil {
			return nil, missing(v)
		}
		rec, now := v.rec, s.cfg.Now()
		cur := currentToken(rec)
		ev := intent.Event{Time: now, Kind: intent.EventEscalated, Token: e.Token, Reason: e.Reason, Principal: principal(ctx, e.Actor)}
		live, cmps := s.undecided(v)
		switch {
		case e.Token != 0 && e.Token < cur:
			refusal = &intent.StaleTokenError{Key: e.Key, Token: e.Token, Current: cur, Intent: rec.toIntent(v.rev(), holder(live))}
			return s.evidence(rec, ev), nil
		case e.Token != 0 && e.Token > cur:
			return nil, intent.Invalid("token", "token %s was never issued for %q", e.Token, e.Key)
		case rec.State == intent.StateNeedsReview:
			out = rec.toIntent(v.rev(), holderGone)
			return nil, nil
		case rec.State.Final():
			return nil, &intent.TransitionError{Key: e.Key, State: rec.State, Call: "Escalate", Intent: rec.toIntent(v.rev(), holderGone)}
		case e.Token != 0 && rec.State != intent.StateInProgress && rec.State != intent.StateUnknown:
			return nil, &intent.TransitionError{Key: e.Key, State: rec.State, Call: "Escalate", Intent: rec.toIntent(v.rev(), holderGone)}
		case e.Token == 0 && live && !e.Force:
			return nil, fmt.Errorf("%w: %q is held by worker %q; pass force to supersede its lease", intent.ErrLeaseHeld, e.Key, rec.Lease.Worker)
		}
		next := rec.clone()
		if e.Token == 0 {
			ev.Token = cur
			if live {
				next.supersede(e.Actor, now)
				ev.Token, ev.Issued = 0, true
			}
		}
		ev.Accepted = true
		next.appendEvent(ev)
		next.State, next.UpdatedAt = intent.StateNeedsReview, now
		return &change{next: next, cmps: cmps, done: func(committed *record, rev int64) { out = committed.toIntent(rev, holderGone) }}, nil
	})
	if err != nil {
		return nil, err
	}
	if refusal != nil {
		return nil, refusal
	}
	return out, nil
}

// Resolve records a reviewer's decision on a NEEDS_REVIEW or UNKNOWN intent
// (or one whose holder lapsed; one under a live lease needs Force). Every
// decision issues a new token, so reports under any earlier lease are stale
// from then on. A retry with the same RequestID returns the intent as it is
// now, without deciding again (replayed true), whatever happened since.
// With ExpectedToken, a decision whose intent has a newer token than the
// one the reviewer saw is refused with *intent.StaleTokenError.
func (s *Store) Resolve(ctx context.Context, d intent.Resolution) (in *intent.Intent, replayed bool, err error) {
	load := func(ctx context.Context) (*view, error) { return s.readWithHolder(ctx, d.Tenant, d.Key, nil) }
	err = s.transition(ctx, d.Tenant, d.Key, nil, load, func(v *view) (*change, error) {
		in, replayed = nil, false
		if v.rec == nil {
			return nil, missing(v)
		}
		rec, now := v.rec, s.cfg.Now()
		if i := slices.IndexFunc(rec.History, func(e intent.Event) bool {
			return e.Kind == intent.EventResolved && d.RequestID != "" && e.RequestID == d.RequestID
		}); i >= 0 {
			// A retry (or our read-back after an ambiguous commit): never
			// decide twice, whatever happened since.
			if e := rec.History[i]; e.ResolvedState != d.Decision || e.Principal != principal(ctx, d.Actor) {
				return nil, intent.Invalid("request_id", "%q was used for another decision", d.RequestID)
			}
			in, replayed = rec.toIntent(v.rev(), v.holder()), true
			return nil, nil
		}
		live, cmps := s.undecided(v)
		switch {
		case d.ExpectedToken != 0 && d.ExpectedToken != currentToken(rec):
			// Decided on a view that is no longer true: another decision
			// or a new lease came in between.
			return nil, &intent.StaleTokenError{Key: d.Key, Token: d.ExpectedToken, Current: currentToken(rec), Intent: rec.toIntent(v.rev(), v.holder())}
		case live && !d.Force:
			return nil, fmt.Errorf("%w: %q is held by worker %q; pass force to supersede its lease", intent.ErrLeaseHeld, d.Key, rec.Lease.Worker)
		case rec.State != intent.StateNeedsReview && rec.State != intent.StateUnknown && rec.State != intent.StateInProgress:
			return nil, &intent.TransitionError{Key: d.Key, State: rec.State, Call: "Resolve", Intent: rec.toIntent(v.rev(), holderGone)}
		}
		next := rec.clone()
		next.supersede(d.Actor, now)
		next.appendEvent(intent.Event{
			Time: now, Kind: intent.EventResolved, Accepted: true, Issued: true,
			Principal: principal(ctx, d.Actor), Reason: d.Reason, ResolvedState: d.Decision, Failure: d.Failure,
			RequestID: d.RequestID, Channel: d.Channel,
		})
		ev := &next.History[len(next.History)-1]
		ev.Result, ev.PayloadSHA256 = digest(d.Result)
		next.State = d.Decision
		switch d.Decision {
		case intent.StatePending:
			// Confirmed absent by a human: the next attempts start a
			// fresh count (see endAttempt).
			next.Attempts = 0
		case intent.StateCompleted:
			next.Result = d.Result
		case intent.StateFailed:
			next.Failure = d.Failure
		}
		if next.State.Final() {
			next.finalize(now)
		}
		return &change{next: next, cmps: cmps, done: func(committed *record, rev int64) {
			in = committed.toIntent(rev, holderGone)
		}}, nil
	})
	return in, replayed, err
}

// Cancel withdraws a PENDING intent: CANCELLED is final. Cancelling a
// cancelled intent again changes nothing.
func (s *Store) Cancel(ctx context.Context, c intent.Cancellation) (*intent.Intent, error) {
	load := func(ctx context.Context) (*view, error) { return s.readWithHolder(ctx, c.Tenant, c.Key, nil) }
	var out *intent.Intent
	err := s.transition(ctx, c.Tenant, c.Key, nil, load, func(v *view) (*change, error) {
		out = nil
		if v.rec == nil {
			return nil, missing(v)
		}
		rec, now := v.rec, s.cfg.Now()
		switch rec.State {
		case intent.StateCancelled:
			out = rec.toIntent(v.rev(), holderGone)
			return nil, nil
		case intent.StatePending:
		default:
			return nil, &intent.TransitionError{Key: c.Key, State: rec.State, Call: "Cancel", Intent: rec.toIntent(v.rev(), v.holder())}
		}
		next := rec.clone()
		next.appendEvent(intent.Event{Time: now, Kind: intent.EventCancelled, Token: currentToken(rec), Accepted: true, Principal: principal(ctx, c.Actor), Reason: c.Reason})
		next.State, next.UpdatedAt = intent.StateCancelled, now
		next.finalize(now)
		return &change{next: next, done: func(committed *record, rev int64) { out = committed.toIntent(rev, holderGone) }}, nil
	})
	return out, err
}
