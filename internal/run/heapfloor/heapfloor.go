// Package heapfloor keeps the Go collector's heap goal at or above a floor:
// a process whose live heap is small collects as often as GOGC says for
// that small heap, however much memory the machine would give it.
//
// Go has no setting for a smallest heap goal. With GOGC=100 the collector
// starts a cycle when the heap has grown by what was live after the last
// one, so an intentd with 20 MiB live and a call that allocates 30 KB
// collects every few hundred calls; each cycle takes a quarter of the
// CPUs for its marking and slows the calls that allocate during it, which
// is what a p99 at one client shows. A floor (intentd's default is 128
// MiB) costs a fixed amount of memory under load (the heap grows to the
// floor before a cycle) and nothing per record kept: above it, GOGC
// governs as before.
//
// Hold raises GOGC after each cycle to what makes the goal reach the
// floor, and never lowers it below the GOGC the process started with. An
// operator who set GOGC (or GOGC=off) in the environment keeps it:
// Hold then does nothing. GOMEMLIMIT still caps the heap: under a memory
// limit below the floor, the collector runs at the limit as it always
// does.
package heapfloor

import (
	"context"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/intentd/intentd/internal/core/periodic"
)

// Default is intentd's floor (--gc-heap-floor): docs/PERFORMANCE.md,
// "The collector's floor", says how it was chosen.
const Default = 128 << 20

// Every is how often Hold reads the collector's figures: a new cycle is
// seen within it.
const Every = 100 * time.Millisecond

// maxPercent bounds the GOGC Hold sets (a live heap of a few KiB under a
// floor of GiBs would ask for millions).
const maxPercent = 100_000

// Percent is the GOGC that makes the collector's heap goal at least floor
// bytes when live bytes are live after a cycle and scannable stacks and
// globals roots bytes, and never less than base: Go's goal is live +
// (live + roots) × GOGC/100.
func Percent(floor, live, roots uint64, base int) int {
	if base < 0 || floor <= live {
		return base
	}
	grow := float64(floor-live) * 100 / float64(max(live+roots, 1))
	return max(base, int(min(math.Ceil(grow), maxPercent)))
}

// Chosen reports whether the environment sets GOGC: the operator's choice,
// which Hold leaves alone.
func Chosen() bool { return os.Getenv("GOGC") != "" }

// Hold keeps the heap goal at least floor bytes until ctx ends, then puts
// the process's GOGC back. With GOGC set in the environment, or a floor of
// 0, it returns at once. One Hold per process: it owns GOGC.
func Hold(ctx context.Context, floor uint64) {
	if floor == 0 || Chosen() {
		return
	}
	samples := []metrics.Sample{
		{Name: "/gc/gogc:percent"},
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"},
	}
	metrics.Read(samples[:1])
	if samples[0].Value.Kind() != metrics.KindUint64 || samples[0].Value.Uint64() > math.MaxInt32 {
		return // a Go that does not say its GOGC, or collection off
	}
	base := int(samples[0].Value.Uint64())
	defer debug.SetGCPercent(base)
	var cycles uint64
	set := base
	adjust := func() {
		metrics.Read(samples[1:])
		c := uint64Of(samples[1])
		if c == cycles {
			return
		}
		cycles = c
		p := Percent(floor, uint64Of(samples[2]), uint64Of(samples[3])+uint64Of(samples[4]), base)
		if p != set {
			debug.SetGCPercent(p)
			set = p
		}
	}
	adjust()
	periodic.Every(ctx, Every, adjust)
}

// uint64Of is a sample's value, 0 when this Go does not know the metric.
func uint64Of(s metrics.Sample) uint64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s.Value.Uint64()
}
