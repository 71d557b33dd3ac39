package machine_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// world is one intent and its workers' sessions as a store would hold
// them, for random walks through the state diagram: every decision is
// made from a view of it, its guards checked against it, and its writes
// applied to it as a commit at the next revision would.
type world struct {
	rnd      *rand.Rand
	rec      *machine.Record
	rev      int64 // the record's mod revision
	tomb     *machine.Tombstone
	clock    int64            // the cluster's revision
	sessions map[string]int64 // alive sessions: id → create revision
	ids      []string         // every session ever opened
	issued   []fencing.Token  // every token issued, in order
	now      time.Time
}

func newWorld(seed uint64) *world {
	w := &world{rnd: rand.New(rand.NewPCG(seed, 7)), sessions: map[string]int64{}, clock: 1, now: t0}
	w.open()
	return w
}

func (w *world) open() string {
	w.clock++
	id := fmt.Sprintf("s-%d", len(w.ids))
	w.sessions[id] = w.clock
	w.ids = append(w.ids, id)
	return id
}

// view is a fresh view of the world; without sessions when partial.
func (w *world) view(partial bool) *machine.View {
	v := &machine.View{Key: key, Fresh: true, Tomb: w.tomb, Sessions: map[string]int64{}, Others: map[string]machine.Other{}}
	if w.rec != nil {
		v.Rec, v.Rev = w.rec.Clone(), w.rev
	}
	if !partial {
		for _, id := range w.ids {
			v.Sessions[id] = w.sessions[id]
		}
	}
	return v
}

// holds reports whether a guard holds in the world.
func (w *world) holds(g machine.Guard) bool {
	switch g.Kind {
	case machine.RecordAt:
		return g.Key == key && g.Rev == w.rev
	case machine.SessionAlive:
		return w.sessions[g.Session] == g.Rev
	case machine.SessionGone:
		return w.sessions[g.Session] != g.Rev
	case machine.NoTombstone:
		return g.Key != key || w.tomb == nil
	}
	return false
}

// token picks a token a worker might present: the current one, an older
// one, or one never issued.
func (w *world) token() fencing.Token {
	cur := fencing.Token(0)
	if w.rec != nil {
		cur = w.rec.CurrentToken()
	}
	switch n := w.rnd.IntN(6); {
	case n < 3:
		return cur
	case n < 5 && len(w.issued) > 0:
		return w.issued[w.rnd.IntN(len(w.issued))]
	default:
		return cur + 1 + fencing.Token(w.rnd.IntN(3))
	}
}

func (w *world) session() machine.Session {
	id := w.ids[w.rnd.IntN(len(w.ids))]
	return machine.Session{ID: id, Rev: max(w.sessions[id], 1), Worker: "w-" + id}
}

// step makes one random call, or a random change of the world, and
// returns the call's name and its decision function.
func (w *world) step() (string, func(*machine.View) machine.Decision) {
	pick := func(xs ...intent.State) intent.State { return xs[w.rnd.IntN(len(xs))] }
	switch w.rnd.IntN(12) {
	case 0:
		w.open()
		return "", nil
	case 1:
		id := w.ids[w.rnd.IntN(len(w.ids))]
		if w.rec != nil && w.rec.Lease != nil && w.rnd.IntN(2) == 0 {
			id = w.rec.Lease.SessionID // most often the holder's
		}
		delete(w.sessions, id) // its lease lapses
		return "", nil
	case 2:
		w.now = w.now.Add(time.Duration(w.rnd.IntN(30)) * time.Hour) // the default retention is a day
		return "Remove", func(v *machine.View) machine.Decision { return rules.Remove(v, w.now) }
	case 3, 4:
		c := acquireBy(fmt.Sprintf("acq-%d", w.rnd.IntN(2)), nil)
		if w.rnd.IntN(2) == 0 {
			reg := registration()
			reg.MaxAttempts = w.rnd.IntN(3) // 0: the rules' 3
			c = acquireBy(c.Req.RequestID, reg)
		}
		c.Session = w.session()
		c.Req.SessionID = c.Session.ID
		return "Acquire", func(v *machine.View) machine.Decision { return rules.Acquire(v, c, w.now) }
	case 5, 6:
		c := report(intent.ReportKind(1+w.rnd.IntN(4)), w.token())
		return "Report", func(v *machine.View) machine.Decision { return rules.Report(v, c, w.now) }
	case 7:
		t := w.token()
		if w.rnd.IntN(2) == 0 {
			t = 0 // a reviewer
		}
		c := escalate(t, w.rnd.IntN(2) == 0)
		return "Escalate", func(v *machine.View) machine.Decision { return rules.Escalate(v, c, w.now) }
	case 8:
		c := resolve(pick(intent.StateCompleted, intent.StatePending, intent.StateFailed, intent.StateCancelled), w.rnd.IntN(2) == 0, fmt.Sprintf("res-%d", w.rnd.IntN(3)))
		return "Resolve", func(v *machine.View) machine.Decision { return rules.Resolve(v, c, w.now) }
	case 9:
		c := machine.CancelCall{Cancellation: &intent.Cancellation{Tenant: "default", Key: key, Actor: "bob"}, Principal: "bob"}
		return "Cancel", func(v *machine.View) machine.Decision { return rules.Cancel(v, c, w.now) }
	case 10:
		s := ""
		if w.rec != nil && w.rec.Lease != nil {
			s = w.rec.Lease.SessionID
		}
		return "MarkLapsed", func(v *machine.View) machine.Decision { return rules.MarkLapsed(v, s, w.now) }
	default:
		c := machine.HeldCall{Held: intent.HeldLease{Key: key, Token: w.token()}, Index: 0, Session: w.session()}
		return "CheckHeld", func(v *machine.View) machine.Decision { return machine.CheckHeld(v, c, w.now) }
	}
}

// guarded reports whether d's guards hold, as etcd would check them. A view
// that read every session shows the world as it is, so its decisions'
// guards must hold; one that did not (a report's) may rely on what it did
// not read, and then the guards stop the write, as a failed compare does.
func (w *world) guarded(t *testing.T, where string, d machine.Decision, partial bool) bool {
	t.Helper()
	for _, g := range d.Guards {
		if !w.holds(g) {
			if !partial {
				t.Fatalf("%s: guard %+v does not hold in the world the view showed", where, g)
			}
			return false
		}
	}
	return true
}

// apply commits d's writes as the next revision.
func (w *world) apply(d machine.Decision) {
	w.clock++
	switch {
	case d.Next != nil:
		w.rec, w.rev = commit(d, w.clock), w.clock
		for _, c := range d.Create {
			_ = c // children are other intents: outside this world
		}
		if l := w.rec.Lease; l != nil && fencing.Token(w.clock) == l.Token && d.Next.Lease.Token == 0 {
			w.issued = append(w.issued, l.Token)
		}
	case d.Tombstone != nil:
		w.rec, w.rev, w.tomb = nil, 0, d.Tombstone
	}
}

// The invariants of DESIGN.md that a single intent's decisions must keep,
// checked after every step of many random walks through the diagram: every
// call, with current, stale and never-issued tokens, live and lapsed
// sessions, in any order.
func TestInvariantsOnRandomWalks(t *testing.T) {
	const walks, steps = 200, 200
	decisions := 0
	seen := map[string]bool{} // "call: FROM → TO" of every write applied
	for seed := range uint64(walks) {
		w := newWorld(seed)
		for i := range steps {
			name, decide := w.step()
			if decide == nil {
				continue
			}
			where := fmt.Sprintf("walk %d step %d %s", seed, i, name)
			partial := w.rnd.IntN(4) == 0
			v := w.view(partial)
			before := v.Rec
			if before != nil {
				before = before.Clone()
			}
			d := decide(v)
			if d.NeedSession != "" {
				if !partial {
					t.Fatalf("%s: asked for session %q of a view that read every session", where, d.NeedSession)
				}
				v.Sessions[d.NeedSession] = w.sessions[d.NeedSession]
				if d = decide(v); d.NeedSession != "" {
					t.Fatalf("%s: asked again for %q once it was read", where, d.NeedSession)
				}
			}
			decisions++
			if !reflect.DeepEqual(v.Rec, before) {
				t.Fatalf("%s: the decision changed the view's record", where)
			}
			checkDecision(t, where, w, before, d)
			if d.Writes() && w.guarded(t, where, d, partial) {
				w.apply(d)
				seen[edge(name, before, w.rec)] = true
			}
			checkWorld(t, where, w, before)
		}
	}
	t.Logf("%d decisions, %d distinct transitions", decisions, len(seen))
	// The walks are worth something only if they cross the whole diagram.
	for _, e := range []string{
		"Acquire: ABSENT → IN_PROGRESS", "Acquire: PENDING → IN_PROGRESS", "Acquire: UNKNOWN → IN_PROGRESS",
		"Acquire: IN_PROGRESS → IN_PROGRESS", "Acquire: IN_PROGRESS → NEEDS_REVIEW",
		"Report: IN_PROGRESS → COMPLETED", "Report: IN_PROGRESS → FAILED", "Report: IN_PROGRESS → UNKNOWN",
		"Report: IN_PROGRESS → PENDING", "Report: IN_PROGRESS → NEEDS_REVIEW", "Report: UNKNOWN → COMPLETED",
		"Report: IN_PROGRESS → IN_PROGRESS", "Report: COMPLETED → COMPLETED",
		"Escalate: IN_PROGRESS → NEEDS_REVIEW", "Escalate: PENDING → NEEDS_REVIEW", "Escalate: UNKNOWN → NEEDS_REVIEW",
		"Resolve: NEEDS_REVIEW → COMPLETED", "Resolve: NEEDS_REVIEW → PENDING", "Resolve: NEEDS_REVIEW → FAILED",
		"Resolve: NEEDS_REVIEW → CANCELLED", "Resolve: UNKNOWN → PENDING", "Resolve: IN_PROGRESS → FAILED",
		"Cancel: PENDING → CANCELLED", "MarkLapsed: IN_PROGRESS → UNKNOWN", "MarkLapsed: IN_PROGRESS → NEEDS_REVIEW",
		"Remove: COMPLETED → ABSENT", "Remove: FAILED → ABSENT", "Remove: CANCELLED → ABSENT", "CheckHeld: IN_PROGRESS → IN_PROGRESS",
	} {
		if !seen[e] {
			t.Errorf("no walk crossed %q", e)
		}
	}
}

// edge names a transition: the call, the state before and after.
func edge(call string, from, to *machine.Record) string {
	name := func(r *machine.Record) string {
		if r == nil {
			return "ABSENT"
		}
		return r.State.String()
	}
	return call + ": " + name(from) + " → " + name(to)
}

// checkDecision holds a decision, made from a view of w whose record was
// prev, to the invariants.
func checkDecision(t *testing.T, where string, w *world, prev *machine.Record, d machine.Decision) {
	t.Helper()
	if d.Writes() {
		if len(d.Guards) == 0 || d.Guards[0].Kind != machine.RecordAt {
			t.Fatalf("%s: a write not guarded first by the record's revision: %+v", where, d.Guards)
		}
	}
	var stale *intent.StaleTokenError
	var tr *intent.TransitionError
	switch {
	case errors.As(d.Err, &stale):
		// Invariant 3: a superseded token never changes an intent's state;
		// it leaves evidence, once.
		if n := d.Next; n != nil && (n.State != prev.State || !reflect.DeepEqual(n.Lease, prev.Lease) || !sameResult(n.Result, prev.Result) ||
			n.Attempts != prev.Attempts || len(n.History) > len(prev.History)+1 || n.History[len(n.History)-1].Accepted) {
			t.Fatalf("%s: a stale call changed more than the history: %+v → %+v", where, prev, n)
		}
		if stale.Current != prev.CurrentToken() || stale.Token >= stale.Current {
			t.Fatalf("%s: stale %v against current %v, record's %v", where, stale.Token, stale.Current, prev.CurrentToken())
		}
	case errors.As(d.Err, &tr) && tr.Evidence:
		if n := d.Next; n != nil && (n.State != prev.State || len(n.History) != len(prev.History)+1) {
			t.Fatalf("%s: refused evidence changed the record: %+v", where, n)
		}
	case d.Err != nil:
		// A refusal without evidence writes nothing (a token never issued
		// included).
		if d.Writes() {
			t.Fatalf("%s: refusal %v writes", where, d.Err)
		}
	}
	if prev != nil && prev.State.Final() && d.Next != nil {
		// Invariant 4: a final state never changes, nor its result.
		if d.Next.State != prev.State || !sameResult(d.Next.Result, prev.Result) || !reflect.DeepEqual(d.Next.Failure, prev.Failure) || !d.Next.RetainUntil.Equal(prev.RetainUntil) {
			t.Fatalf("%s: a final record changed: %v %+v → %v %+v", where, prev.State, prev.Result, d.Next.State, d.Next.Result)
		}
	}
	if d.Tombstone != nil && (prev == nil || !prev.State.Final() || w.now.Before(prev.RetainUntil)) {
		t.Fatalf("%s: removed a record not final or not due: %+v", where, prev)
	}
	if d.Answer.Fresh && d.Answer.Outcome == intent.OutcomeExecute && prev != nil && prev.State != intent.StatePending {
		// Invariant 5 and "only PENDING yields EXECUTE".
		t.Fatalf("%s: EXECUTE issued on a %v intent", where, prev.State)
	}
	if d.Answer.Fresh {
		if d.Next.Lease == nil || d.Next.Lease.Token != 0 || d.Next.State != intent.StateInProgress {
			t.Fatalf("%s: a fresh lease that is not a new token: %+v", where, d.Next.Lease)
		}
	}
}

// checkWorld holds the world after a step to the invariants.
func checkWorld(t *testing.T, where string, w *world, prev *machine.Record) {
	t.Helper()
	// Invariant 2: tokens strictly increase: each issued one is above
	// every earlier one, and a record's current token never goes down.
	for i := 1; i < len(w.issued); i++ {
		if w.issued[i] <= w.issued[i-1] {
			t.Fatalf("%s: token %v issued after %v", where, w.issued[i], w.issued[i-1])
		}
	}
	if w.rec == nil {
		return
	}
	if prev != nil && w.rec.CurrentToken() < prev.CurrentToken() {
		t.Fatalf("%s: current token went from %v to %v", where, prev.CurrentToken(), w.rec.CurrentToken())
	}
	if st := w.rec.State; !st.Final() && st != intent.StateNeedsReview && w.rec.Attempts >= machine.AttemptLimit(w.rec, rules.MaxAttempts) {
		t.Fatalf("%s: %d attempts ended without a report, limit %d, yet %v", where, w.rec.Attempts, w.rec.MaxAttempts, st)
	}
	if len(w.rec.History) > 128 {
		t.Fatalf("%s: history of %d entries", where, len(w.rec.History))
	}
	if w.rec.State == intent.StateInProgress && (w.rec.Lease == nil || w.rec.Lease.SessionID == "") {
		t.Fatalf("%s: IN_PROGRESS without a worker's lease: %+v", where, w.rec.Lease)
	}
}

func sameResult(a, b *intent.Result) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Payload, b.Payload) && reflect.DeepEqual(a.ExternalRefs, b.ExternalRefs)
}
