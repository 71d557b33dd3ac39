package reliability

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// RunFigures are one run's numbers for the report.
type RunFigures struct {
	Name       string
	Operations int
	Intents    int
	Faults     []FaultEvent
	Findings   Findings
	Proof      FaultProof
	Violations int // linearizability: partitions porcupine did not pass
	Duration   time.Duration
}

// Report gathers every run's figures for the summary printed at the end of
// the suite. It is safe for concurrent use.
type Report struct {
	mu   sync.Mutex
	runs []RunFigures
}

// Add records one run.
func (r *Report) Add(f RunFigures) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, f)
}

// Runs is the number of runs recorded.
func (r *Report) Runs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.runs)
}

// String renders the report.
func (r *Report) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops, intents, unknown, resolved, effect, dups, lost, viol, stale, other, misreported int
	faults := map[string]int{}
	var longest time.Duration
	longestRun := "-"
	for _, run := range r.runs {
		ops += run.Operations
		intents += run.Intents
		unknown += run.Findings.Unknown
		resolved += run.Findings.Resolved
		effect += run.Findings.TookEffect
		dups += run.Findings.Duplicates
		lost += run.Findings.Lost
		stale += run.Findings.StaleRefused
		other += run.Findings.Other
		misreported += run.Findings.CreatedMisreported
		viol += run.Violations
		for _, e := range run.Faults {
			faults[e.Kind]++
		}
		for _, e := range run.Proof.Events {
			if e.Recovery > longest {
				longest, longestRun = e.Recovery, fmt.Sprintf("%s, %s", run.Name, e.Kind)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "reliability report\n")
	fmt.Fprintf(&b, "  runs                                 %d\n", len(r.runs))
	fmt.Fprintf(&b, "  operations (recorded calls)          %d\n", ops)
	fmt.Fprintf(&b, "  intents                              %d\n", intents)
	total := 0
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(faults)) {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, faults[k]))
		total += faults[k]
	}
	fmt.Fprintf(&b, "  faults injected                      %d (%s)\n", total, strings.Join(kinds, " "))
	fmt.Fprintf(&b, "  unknown outcomes                     %d, resolved by read-back %d (took effect %d)\n", unknown, resolved, effect)
	fmt.Fprintf(&b, "  stale completes refused              %d\n", stale)
	fmt.Fprintf(&b, "  duplicates                           %d\n", dups)
	fmt.Fprintf(&b, "  lost acknowledged transitions        %d\n", lost)
	fmt.Fprintf(&b, "  linearizability violations           %d\n", viol)
	fmt.Fprintf(&b, "  other invariant violations           %d\n", other)
	fmt.Fprintf(&b, "  own Register answered created=false  %d (must be 0: a lost reply read back)\n", misreported)
	fmt.Fprintf(&b, "  longest recovery after heal          %v (%s)\n", longest.Round(time.Millisecond), longestRun)
	for _, run := range r.runs {
		var seen []string
		for _, e := range run.Proof.Events {
			seen = append(seen, fmt.Sprintf("%s[errors=%d slow=%d recovery=%v]", e.Kind, e.Errors, e.Slow, e.Recovery.Round(time.Millisecond)))
		}
		fmt.Fprintf(&b, "  - %s: %v, %d ops, %d intents, load before fault %d, unknown %d, stale refused %d; %s\n",
			run.Name, run.Duration.Round(100*time.Millisecond), run.Operations, run.Intents, run.Proof.LoadBefore,
			run.Findings.Unknown, run.Findings.StaleRefused, strings.Join(seen, " "))
	}
	return b.String()
}
