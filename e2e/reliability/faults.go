package reliability

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// FaultEvent is one fault a run injected.
type FaultEvent struct {
	// Kind names the fault ("kill-leader", "drop-replies", ...).
	Kind string
	// Detail says where (which member, which link).
	Detail string
	// Injected and Healed are offsets in the run's history; Healed is zero
	// until healed.
	Injected, Healed time.Duration
}

// FaultLog records when a run injected and healed its faults. It is safe
// for concurrent use.
type FaultLog struct {
	rec    *Recorder
	mu     sync.Mutex
	events []*FaultEvent
}

// NewFaultLog records on rec's clock.
func NewFaultLog(rec *Recorder) *FaultLog { return &FaultLog{rec: rec} }

// Inject records that a fault of kind starts now.
func (l *FaultLog) Inject(kind, format string, args ...any) *FaultEvent {
	e := &FaultEvent{Kind: kind, Detail: fmt.Sprintf(format, args...), Injected: l.rec.Since()}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
	return e
}

// Heal records that fault e ended now.
func (l *FaultLog) Heal(e *FaultEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Healed = l.rec.Since()
}

// Events returns a copy of every fault, in injection order.
func (l *FaultLog) Events() []FaultEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]FaultEvent, len(l.events))
	for i, e := range l.events {
		out[i] = *e
	}
	return out
}

// FaultProof is the evidence that a run's faults happened under load and
// that clients noticed them.
type FaultProof struct {
	// LoadBefore counts calls answered OK before the first fault.
	LoadBefore int
	// Spike is the latency that counts as noticing a fault: several times
	// the usual latency before any fault.
	Spike time.Duration
	// Events has one entry per fault.
	Events []EventProof
}

// EventProof is what the calls saw of one fault.
type EventProof struct {
	FaultEvent
	// Errors counts calls during the fault (or shortly after) that failed
	// without a refusal (UNAVAILABLE, DEADLINE_EXCEEDED, a broken call),
	// Slow those answered slower than Spike.
	Errors, Slow int
	// Unavailable counts UNAVAILABLE answers among Errors.
	Unavailable int
	// MaxLatency is the slowest call that overlapped the fault.
	MaxLatency time.Duration
	// Recovery is how long after the heal the first acknowledged
	// transition that started after it was answered; -1 if none was.
	Recovery time.Duration
}

// Seen reports whether any call noticed the fault.
func (e EventProof) Seen() bool { return e.Errors+e.Slow > 0 }

// ProveFaults measures, from the calls, the load before the first fault
// and what each fault did to the calls overlapping it (up to grace after
// its heal).
func ProveFaults(calls []Call, events []FaultEvent, grace time.Duration) FaultProof {
	var p FaultProof
	first := time.Duration(1<<63 - 1)
	for _, e := range events {
		first = min(first, e.Injected)
	}
	var before []time.Duration
	for _, c := range calls {
		if c.End < first && c.OK() {
			p.LoadBefore++
			if c.Method != "Heartbeat" {
				before = append(before, c.Latency())
			}
		}
	}
	p.Spike = 250 * time.Millisecond
	if len(before) > 0 {
		slices.Sort(before)
		p.Spike = max(p.Spike, 5*before[len(before)*95/100])
	}
	for _, e := range events {
		ep := EventProof{FaultEvent: e, Recovery: -1}
		until := e.Healed + grace
		if e.Healed == 0 {
			until = 1<<63 - 1
		}
		for _, c := range calls {
			if c.End >= e.Injected && c.Start <= until {
				ep.MaxLatency = max(ep.MaxLatency, c.Latency())
				switch {
				case c.Out.Unknown:
					ep.Errors++
					if c.Code == codes.Unavailable {
						ep.Unavailable++
					}
				case c.Latency() >= p.Spike:
					ep.Slow++
				}
			}
			if e.Healed > 0 && c.Start >= e.Healed && c.Transition() {
				if r := c.End - e.Healed; ep.Recovery < 0 || r < ep.Recovery {
					ep.Recovery = r
				}
			}
		}
		p.Events = append(p.Events, ep)
	}
	return p
}

// Problems says why the proof does not hold: no fault at all, too little
// load before the first, a fault no call noticed (with anySeen, only when
// none was noticed), or no transition acknowledged after a heal.
func (p FaultProof) Problems(minLoad int, anySeen bool) []string {
	var out []string
	if len(p.Events) == 0 {
		return []string{"the run injected no fault"}
	}
	if p.LoadBefore < minLoad {
		out = append(out, fmt.Sprintf("%d calls answered OK before the first fault, want at least %d", p.LoadBefore, minLoad))
	}
	seen := 0
	for _, e := range p.Events {
		if e.Seen() {
			seen++
		} else if !anySeen {
			out = append(out, fmt.Sprintf("no call saw %s (%s) at %v–%v: no error, none slower than %v", e.Kind, e.Detail, e.Injected, e.Healed, p.Spike))
		}
		if e.Healed > 0 && e.Recovery < 0 {
			out = append(out, fmt.Sprintf("no transition was acknowledged after %s healed", e.Kind))
		}
	}
	if seen == 0 && anySeen {
		out = append(out, fmt.Sprintf("no call saw any of the %d faults", len(p.Events)))
	}
	return out
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
