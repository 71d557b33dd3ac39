package reliability

import (
	"fmt"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// FinishKeys is Finish for a run that drives its intents itself rather
// than through a Load: every key must be COMPLETED already; it reads them
// all back and checks the world (one order per intent), the acknowledged
// past, the fault proof and linearizability with porcupine, and adds the
// run to the report. It returns the run's figures and the intents as read
// back, with their histories.
//
// noticed, when set, counts further evidence that a fault was seen by the
// calls: a fault a client sees as a clear refusal (RESOURCE_EXHAUSTED), not
// as an error or a slow answer, counts as seen when noticed finds some.
func (e *Env) FinishKeys(keys []string, opt FinishOptions, noticed func(FaultEvent, []Call) int) (RunFigures, map[string]*intentv1.Intent) {
	t := e.T
	t.Helper()
	if opt.MinLoad == 0 {
		opt.MinLoad = 50
	}
	if opt.Grace == 0 {
		opt.Grace = 2 * time.Second
	}
	finals := e.readBack(keys)
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
	calls := e.Rec.Calls()
	f := Analyze(calls, finals, e.Merchant.ByReference(), RefOrder)
	for i, p := range f.Problems {
		if i == 25 {
			t.Errorf("... and %d more problems", len(f.Problems)-i)
			break
		}
		t.Error(p)
	}

	events := e.Faults.Events()
	proof := ProveFaults(calls, events, opt.Grace)
	extra := map[int]int{}
	if noticed != nil {
		for i, ev := range events {
			extra[i] = noticed(ev, calls)
		}
	}
	for _, p := range proofProblems(proof, opt.MinLoad, extra) {
		t.Error("fault proof: " + p)
	}

	lin, err := CheckLinearizable(calls, e.Artifacts, t.Name(), time.Minute)
	violations := 0
	switch {
	case err != nil:
		t.Errorf("linearizability check: %v", err)
	case lin.Result == porcupine.Illegal:
		violations = 1
		t.Errorf("linearizability: the history of %d operations on %d intents is not linearizable (intents %v); visualization: %s%s\nthe calls on %s:\n%s",
			lin.Operations, lin.Partitions, lin.Failing, lin.Visualization, e.keepHint(), lin.Failing[0], lin.Story)
	case lin.Result != porcupine.Ok:
		t.Errorf("linearizability: porcupine could not decide (%s) within its time; visualization: %s%s", lin.Result, lin.Visualization, e.keepHint())
	}

	run := RunFigures{
		Name: t.Name(), Operations: len(calls), Intents: len(finals), Faults: events,
		Findings: f, Proof: proof, Violations: violations, Duration: time.Since(e.started),
	}
	e.report.Add(run)
	var seen []string
	for i, ep := range proof.Events {
		seen = append(seen, fmt.Sprintf("%s@%v–%v (%s): errors=%d unavailable=%d slow=%d refused=%d max=%v recovery=%v",
			ep.Kind, ep.Injected.Round(time.Millisecond), ep.Healed.Round(time.Millisecond), ep.Detail,
			ep.Errors, ep.Unavailable, ep.Slow, extra[i], ep.MaxLatency.Round(time.Millisecond), ep.Recovery.Round(time.Millisecond)))
	}
	t.Logf("run: %d calls, %d intents, %d orders, load before fault %d; porcupine %s on %d ops",
		len(calls), len(finals), f.Orders, proof.LoadBefore, lin.Result, lin.Operations)
	t.Logf("faults: %s", strings.Join(seen, "; "))
	if f.CreatedMisreported > 0 {
		t.Errorf("%d intents were created by a Register that answered created=false: a read-back after a lost reply must recognize its own request id", f.CreatedMisreported)
	}
	t.Logf("findings: unknown=%d resolved=%d took-effect=%d lapsed=%d stale-reports-refused=%d (completes %d) duplicates=%d lost=%d other=%d",
		f.Unknown, f.Resolved, f.TookEffect, f.Lapsed, f.StaleReports, f.StaleRefused, f.Duplicates, f.Lost, f.Other)
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
