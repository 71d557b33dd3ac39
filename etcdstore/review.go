package etcdstore

import (
	"context"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
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

// Escalate moves an intent to NEEDS_REVIEW. Under a worker's token it is
// fenced like a report (stale: evidence and *intent.StaleTokenError). A
// reviewer (zero token) may escalate a PENDING or UNKNOWN intent, or one
// whose holder lapsed; an intent under a live lease needs Force, and then
// the lease's token is superseded. Escalating an intent that already waits
// for review changes nothing.
func (s *Store) Escalate(ctx context.Context, e intent.Escalation) (*intent.Intent, error) {
	call := machine.EscalateCall{Escalation: &e, Principal: principal(ctx, e.Actor)}
	ctx, decide, done := s.archivable(ctx, func(v *machine.View) machine.Decision {
		return s.rules.Escalate(v, call, s.cfg.Now())
	})
	a, err := s.transition(ctx, e.Tenant, e.Key, nil, s.loadWithHolder(e.Tenant, e.Key), decide)
	return a.Intent, done(err)
}

// Resolve records a reviewer's decision on a NEEDS_REVIEW or UNKNOWN intent
// (or one whose holder lapsed; one under a live lease needs Force). Every
// decision issues a new token, so reports under any earlier lease are stale
// from then on. A retry with the same RequestID returns the intent as it is
// now, without deciding again (replayed true), whatever happened since.
// With ExpectedToken, a decision whose intent has a newer token than the
// one the reviewer saw is refused with *intent.StaleTokenError.
func (s *Store) Resolve(ctx context.Context, d intent.Resolution) (in *intent.Intent, replayed bool, err error) {
	call := machine.ResolveCall{Resolution: &d, Principal: principal(ctx, d.Actor)}
	ctx, decide, done := s.archivable(ctx, func(v *machine.View) machine.Decision {
		return s.rules.Resolve(v, call, s.cfg.Now())
	})
	a, err := s.transition(ctx, d.Tenant, d.Key, nil, s.loadWithHolder(d.Tenant, d.Key), decide)
	return a.Intent, a.Replayed, done(err)
}

// Cancel withdraws a PENDING intent: CANCELLED is final. Cancelling a
// cancelled intent again changes nothing.
func (s *Store) Cancel(ctx context.Context, c intent.Cancellation) (*intent.Intent, error) {
	call := machine.CancelCall{Cancellation: &c, Principal: principal(ctx, c.Actor)}
	ctx, decide, done := s.archivable(ctx, func(v *machine.View) machine.Decision {
		return s.rules.Cancel(v, call, s.cfg.Now())
	})
	a, err := s.transition(ctx, c.Tenant, c.Key, nil, s.loadWithHolder(c.Tenant, c.Key), decide)
	return a.Intent, done(err)
}

// loadWithHolder loads a view for a call that shows or decides by whether
// the intent's holder is alive: the holder's session is read with it.
func (s *Store) loadWithHolder(tenant, key string) func(context.Context) (*machine.View, error) {
	return func(ctx context.Context) (*machine.View, error) { return s.readWithHolder(ctx, tenant, key, nil) }
}
