package reliability

import (
	"fmt"

	"google.golang.org/grpc/codes"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// FinishKeys is Finish for a run that drives its intents itself rather
// than through a Load: every key must be COMPLETED already; it reads them
// all back and checks the world (one order per intent), the acknowledged
// past, the fault proof and linearizability with porcupine, and adds the
// run to the report. It returns the run's figures and the intents as read
// back, with their histories. A fault a client sees as a clear refusal
// (RESOURCE_EXHAUSTED), not as an error or a slow answer, counts as seen
// when opt.Noticed finds some.
func (e *Env) FinishKeys(keys []string, opt FinishOptions) (RunFigures, map[string]*intentv1.Intent) {
	t := e.T
	t.Helper()
	run, finals := e.verify(keys, opt)
	notDone := 0
	for _, k := range keys {
		if in, ok := finals[k]; ok && in.GetState() != intentv1.State_STATE_COMPLETED {
			notDone++
			if notDone <= 5 {
				t.Errorf("intent %s ended %s, want COMPLETED", k, in.GetState())
			}
		}
	}
	if notDone > 5 {
		t.Errorf("... %d intents in all not COMPLETED", notDone)
	}
	return run, finals
}

// proofProblems is FaultProof.Problems (every fault must be seen) where a
// fault also counts as seen when extra names calls that noticed it.
func proofProblems(p FaultProof, minLoad int, extra map[int]int) []string {
	var out []string
	if len(p.Events) == 0 {
		return []string{"the run injected no fault"}
	}
	if p.LoadBefore < minLoad {
		out = append(out, fmt.Sprintf("%d calls answered OK before the first fault, want at least %d", p.LoadBefore, minLoad))
	}
	for i, e := range p.Events {
		if !e.Seen() && extra[i] == 0 {
			out = append(out, fmt.Sprintf("no call saw %s (%s) at %v–%v: no error, none slower than %v, no refusal it caused", e.Kind, e.Detail, e.Injected, e.Healed, p.Spike))
		}
		if e.Healed > 0 && e.Recovery < 0 {
			out = append(out, fmt.Sprintf("no transition was acknowledged after %s healed", e.Kind))
		}
	}
	return out
}

// refusedWith counts the calls refused with code and reason while ev lasted.
func refusedWith(code codes.Code, reason string) func(FaultEvent, []Call) int {
	return func(ev FaultEvent, calls []Call) int {
		n := 0
		for _, c := range calls {
			if c.Code == code && c.Reason == reason && c.End >= ev.Injected && (ev.Healed == 0 || c.Start <= ev.Healed) {
				n++
			}
		}
		return n
	}
}
