package reliability

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Worker processes fail: SIGKILLed between effect and report, SIGSTOPped
// past their session's TTL.

// awaitEffect waits for the effect (or answer) w was told to hold.
func awaitEffect(t *testing.T, w *WorkerProc, held <-chan Effect) Effect {
	t.Helper()
	select {
	case ef := <-held:
		return ef
	case <-time.After(20 * time.Second):
		t.Fatalf("worker process %s held nothing within 20s; its last lines:\n%s", w.Name, w.Logs())
		return Effect{}
	}
}

// awaitSettled waits until some worker saw key COMPLETED.
func awaitSettled(t *testing.T, load *Load, key string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !load.isSettled(key) {
		if time.Now().After(deadline) {
			t.Fatalf("no worker completed %s within %v", key, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// struckBy counts what the calls show of a strike at a worker process that
// held key: a live worker's Acquire answered RECONCILE (it had to find out
// what the struck process left behind), and a late report of the struck
// lease refused as stale.
func struckBy(key string, token uint64, ev FaultEvent, calls []Call) int {
	n := 0
	for _, c := range calls {
		if c.In.Key != key || c.Start < ev.Injected {
			continue
		}
		switch {
		case c.In.Kind == OpAcquire && c.OK() && c.Out.Outcome == intentv1.Outcome_OUTCOME_RECONCILE:
			n++
		case c.In.Kind.report() && c.In.Token == token && c.Out.Reason == reasonStale:
			n++
		}
	}
	return n
}

// Worker processes killed and paused. Four worker goroutines and three
// worker processes (the test binary re-executed, each with its own
// session, TTL 3s) share the deliveries; every call the processes make is
// in the checked history. Four times, p0 or p1 is SIGKILLed right after the
// merchant answered its order and before it reported it, and restarted:
// the key goes back to the queue, a live worker waits out the dead
// session's lease, reconciles, finds the order and completes the intent
// with it. Once more p0 is killed after its Complete was answered OK but
// before it read the answer: the call is in the history as an unknown
// outcome (porcupine follows both fates), and the read-back shows it took
// effect. Meanwhile p2 is SIGSTOPped between effect and report, past its
// session TTL, while the intent is delivered again: a live worker takes it
// over the same way; then p2 continues and reports its result under its
// old lease, and that Complete is refused as stale and kept as evidence.
// Every intent ends with exactly one order.
func TestWorkerProcessesKilledAndPaused(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	load := e.StartLoad(LoadConfig{Workers: 4, Redeliver: 20, Seed: harness.Seed(), WaitInProgress: 5 * time.Second})
	procs := e.StartWorkerProcs(load, 3)
	e.WaitOK(100, 20*time.Second)
	for _, w := range procs.Procs { // every process serves before any fault
		deadline := time.Now().Add(20 * time.Second)
		for w.Stats().Runs == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("worker process %s finished no Run within 20s; its last lines:\n%s", w.Name, w.Logs())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	strikes := map[string]Effect{} // fault detail → the effect struck
	noticed := func(ev FaultEvent, calls []Call) int {
		ef, ok := strikes[ev.Detail]
		if !ok {
			return 0
		}
		return struckBy(ef.Key, ef.Token, ev, calls)
	}

	paused := procs.Procs[2]
	pef := awaitEffect(t, paused, paused.HoldNextEffect())
	pev := e.Faults.Inject("pause-worker-process", "%s SIGSTOPped after placing the order of %s (token %d), before reporting it, for longer than its session TTL %v",
		paused.Name, pef.Key, pef.Token, load.cfg.TTL)
	if err := paused.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	strikes[pev.Detail] = pef
	load.Deliver(pef.Key) // the queue's redelivery: another worker will take over

	var killed []Effect
	for i := range 4 {
		w := procs.Procs[i%2]
		ef := awaitEffect(t, w, w.HoldNextEffect())
		ev := e.Faults.Inject("kill-worker-process", "%s SIGKILLed after placing the order of %s (token %d), before reporting it; restarted", w.Name, ef.Key, ef.Token)
		w.Kill()
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		e.Faults.Heal(ev)
		strikes[ev.Detail] = ef
		killed = append(killed, ef)
		time.Sleep(300 * time.Millisecond)
	}

	// Once more, killed with its Complete done at intentd and the answer
	// in hand, unread: a call that took effect and never ended.
	w := procs.Procs[0]
	held, err := w.HoldNextAnswer("Complete")
	if err != nil {
		t.Fatal(err)
	}
	aef := awaitEffect(t, w, held)
	aev := e.Faults.Inject("kill-worker-process", "%s SIGKILLed with the answer to its Complete of %s (token %d) unread; restarted", w.Name, aef.Key, aef.Token)
	w.Kill()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(aev)
	strikes[aev.Detail] = aef

	awaitSettled(t, load, pef.Key, 20*time.Second)
	time.Sleep(time.Until(stopped.Add(load.cfg.TTL + time.Second)))
	if err := paused.Release(pef.Key); err != nil {
		t.Fatal(err)
	}
	if err := paused.Cont(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(pev)
	t.Logf("%s stopped %v holding %s; a live worker completed it meanwhile", paused.Name, time.Since(stopped).Round(time.Millisecond), pef.Key)
	time.Sleep(2 * time.Second)
	run := e.Finish(load, FinishOptions{Noticed: noticed})
	st := procs.Stats()
	t.Logf("worker processes: %s", st)

	// The struck intents, as they ended.
	keys := []string{pef.Key, aef.Key}
	for _, ef := range killed {
		keys = append(keys, ef.Key)
	}
	finals := e.readBack(keys)
	orders := e.Merchant.ByReference()
	calls := e.Rec.Calls()
	strikesOf := func(ef Effect) (completes, staleRefused int) {
		for _, c := range calls {
			if c.Client == ef.Client && c.In.Kind == OpComplete && c.In.Key == ef.Key && c.In.Token == ef.Token {
				completes++
				if c.Out.Reason == reasonStale {
					staleRefused++
				}
			}
		}
		return completes, staleRefused
	}
	check := func(what string, ef Effect) *intentv1.Intent {
		in := finals[ef.Key]
		if n := len(orders[ef.Key]); n != 1 {
			t.Errorf("%s %s: the merchant holds %d orders, want 1", what, ef.Key, n)
		}
		lapsed := false
		for _, h := range entriesOf(in, intentv1.HistoryEntry_KIND_LEASE_LAPSED) {
			lapsed = lapsed || h.GetToken() == ef.Token
		}
		if !lapsed {
			t.Errorf("%s %s: no LEASE_LAPSED entry for token %d in its history:\n%s", what, ef.Key, ef.Token, historyText(in))
		}
		if in.GetState() != intentv1.State_STATE_COMPLETED || hasEntry(in, intentv1.HistoryEntry_KIND_COMPLETED, ef.Token, true) {
			t.Errorf("%s %s: want COMPLETED by a later lease than %d:\n%s", what, ef.Key, ef.Token, historyText(in))
		}
		return in
	}
	for _, ef := range killed {
		check("killed", ef)
		if n, _ := strikesOf(ef); n != 0 {
			t.Errorf("killed %s: the struck process sent %d Completes of token %d: it was not killed between effect and report", ef.Key, n, ef.Token)
		}
	}
	// The Complete whose answer died with its process: recorded as an
	// unknown outcome, and it took effect.
	cut := 0
	for _, c := range calls {
		if c.Client == aef.Client && c.In.Kind == OpComplete && c.In.Key == aef.Key && c.In.Token == aef.Token {
			if !c.Out.Unknown || c.Reason != reasonProcessEnded {
				t.Errorf("killed in the answer %s: its Complete of token %d was recorded %s (%s), want an unknown outcome (%s)", aef.Key, aef.Token, describeOp(c.In, c.Out), c.Reason, reasonProcessEnded)
			}
			cut++
		}
	}
	if cut != 1 {
		t.Errorf("killed in the answer %s: %d Completes of token %d recorded, want 1", aef.Key, cut, aef.Token)
	}
	if ain := finals[aef.Key]; !hasEntry(ain, intentv1.HistoryEntry_KIND_COMPLETED, aef.Token, true) || len(orders[aef.Key]) != 1 {
		t.Errorf("killed in the answer %s: want COMPLETED under token %d with one order (the merchant holds %v):\n%s", aef.Key, aef.Token, orders[aef.Key], historyText(ain))
	}
	if st.CutShort == 0 {
		t.Errorf("no call was cut short by a kill")
	}

	in := check("paused", pef)
	completes, refused := strikesOf(pef)
	if completes == 0 || refused != completes {
		t.Errorf("paused %s: the stopped process sent %d Completes of token %d after it continued, %d refused as stale; want some, all refused", pef.Key, completes, pef.Token, refused)
	}
	if !hasEntry(in, intentv1.HistoryEntry_KIND_COMPLETED, pef.Token, false) {
		t.Errorf("paused %s: its late Complete (token %d) is not kept as evidence in the history:\n%s", pef.Key, pef.Token, historyText(in))
	}
	if run.Findings.StaleRefused == 0 {
		t.Errorf("no late Complete was refused as stale")
	}
	if st.Redelivered < len(killed) {
		t.Errorf("%d keys were given back by dead processes, want at least %d", st.Redelivered, len(killed))
	}
	t.Logf("struck: paused %s (token %d, %d late Completes refused); killed between effect and report %s; killed in the answer %s (token %d)",
		pef.Key, pef.Token, refused, effectKeys(killed), aef.Key, aef.Token)
	var seen []string
	for _, ev := range e.Faults.Events() {
		seen = append(seen, fmt.Sprintf("%s %s: %d", ev.Kind, strikes[ev.Detail].Key, noticed(ev, calls)))
	}
	t.Logf("calls that noticed each strike (a live worker's RECONCILE, a stale report refused): %s", strings.Join(seen, "; "))
}

func effectKeys(efs []Effect) string {
	var s []string
	for _, ef := range efs {
		s = append(s, fmt.Sprintf("%s (token %d)", ef.Key, ef.Token))
	}
	return strings.Join(s, ", ")
}

// historyText is an intent's history, one entry a line.
func historyText(in *intentv1.Intent) string {
	var b strings.Builder
	for _, h := range in.GetHistory() {
		fmt.Fprintf(&b, "  %s token=%d accepted=%t session=%s reason=%q\n",
			strings.TrimPrefix(h.GetKind().String(), "KIND_"), h.GetToken(), h.GetAccepted(), h.GetSessionId(), h.GetReason())
	}
	return b.String()
}
