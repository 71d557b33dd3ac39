package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/intentd/intentd/e2e/fakes"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Operations turns recorded calls into porcupine operations on intents. A
// read whose answer was lost (Get, a heartbeat's lease check) tells nothing
// and is left out; a write whose answer was lost stays, open until the end
// of the history, and the model follows both of its possible outcomes. A
// Heartbeat becomes one lease check per lease it named whose fate its answer
// tells.
func Operations(calls []Call) []porcupine.Operation {
	var last time.Duration
	for _, c := range calls {
		last = max(last, c.End)
	}
	open := int64(last) + 1 // after every answer: as good as never
	var ops []porcupine.Operation
	add := func(c Call, in Input, out Output) {
		ret := int64(c.End)
		if out.Unknown {
			ret = open
		}
		ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: in, Call: int64(c.Start), Output: out, Return: ret})
	}
	for _, c := range calls {
		switch {
		case c.Method == "Heartbeat":
			for _, l := range c.Leases {
				in := Input{Kind: OpHeld, Key: l.Key, Token: l.Token}
				switch {
				case c.OK():
					add(c, in, Output{})
				case c.Out.Reason == reasonStale && c.StaleKey == l.Key:
					add(c, in, Output{Reason: reasonStale, Current: c.Out.Current})
				}
			}
		case c.In.Kind == 0:
		case c.In.Kind == OpGet && c.Out.Unknown:
		default:
			add(c, c.In, c.Out)
		}
	}
	return ops
}

// Linearizability is the result of checking a history with porcupine.
type Linearizability struct {
	Result     porcupine.CheckResult
	Operations int
	Partitions int
	// Visualization is the HTML file written when the check did not pass.
	Visualization string
	// Failing names the intents whose own history did not pass, and Story
	// tells the first one's calls in order.
	Failing []string
	Story   string
}

// CheckLinearizable checks calls against Model with porcupine. Unless the
// history is linearizable it writes porcupine's visualization to
// dir/<name>.html and names it in the result.
func CheckLinearizable(calls []Call, dir, name string, timeout time.Duration) (Linearizability, error) {
	ops := Operations(calls)
	res, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	l := Linearizability{Result: res, Operations: len(ops), Partitions: len(Model.Partition(ops))}
	if res == porcupine.Ok {
		return l, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return l, err
	}
	l.Visualization = filepath.Join(dir, fmt.Sprintf("%s-%s.html", sanitize(name), time.Now().Format("20060102-150405")))
	if err := porcupine.VisualizePath(Model, info, l.Visualization); err != nil {
		return l, fmt.Errorf("reliability: writing the visualization: %w", err)
	}
	for _, part := range Model.Partition(ops) {
		if porcupine.CheckOperationsTimeout(Model, part, timeout) == porcupine.Ok {
			continue
		}
		l.Failing = append(l.Failing, part[0].Input.(Input).Key)
		if l.Story == "" {
			l.Story = story(part)
		}
	}
	return l, nil
}

// story tells one intent's operations in the order they started, with
// their intervals (an open one ends with "…").
func story(ops []porcupine.Operation) string {
	ops = slices.Clone(ops)
	slices.SortFunc(ops, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
	var b strings.Builder
	for _, op := range ops {
		end := time.Duration(op.Return).Round(time.Millisecond).String()
		if op.Output.(Output).Unknown {
			end = "…"
		}
		fmt.Fprintf(&b, "  [%v, %s] client %d: %s\n", time.Duration(op.Call).Round(time.Millisecond), end, op.ClientId, describeOp(op.Input.(Input), op.Output.(Output)))
	}
	return b.String()
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r == ':' {
			return '_'
		}
		return r
	}, s)
}

// Findings is what the end-of-run checks found, beyond linearizability.
type Findings struct {
	// Intents is how many intents were read back at the end.
	Intents int
	// Orders is how many orders the merchant holds.
	Orders int
	// Duplicates counts second effects: orders beyond one per intent, and
	// accepted completions beyond one.
	Duplicates int
	// Lost counts acknowledged transitions missing from the final history.
	Lost int
	// Unknown counts writes whose answer was lost; Resolved those whose
	// fate the final history tells, TookEffect those of them that acted.
	Unknown, Resolved, TookEffect int
	// StaleRefused counts Completes refused as STALE_TOKEN, StaleReports
	// every report so refused.
	StaleRefused, StaleReports int
	// Lapsed counts leases the final histories show lapsed.
	Lapsed int
	// CreatedMisreported counts intents that a Register call created
	// although every Register answered created=false: a read-back after an
	// ambiguous commit that did not recognize its own request id. Must be 0.
	CreatedMisreported int
	// Other counts violations that are neither duplicates nor lost
	// transitions: intents left unfinished, results that disagree with the
	// world, tokens out of order, leases taken from live sessions.
	Other int
	// Problems describes every violation found (invariants of DESIGN.md).
	Problems []string
}

func (f *Findings) problem(format string, args ...any) {
	f.Problems = append(f.Problems, fmt.Sprintf(format, args...))
}

func (f *Findings) other(format string, args ...any) {
	f.Other++
	f.problem(format, args...)
}

func entriesOf(in *intentv1.Intent, kind intentv1.HistoryEntry_Kind) []*intentv1.HistoryEntry {
	var out []*intentv1.HistoryEntry
	for _, e := range in.GetHistory() {
		if e.GetKind() == kind {
			out = append(out, e)
		}
	}
	return out
}

// entryKind is the history entry an accepted report leaves.
var entryKind = map[OpKind]intentv1.HistoryEntry_Kind{
	OpComplete:    intentv1.HistoryEntry_KIND_COMPLETED,
	OpMarkUnknown: intentv1.HistoryEntry_KIND_MARKED_UNKNOWN,
	OpRelease:     intentv1.HistoryEntry_KIND_RELEASED,
	OpFail:        intentv1.HistoryEntry_KIND_FAILED,
	OpEscalate:    intentv1.HistoryEntry_KIND_ESCALATED,
}

func hasEntry(in *intentv1.Intent, kind intentv1.HistoryEntry_Kind, token uint64, accepted bool) bool {
	for _, e := range entriesOf(in, kind) {
		if e.GetToken() == token && e.GetAccepted() == accepted {
			return true
		}
	}
	return false
}

// leaseIssued reports whether an Acquire answer names a lease issued to the
// caller.
func leaseIssued(c Call) bool {
	o := c.Out.Outcome
	return c.OK() && c.In.Kind == OpAcquire && (o == intentv1.Outcome_OUTCOME_EXECUTE || o == intentv1.Outcome_OUTCOME_RECONCILE)
}

// Analyze checks the world and the acknowledged past at the end of a run:
// finals are the intents read back (with history), orders the merchant's
// orders by reference (intent key), refKey the external ref naming the
// order in a result.
func Analyze(calls []Call, finals map[string]*intentv1.Intent, orders map[string][]fakes.Order, refKey string) Findings {
	var f Findings
	f.Intents = len(finals)
	for _, os := range orders {
		f.Orders += len(os)
	}

	// The world: one order per intent, the one its result names, and one
	// accepted completion (invariants 4 and 10).
	keys := make([]string, 0, len(finals))
	for k := range finals {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		in := finals[k]
		os := orders[k]
		completes := 0
		for _, e := range entriesOf(in, intentv1.HistoryEntry_KIND_COMPLETED) {
			if e.GetAccepted() {
				completes++
			}
		}
		if len(os) > 1 {
			f.Duplicates += len(os) - 1
			f.problem("intent %s: the merchant holds %d orders %v: a second effect", k, len(os), os)
		}
		if completes > 1 {
			f.Duplicates += completes - 1
			f.problem("intent %s: %d accepted completions: completed twice", k, completes)
		}
		if in.GetState() != intentv1.State_STATE_COMPLETED {
			f.other("intent %s ended %s, not COMPLETED", k, in.GetState())
			continue
		}
		got := in.GetResult().GetExternalRefs()[refKey]
		if len(os) == 0 || got != os[0].ID || completes != 1 {
			f.other("intent %s: COMPLETED with order %q, %d accepted completions; the merchant holds %v", k, got, completes, os)
		}
	}
	for ref, os := range orders {
		if _, ok := finals[ref]; !ok {
			f.other("the merchant holds orders %v for %s, an intent nobody registered", os, ref)
		}
	}

	// Invariant 7: every acknowledged transition is in the final history.
	for _, c := range calls {
		in, read := finals[c.In.Key]
		if !read || !c.Transition() {
			continue
		}
		var found bool
		switch {
		case c.In.Kind == OpRegister:
			found = !c.Out.Created || len(entriesOf(in, intentv1.HistoryEntry_KIND_REGISTERED)) == 1
		case c.In.Kind == OpAcquire:
			found = !leaseIssued(c) || hasEntry(in, intentv1.HistoryEntry_KIND_ACQUIRED, c.Out.Token, true)
		case c.In.Kind.report():
			found = hasEntry(in, entryKind[c.In.Kind], c.In.Token, true) ||
				(c.In.Kind == OpEscalate && in.GetState() == intentv1.State_STATE_NEEDS_REVIEW)
		default:
			found = true
		}
		if !found {
			f.Lost++
			f.problem("intent %s: %s was acknowledged at %v and is not in the final history", c.In.Key, describeOp(c.In, c.Out), c.End.Round(time.Millisecond))
		}
	}

	// Register's created flag: some call must have said it created the
	// intent, unless its answer was lost.
	type regs struct{ created, unknown bool }
	byKey := map[string]*regs{}
	for _, c := range calls {
		if c.In.Kind != OpRegister {
			continue
		}
		r := byKey[c.In.Key]
		if r == nil {
			r = &regs{}
			byKey[c.In.Key] = r
		}
		r.created = r.created || (c.OK() && c.Out.Created)
		r.unknown = r.unknown || c.Out.Unknown
	}
	for k, r := range byKey {
		if _, read := finals[k]; read && !r.created && !r.unknown {
			f.CreatedMisreported++
		}
	}

	// Invariant 2: tokens strictly increase per intent, never repeat across
	// intents, and increase in real time across the cluster.
	owner := map[uint64]string{}
	for _, k := range keys {
		var prev uint64
		for _, e := range entriesOf(finals[k], intentv1.HistoryEntry_KIND_ACQUIRED) {
			t := e.GetToken()
			if t <= prev {
				f.other("intent %s: token %d issued after %d", k, t, prev)
			}
			prev = t
			if o, ok := owner[t]; ok && o != k {
				f.other("token %d issued to both %s and %s", t, o, k)
			}
			owner[t] = k
		}
	}
	for _, p := range realTimeTokens(calls) {
		f.other("%s", p)
	}

	// Invariant 1: a lease is taken over only from a holder whose session
	// is gone, and a session never comes back.
	for _, p := range takeovers(calls, finals) {
		f.other("%s", p)
	}

	// Unknown outcomes, resolved by the final history.
	tokensSeen := map[uint64]bool{}
	for _, c := range calls {
		if leaseIssued(c) {
			tokensSeen[c.Out.Token] = true
		}
	}
	for _, c := range calls {
		if !c.Out.Unknown || c.In.Kind == 0 || c.In.Kind == OpGet {
			continue
		}
		f.Unknown++
		in, read := finals[c.In.Key]
		if !read {
			continue
		}
		f.Resolved++
		switch {
		case c.In.Kind == OpRegister:
			f.TookEffect++ // it exists; whether this call or a retry made it, the approval stands
		case c.In.Kind == OpAcquire:
			for _, e := range entriesOf(in, intentv1.HistoryEntry_KIND_ACQUIRED) {
				if e.GetSessionId() == c.In.Session && !tokensSeen[e.GetToken()] {
					f.TookEffect++
					break
				}
			}
		case c.In.Kind.report():
			if hasEntry(in, entryKind[c.In.Kind], c.In.Token, true) {
				f.TookEffect++
			}
		}
	}
	for _, c := range calls {
		if c.In.Kind.report() && c.Out.Reason == reasonStale {
			f.StaleReports++
			if c.In.Kind == OpComplete {
				f.StaleRefused++
			}
		}
	}
	for _, in := range finals {
		f.Lapsed += len(entriesOf(in, intentv1.HistoryEntry_KIND_LEASE_LAPSED))
	}
	return f
}

// realTimeTokens checks that a lease requested after another lease was
// handed out has the higher token, whatever the intents: tokens are etcd
// revisions, and etcd orders every write of the cluster. A request's first
// attempt bounds when its lease can have been issued.
func realTimeTokens(calls []Call) []string {
	type req struct{ session, request string }
	firstCall := map[req]time.Duration{}
	for _, c := range calls {
		if c.In.Kind != OpAcquire {
			continue
		}
		r := req{c.In.Session, c.In.Request}
		if t, ok := firstCall[r]; !ok || c.Start < t {
			firstCall[r] = c.Start
		}
	}
	type lease struct {
		token   uint64
		key     string
		asked   time.Duration // the first attempt of the request that got it
		learned time.Duration // the first answer that named it
	}
	byToken := map[uint64]*lease{}
	for _, c := range calls {
		if !leaseIssued(c) {
			continue
		}
		asked := firstCall[req{c.In.Session, c.In.Request}]
		l, ok := byToken[c.Out.Token]
		if !ok {
			byToken[c.Out.Token] = &lease{token: c.Out.Token, key: c.In.Key, asked: asked, learned: c.End}
			continue
		}
		l.asked, l.learned = min(l.asked, asked), min(l.learned, c.End)
	}
	var leases []*lease
	for _, l := range byToken {
		leases = append(leases, l)
	}
	byLearned := slices.Clone(leases)
	slices.SortFunc(byLearned, func(a, b *lease) int { return int(a.learned - b.learned) })
	slices.SortFunc(leases, func(a, b *lease) int { return int(a.asked - b.asked) })
	var problems []string
	var top *lease // the highest token learned so far
	i := 0
	for _, b := range leases {
		for i < len(byLearned) && byLearned[i].learned < b.asked {
			if top == nil || byLearned[i].token > top.token {
				top = byLearned[i]
			}
			i++
		}
		if top != nil && b.token <= top.token && len(problems) < 20 {
			problems = append(problems, fmt.Sprintf("token %d (%s) was requested at %v, after token %d (%s) was handed out at %v: tokens went backwards",
				b.token, b.key, b.asked.Round(time.Millisecond), top.token, top.key, top.learned.Round(time.Millisecond)))
		}
	}
	return problems
}

// takeovers checks invariant 1 against the sessions' own heartbeats: when a
// lease passed on because its holder's session lapsed (LEASE_LAPSED), that
// session must never be alive again. A heartbeat that etcd kept alive (OK,
// or refused only for a superseded lease) after the new lease was handed out
// means two live leases at once.
func takeovers(calls []Call, finals map[string]*intentv1.Intent) []string {
	learned := map[uint64]time.Duration{}
	for _, c := range calls {
		if leaseIssued(c) {
			if t, ok := learned[c.Out.Token]; !ok || c.End < t {
				learned[c.Out.Token] = c.End
			}
		}
	}
	alive := map[string][]time.Duration{} // session → starts of heartbeats it survived
	for _, c := range calls {
		if c.Method == "Heartbeat" && (c.OK() || c.Out.Reason == reasonStale) {
			alive[c.Session] = append(alive[c.Session], c.Start)
		}
	}
	var problems []string
	for k, in := range finals {
		var lapsed *intentv1.HistoryEntry
		for _, e := range in.GetHistory() {
			switch e.GetKind() {
			case intentv1.HistoryEntry_KIND_LEASE_LAPSED:
				lapsed = e
			case intentv1.HistoryEntry_KIND_ACQUIRED:
				if lapsed == nil {
					continue
				}
				at, ok := learned[e.GetToken()]
				if !ok {
					continue
				}
				for _, start := range alive[lapsed.GetSessionId()] {
					if start > at {
						problems = append(problems, fmt.Sprintf("intent %s: lease %d of session %s passed on as lapsed (token %d handed out at %v), yet the session was kept alive by a heartbeat sent at %v",
							k, lapsed.GetToken(), lapsed.GetSessionId(), e.GetToken(), at.Round(time.Millisecond), start.Round(time.Millisecond)))
						break
					}
				}
				lapsed = nil
			}
		}
	}
	return problems
}
