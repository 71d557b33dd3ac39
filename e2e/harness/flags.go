package harness

import (
	"flag"
	"time"
)

// The flags both suites share: one seed, one soak switch.
var (
	seedFlag = flag.Uint64("seed", 1, "seed of every seeded fault plan and workload (printed by each run)")
	soakFlag = flag.Bool("soak", false, "run the long forms: e2e's TestChaos at ten times its size, the reliability suite's mixed-fault TestSoak for -soak-duration")
	soakFor  = flag.Duration("soak-duration", time.Hour, "how long the reliability suite's TestSoak runs with -soak")
)

// Seed is -seed: what a run's fault plan and workload are drawn from.
func Seed() uint64 { return *seedFlag }

// Soak is -soak: run the long forms of the seeded scenarios.
func Soak() bool { return *soakFlag }

// SoakDuration is -soak-duration.
func SoakDuration() time.Duration { return *soakFor }
