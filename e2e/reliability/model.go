package reliability

import (
	"fmt"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/vocab"
)

// OpKind is what a recorded call did to one intent, as the model sees it.
type OpKind uint8

// The calls the model knows. Held is one lease a Heartbeat named: the call
// checks that lease's token against the intent.
const (
	OpRegister OpKind = iota + 1
	OpAcquire
	OpComplete
	OpMarkUnknown
	OpRelease
	OpFail
	OpEscalate
	OpGet
	OpHeld
)

var opNames = map[OpKind]string{
	OpRegister: "Register", OpAcquire: "Acquire", OpComplete: "Complete", OpMarkUnknown: "MarkUnknown",
	OpRelease: "Release", OpFail: "Fail", OpEscalate: "Escalate", OpGet: "Get", OpHeld: "Heartbeat(lease)",
}

func (k OpKind) String() string { return opNames[k] }

// report reports whether k is a fenced report (carries a token, may change
// the state).
func (k OpKind) report() bool {
	return k == OpComplete || k == OpMarkUnknown || k == OpRelease || k == OpFail || k == OpEscalate
}

// Input is one call on one intent.
type Input struct {
	Kind OpKind
	Key  string
	// Session and Request identify an Acquire: a retry with both the same
	// gets the same lease back.
	Session, Request string
	// Token is the token a report or a heartbeat's lease names.
	Token uint64
	// Result is a Complete's result, canonically encoded (resultString).
	Result string
}

// Output is what the call returned.
type Output struct {
	// Unknown: the call ended without saying whether intentd acted
	// (UNAVAILABLE, DEADLINE_EXCEEDED, a cancelled or broken call).
	Unknown bool
	// Reason is "" for success, else the refusal's ErrorInfo reason (or
	// its gRPC code's name when it carries none).
	Reason string
	// Current is the current token a STALE_TOKEN refusal names.
	Current uint64
	// Created is Register's answer.
	Created bool
	// Outcome, Token and Holder are Acquire's answer: the lease's token and
	// holder session (EXECUTE, RECONCILE, IN_PROGRESS).
	Outcome intentv1.Outcome
	// State is Get's answer (a lapsed lease reads UNKNOWN), with Token
	// (the current lease's), Live and Holder.
	State  intentv1.State
	Token  uint64
	Live   bool
	Holder string
	// Result is the stored result of a COMPLETED intent (Acquire, Get).
	Result string
}

// Refusal reasons the model tells apart, as the wire spells the proto's.
var (
	reasonNotFound          = vocab.Reason(intentv1.ErrorReason_ERROR_REASON_INTENT_NOT_FOUND)
	reasonSessionNotFound   = vocab.Reason(intentv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
	reasonStale             = vocab.Reason(intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN)
	reasonInvalidTransition = vocab.Reason(intentv1.ErrorReason_ERROR_REASON_INVALID_TRANSITION)
	reasonResultMismatch    = vocab.Reason(intentv1.ErrorReason_ERROR_REASON_RESULT_MISMATCH)
	reasonFingerprint       = vocab.Reason(intentv1.ErrorReason_ERROR_REASON_FINGERPRINT_MISMATCH)
	reasonInvalidField      = vocab.Reason(intentv1.ErrorReason_ERROR_REASON_INVALID_FIELD)
)

// modelState is one intent as the model knows it. It is comparable, so
// porcupine's default equality works on it.
type modelState struct {
	Exists bool
	State  intentv1.State // as stored: a lapsed lease stays IN_PROGRESS here
	// Token is the newest token issued; when Inexact a lease was issued by a
	// call whose answer was lost, and Token is only a lower bound of its
	// token until a later answer names it.
	Token   uint64
	Inexact bool
	Mode    intentv1.LeaseMode
	// Session and Request issued the current lease.
	Session, Request string
	// Lapsed: a read showed the current lease lapsed; it never comes back.
	Lapsed bool
	// Result is the COMPLETED result.
	Result string
	// Applied lists the reports accepted, "|kind:token|...", so that a retry
	// of an applied report is recognized as one.
	Applied string
}

func appliedTag(k OpKind, t uint64) string { return fmt.Sprintf("|%d:%d|", k, t) }

func (s modelState) applied(k OpKind, t uint64) bool {
	return strings.Contains(s.Applied, appliedTag(k, t))
}

// current checks that t is the intent's newest token; an inexact token is
// resolved to t when t may be it.
func (s modelState) current(t uint64) (modelState, bool) {
	if !s.Inexact {
		return s, t == s.Token
	}
	if t <= s.Token {
		return s, false
	}
	s.Token, s.Inexact = t, false
	return s, true
}

// lease issues a new lease of mode to in's caller with token t (0: a lease
// whose token nobody saw).
func (s modelState) lease(in Input, mode intentv1.LeaseMode, t uint64) modelState {
	s.State, s.Mode, s.Session, s.Request, s.Lapsed = intentv1.State_STATE_IN_PROGRESS, mode, in.Session, in.Request, false
	if t == 0 {
		s.Inexact = true // Token stays the lower bound
	} else {
		s.Token, s.Inexact = t, false
	}
	return s
}

func target(k OpKind) intentv1.State {
	switch k {
	case OpComplete:
		return intentv1.State_STATE_COMPLETED
	case OpMarkUnknown:
		return intentv1.State_STATE_UNKNOWN
	case OpRelease:
		return intentv1.State_STATE_PENDING
	case OpFail:
		return intentv1.State_STATE_FAILED
	default:
		return intentv1.State_STATE_NEEDS_REVIEW
	}
}

// open reports whether a report under the current token may apply.
func (s modelState) open() bool {
	return s.State == intentv1.State_STATE_IN_PROGRESS || s.State == intentv1.State_STATE_UNKNOWN
}

// accept applies report in, under the current token.
func (s modelState) accept(in Input) modelState {
	s.State = target(in.Kind)
	if in.Kind == OpComplete {
		s.Result = in.Result
	}
	s.Applied += appliedTag(in.Kind, in.Token)
	return s
}

// step is the model's transition: every state the intent may be in after
// the call, given what it returned; none if the answer is impossible.
func step(s modelState, in Input, out Output) []modelState {
	if out.Unknown {
		return append([]modelState{s}, effects(s, in)...)
	}
	if next, ok := apply(s, in, out); ok {
		return []modelState{next}
	}
	return nil
}

// effects lists what a call whose answer was lost may have done.
func effects(s modelState, in Input) []modelState {
	switch {
	case in.Kind == OpRegister:
		if !s.Exists {
			s.Exists, s.State = true, intentv1.State_STATE_PENDING
			return []modelState{s}
		}
	case !s.Exists:
	case in.Kind == OpAcquire:
		switch s.State {
		case intentv1.State_STATE_PENDING:
			return []modelState{s.lease(in, intentv1.LeaseMode_LEASE_MODE_EXECUTE, 0)}
		case intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_IN_PROGRESS:
			return []modelState{s.lease(in, intentv1.LeaseMode_LEASE_MODE_RECONCILE, 0)}
		}
	case in.Kind.report():
		if s.applied(in.Kind, in.Token) {
			return nil
		}
		if n, ok := s.current(in.Token); ok && n.open() {
			return []modelState{n.accept(in)}
		}
	}
	return nil
}

// apply is the one next state of a call with a known answer, and whether
// the answer is possible at all. This is where the invariants live:
//
//   - EXECUTE only from PENDING: at most one lease executes, and an expired
//     lease never yields EXECUTE;
//   - a new lease's token is above every token before it;
//   - a report under an older token is refused (STALE_TOKEN naming the
//     current one) and changes nothing;
//   - COMPLETED is final, its result fixed: every Acquire and Get after it
//     returns that result.
func apply(s modelState, in Input, out Output) (modelState, bool) {
	if in.Kind == OpRegister {
		switch out.Reason {
		case "":
			// Created is not checked here: intentd answers created=false
			// when its own write's commit was ambiguous and its read-back
			// found the record (see Findings.CreatedMisreported).
			if !s.Exists {
				s.Exists, s.State = true, intentv1.State_STATE_PENDING
			}
			return s, true
		case reasonFingerprint:
			return s, s.Exists
		}
		return s, true // refused before acting
	}
	if !s.Exists {
		return s, out.Reason == reasonNotFound
	}
	switch out.Reason {
	case "":
	case reasonNotFound:
		return s, false
	case reasonSessionNotFound:
		return s, in.Kind == OpAcquire || in.Kind == OpHeld
	}
	switch {
	case in.Kind == OpAcquire:
		return applyAcquire(s, in, out)
	case in.Kind.report():
		return applyReport(s, in, out)
	case in.Kind == OpGet:
		return applyGet(s, out)
	case in.Kind == OpHeld:
		switch out.Reason {
		case "":
			return s.current(in.Token)
		case reasonStale:
			n, ok := s.current(out.Current)
			return n, ok && in.Token < n.Token
		}
		return s, true
	}
	return s, false
}

func modeOf(o intentv1.Outcome) intentv1.LeaseMode {
	if o == intentv1.Outcome_OUTCOME_RECONCILE {
		return intentv1.LeaseMode_LEASE_MODE_RECONCILE
	}
	return intentv1.LeaseMode_LEASE_MODE_EXECUTE
}

func applyAcquire(s modelState, in Input, out Output) (modelState, bool) {
	if out.Reason != "" {
		return s, true // refused before acting (fingerprint, limits)
	}
	inProgress := s.State == intentv1.State_STATE_IN_PROGRESS
	switch out.Outcome {
	case intentv1.Outcome_OUTCOME_EXECUTE, intentv1.Outcome_OUTCOME_RECONCILE:
		mode := modeOf(out.Outcome)
		if inProgress && !s.Lapsed && s.Session == in.Session && s.Request == in.Request && s.Mode == mode {
			// The same request again: the same lease.
			if n, ok := s.current(out.Token); ok {
				return n, true
			}
		}
		var allowed bool
		if mode == intentv1.LeaseMode_LEASE_MODE_EXECUTE {
			allowed = s.State == intentv1.State_STATE_PENDING
		} else {
			// From UNKNOWN, or from IN_PROGRESS once its holder lapsed
			// (which no answer needs to have shown yet).
			allowed = s.State == intentv1.State_STATE_UNKNOWN || inProgress
		}
		if !allowed || out.Token <= s.Token || out.Holder != in.Session {
			return s, false
		}
		return s.lease(in, mode, out.Token), true
	case intentv1.Outcome_OUTCOME_IN_PROGRESS:
		if !inProgress || s.Lapsed || (s.Session == in.Session && s.Request == in.Request) || out.Holder != s.Session {
			return s, false
		}
		return s.current(out.Token)
	case intentv1.Outcome_OUTCOME_COMPLETED:
		return s, s.State == intentv1.State_STATE_COMPLETED && out.Result == s.Result
	case intentv1.Outcome_OUTCOME_FAILED:
		return s, s.State == intentv1.State_STATE_FAILED
	case intentv1.Outcome_OUTCOME_CANCELLED:
		return s, s.State == intentv1.State_STATE_CANCELLED
	case intentv1.Outcome_OUTCOME_NEEDS_REVIEW:
		return s, s.State == intentv1.State_STATE_NEEDS_REVIEW
	}
	return s, false // EXPIRED: nothing here outlives its retention
}

func applyReport(s modelState, in Input, out Output) (modelState, bool) {
	applied := s.applied(in.Kind, in.Token)
	switch out.Reason {
	case "":
		if applied {
			// A retry of an accepted report: replayed, same result only.
			return s, in.Kind != OpComplete || in.Result == s.Result
		}
		n, ok := s.current(in.Token)
		if !ok {
			return s, false
		}
		if in.Kind == OpEscalate && n.State == intentv1.State_STATE_NEEDS_REVIEW {
			return n, true // escalating what waits for review changes nothing
		}
		if !n.open() {
			return s, false
		}
		return n.accept(in), true
	case reasonStale:
		if applied {
			return s, false
		}
		n, ok := s.current(out.Current)
		return n, ok && in.Token < n.Token
	case reasonInvalidTransition:
		if applied {
			return s, false
		}
		n, ok := s.current(in.Token)
		return n, ok && !n.open() && !(in.Kind == OpComplete && n.State == intentv1.State_STATE_COMPLETED)
	case reasonResultMismatch:
		if in.Kind != OpComplete {
			return s, false
		}
		if applied {
			return s, in.Result != s.Result
		}
		n, ok := s.current(in.Token)
		return n, ok && n.State == intentv1.State_STATE_COMPLETED
	case reasonInvalidField:
		// "token never issued": only a token above the newest.
		return s, !s.Inexact && in.Token > s.Token
	}
	return s, true // another refusal: nothing changed
}

func applyGet(s modelState, out Output) (modelState, bool) {
	if out.Reason != "" {
		return s, true
	}
	n, ok := s.current(out.Token)
	if !ok {
		return s, false
	}
	switch s.State {
	case intentv1.State_STATE_IN_PROGRESS:
		switch out.State {
		case intentv1.State_STATE_IN_PROGRESS:
			return n, !s.Lapsed && out.Live && out.Holder == s.Session
		case intentv1.State_STATE_UNKNOWN:
			// The holder's session lapsed: it stays lapsed.
			n.Lapsed = true
			return n, !out.Live
		}
		return s, false
	case intentv1.State_STATE_COMPLETED:
		return n, out.State == s.State && out.Result == s.Result
	}
	return n, out.State == s.State
}

// Model is the porcupine model of one intent's state machine, partitioned
// by intent key (see apply for the invariants it encodes). A call with an
// unknown outcome may or may not have taken effect; the model follows both.
var Model = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(Input).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		slices.Sort(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{modelState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		var out []interface{}
		for _, s := range step(state.(modelState), input.(Input), output.(Output)) {
			out = append(out, s)
		}
		return out
	},
	DescribeOperation: func(input, output interface{}) string {
		return describeOp(input.(Input), output.(Output))
	},
	DescribeState: func(state interface{}) string { return describeState(state.(modelState)) },
}).ToModel()

func describeState(s modelState) string {
	if !s.Exists {
		return "absent"
	}
	st := strings.TrimPrefix(s.State.String(), "STATE_")
	tok := fmt.Sprint(s.Token)
	if s.Inexact {
		tok = ">" + tok
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s t=%s", st, tok)
	if s.State == intentv1.State_STATE_IN_PROGRESS {
		fmt.Fprintf(&b, " %s by %s", strings.TrimPrefix(s.Mode.String(), "LEASE_MODE_"), short(s.Session))
		if s.Lapsed {
			b.WriteString(" (lapsed)")
		}
	}
	if s.Result != "" {
		fmt.Fprintf(&b, " result=%s", s.Result)
	}
	return b.String()
}

func describeOp(in Input, out Output) string {
	var b strings.Builder
	b.WriteString(in.Kind.String())
	switch {
	case in.Kind == OpAcquire:
		fmt.Fprintf(&b, "(s=%s r=%s)", short(in.Session), short(in.Request))
	case in.Kind.report() || in.Kind == OpHeld:
		fmt.Fprintf(&b, "(t=%d", in.Token)
		if in.Result != "" {
			fmt.Fprintf(&b, " %s", in.Result)
		}
		b.WriteString(")")
	}
	b.WriteString(" → ")
	switch {
	case out.Unknown:
		b.WriteString("unknown")
	case out.Reason == reasonStale:
		fmt.Fprintf(&b, "STALE_TOKEN (current %d)", out.Current)
	case out.Reason != "":
		b.WriteString(out.Reason)
	case in.Kind == OpRegister:
		fmt.Fprintf(&b, "created=%t", out.Created)
	case in.Kind == OpAcquire:
		fmt.Fprintf(&b, "%s", strings.TrimPrefix(out.Outcome.String(), "OUTCOME_"))
		if out.Token != 0 {
			fmt.Fprintf(&b, " t=%d by %s", out.Token, short(out.Holder))
		}
		if out.Result != "" {
			fmt.Fprintf(&b, " %s", out.Result)
		}
	case in.Kind == OpGet:
		fmt.Fprintf(&b, "%s t=%d live=%t", strings.TrimPrefix(out.State.String(), "STATE_"), out.Token, out.Live)
		if out.Result != "" {
			fmt.Fprintf(&b, " %s", out.Result)
		}
	default:
		b.WriteString("ok")
	}
	return b.String()
}

// short abbreviates a session or request id for display.
func short(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}
