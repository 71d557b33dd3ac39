package reliability

import (
	"fmt"
	"slices"
	"time"
)

// Cycle is one Run of a worker goroutine: from when it took the intent
// (with LoadConfig.SelfRegister, from the start of the registration) until
// Run returned, as offsets in the history.
type Cycle struct{ Start, End time.Duration }

// Window is a span of a run's history, as offsets from its start.
type Window struct{ From, To time.Duration }

func (w Window) String() string {
	return fmt.Sprintf("%v–%v", w.From.Round(time.Millisecond), w.To.Round(time.Millisecond))
}

// Throughput is what the workers achieved within one Window.
type Throughput struct {
	Window Window
	// PerSecond is intents first seen COMPLETED per second.
	PerSecond float64
	// Cycles counts the Runs that began in the window; P99 is the 99th
	// percentile of their latency and Max the longest.
	Cycles   int
	P99, Max time.Duration
}

func (t Throughput) String() string {
	return fmt.Sprintf("%.0f intents/s over %s (%d cycles begun, p99 %v, max %v)",
		t.PerSecond, t.Window, t.Cycles, t.P99.Round(time.Millisecond), t.Max.Round(time.Millisecond))
}

// Throughput measures the workers within w: the rate at which intents were
// first completed, and the latency of the cycles that began in it (each
// counted in full, even when it ended after w).
func (l *Load) Throughput(w Window) Throughput {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := Throughput{Window: w}
	done := 0
	for _, at := range l.completedAt {
		if at >= w.From && at < w.To {
			done++
		}
	}
	if w.To > w.From {
		t.PerSecond = float64(done) / (w.To - w.From).Seconds()
	}
	var lat []time.Duration
	for _, c := range l.cycles {
		if c.Start >= w.From && c.Start < w.To {
			lat = append(lat, c.End-c.Start)
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		t.Cycles, t.Max = len(lat), lat[len(lat)-1]
		t.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return t
}
