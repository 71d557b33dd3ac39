package machine_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// The fixtures every table starts from: records in each state of the
// diagram, views of them, and a commit that does what the store does to a
// written record (tokens materialized at the write's revision).

var (
	t0    = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now   = t0.Add(time.Hour)
	fp1   = intent.Fingerprint([]byte(`{"item":"lamp"}`))
	rules = machine.Rules{DefaultRetention: 24 * time.Hour, TombstoneRetention: 48 * time.Hour, MaxAttempts: 3}
)

const (
	key     = "order-1"
	holder  = "s-holder" // the session holding the fixtures' lease
	holderR = int64(40)  // its key's create revision
	caller  = "s-caller" // the session of the call under test
	callerR = int64(50)
	tok     = fencing.Token(60) // the fixtures' current token
	rev     = int64(70)         // the fixtures' record revision
)

// pending is a registered record nobody acted on.
func pending() *machine.Record {
	return &machine.Record{
		Tenant: "default", Key: key, State: intent.StatePending,
		Params: json.RawMessage(`{"item":"lamp"}`), Fingerprint: fp1,
		History:   []intent.Event{{Time: t0, Kind: intent.EventRegistered, Accepted: true, RequestID: "reg-1"}},
		CreatedAt: t0, UpdatedAt: t0, Retention: time.Hour, MaxAttempts: 3,
	}
}

// held is a record under the holder's lease, token tok, in mode m.
func held(m intent.Mode) *machine.Record {
	r := pending()
	r.State = intent.StateInProgress
	r.Lease = &machine.Lease{Token: tok, Mode: m, SessionID: holder, SessionRev: holderR, Worker: "w-holder", RequestID: "acq-1", AcquiredAt: t0}
	r.History = append(r.History, intent.Event{Time: t0, Kind: intent.EventAcquired, Token: tok, Mode: m, SessionID: holder, Accepted: true, Issued: true})
	return r
}

// in returns a record in state st with a lease under token tok (the last
// one issued), as the diagram leaves it there.
func in(st intent.State) *machine.Record {
	if st == intent.StatePending {
		return pending()
	}
	r := held(intent.ModeExecute)
	r.State = st
	switch st {
	case intent.StateCompleted:
		r.Result = &intent.Result{Payload: []byte(`{"order":"SO-1"}`)}
		r.History = append(r.History, intent.Event{Kind: intent.EventCompleted, Token: tok, Accepted: true})
	case intent.StateFailed:
		r.Failure = &intent.Failure{Code: "declined"}
		r.History = append(r.History, intent.Event{Kind: intent.EventFailed, Token: tok, Accepted: true})
	case intent.StateCancelled:
		r.Lease = nil
	case intent.StateUnknown:
		r.Attempts, r.EndedToken = 1, tok
		r.History = append(r.History, intent.Event{Kind: intent.EventLeaseLapsed, Token: tok, SessionID: holder, Accepted: true})
	}
	if st.Final() {
		r.CompletedAt, r.RetainUntil = t0, t0.Add(r.Retention)
	}
	return r
}

// view is a fresh view of rec at revision rev, with the caller's session
// alive and the holder's alive or gone.
func view(rec *machine.Record, holderAlive bool) *machine.View {
	v := &machine.View{Key: key, Rec: rec, Fresh: true, Sessions: map[string]int64{caller: callerR, holder: 0}, Others: map[string]machine.Other{}}
	if rec != nil {
		v.Rev = rev
	}
	if holderAlive {
		v.Sessions[holder] = holderR
	}
	return v
}

// live and lapsed are views of rec with the holder alive, and gone.
func live(rec *machine.Record) *machine.View   { return view(rec, true) }
func lapsed(rec *machine.Record) *machine.View { return view(rec, false) }

// commit is what the store makes of a decision's next version written at
// revision at: the record a reader then sees.
func commit(d machine.Decision, at int64) *machine.Record {
	c := d.Next.Clone()
	c.Materialize(at)
	return c
}

// kinds lists the kinds of a decision's guards, in order.
func kinds(gs []machine.Guard) []machine.GuardKind {
	out := make([]machine.GuardKind, len(gs))
	for i, g := range gs {
		out[i] = g.Kind
	}
	return out
}

// expect is what a row of a table wants of a decision.
type expect struct {
	err    error               // errors.Is target; nil: no refusal
	state  intent.State        // Next's state; 0: Next is nil
	guards []machine.GuardKind // the guards, in order (when writing)
	show   machine.Show        // the answer's Show
	shown  intent.State        // the answer's (or the refusal's) intent's state; 0: not checked
	need   string              // NeedSession
	ended  machine.Ended       // what the store counts
	exh    bool                // Exhausted
	check  func(*testing.T, machine.Decision)
}

// verify checks d against e, and what holds of every decision: a write is
// guarded first by the view's revision.
func verify(t *testing.T, v *machine.View, d machine.Decision, e expect) {
	t.Helper()
	switch {
	case e.err == nil && d.Err != nil:
		t.Fatalf("refused with %v, want no refusal", d.Err)
	case e.err != nil && !errors.Is(d.Err, e.err):
		t.Fatalf("refusal %v, want %v", d.Err, e.err)
	}
	if d.NeedSession != e.need {
		t.Fatalf("NeedSession %q, want %q", d.NeedSession, e.need)
	}
	if e.state == 0 && d.Next != nil {
		t.Fatalf("writes a version in state %v, want no write of the record", d.Next.State)
	}
	if e.state != 0 {
		if d.Next == nil {
			t.Fatalf("writes nothing, want a version in state %v", e.state)
		}
		if d.Next.State != e.state {
			t.Errorf("next state %v, want %v", d.Next.State, e.state)
		}
		if d.Next == v.Rec {
			t.Errorf("the next version is the view's record itself, want a copy")
		}
	}
	if d.Writes() {
		if len(d.Guards) == 0 || d.Guards[0] != (machine.Guard{Kind: machine.RecordAt, Key: v.Key, Rev: v.Rev}) {
			t.Errorf("guards %+v, want the view's revision %d first", d.Guards, v.Rev)
		}
		if got := kinds(d.Guards); !slices.Equal(got, e.guards) {
			t.Errorf("guard kinds %v, want %v", got, e.guards)
		}
	}
	if d.Answer.Show != e.show {
		t.Errorf("answer shows %v, want %v", d.Answer.Show, e.show)
	}
	if e.shown != 0 {
		if got := shownState(d); got != e.shown {
			t.Errorf("answer shows state %v, want %v", got, e.shown)
		}
	}
	if d.Ended != e.ended || d.Exhausted != e.exh {
		t.Errorf("ended %v exhausted %t, want %v %t", d.Ended, d.Exhausted, e.ended, e.exh)
	}
	if e.check != nil {
		e.check(t, d)
	}
}

// shownState is the state of the intent a decision shows, in its answer or
// in its refusal; for an answer shown from the next version, that
// version's as committed.
func shownState(d machine.Decision) intent.State {
	var st *intent.StaleTokenError
	var tr *intent.TransitionError
	switch {
	case errors.As(d.Err, &st):
		return st.Intent.State
	case errors.As(d.Err, &tr):
		return tr.Intent.State
	case d.Answer.Show != machine.ShowDecided && d.Next != nil:
		return d.Finish(commit(d, rev+1), rev+1).Intent.State
	case d.Answer.Intent != nil:
		return d.Answer.Intent.State
	}
	return 0
}

// last is the last history entry of d's next version.
func last(d machine.Decision) intent.Event { return d.Next.History[len(d.Next.History)-1] }

// errorsIs is errors.Is, where a nil target wants no error at all.
func errorsIs(err, target error) bool {
	if target == nil {
		return err == nil
	}
	return errors.Is(err, target)
}
