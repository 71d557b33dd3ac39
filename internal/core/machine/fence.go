package machine

import (
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// fence is the one check of a fenced call's token t against the record's
// current token, made by every call that carries one (the reports, a
// worker's Escalate, a heartbeat's held leases):
//
//   - t is current: ok, and the call goes on to its own rules. A report
//     whose lease lapsed, with no newer token issued, is still current: the
//     best evidence there is.
//   - t is older: a newer token was issued, so t changes nothing. The
//     history keeps ev as evidence (once: a retried refusal adds nothing),
//     and the call is refused with a *intent.StaleTokenError that names the
//     current token and shows the intent as it is (an IN_PROGRESS intent
//     whose holder lapsed as UNKNOWN, its lease not live).
//   - t is newer: it was never issued; refused naming field, nothing kept.
//
// When ok is false, d is the whole decision.
func fence(v *View, t fencing.Token, field string, ev intent.Event) (d Decision, ok bool) {
	switch cur := v.Rec.CurrentToken(); {
	case t == cur:
		return Decision{}, true
	case t > cur:
		return refuse(intent.Invalid(field, "token %s was never issued for %q", t, v.Key)), false
	}
	if id := v.HolderUnread(); id != "" {
		return Decision{NeedSession: id}, false
	}
	d = evidence(v, ev)
	d.Err = stale(v, t)
	return d, false
}

// stale is the refusal of token t, superseded: it names the current token
// and shows the intent as it is. The caller must have read the holder (see
// View.HolderUnread).
func stale(v *View, t fencing.Token) error {
	return &intent.StaleTokenError{Key: v.Key, Token: t, Current: v.Rec.CurrentToken(), Intent: v.shown()}
}

// evidence keeps a refused call's event in the history (once: a retried
// refusal adds nothing), changing nothing else.
func evidence(v *View, ev intent.Event) Decision {
	if v.Rec.hasEvent(ev.Kind, ev.Token, false) {
		return Decision{}
	}
	next := v.Rec.Clone()
	next.appendEvent(ev)
	return v.write(next)
}
