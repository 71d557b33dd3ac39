package heapfloor

import (
	"context"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name               string
		floor, live, roots uint64
		base, want         int
	}{
		{"a small heap grows to the floor", 64 * mib, 16 * mib, 0, 100, 300},
		{"roots count toward the growth", 64 * mib, 16 * mib, 16 * mib, 100, 150},
		{"rounded up, so the goal is not short of the floor", 64 * mib, 48*mib + 1, 0, 10, 34},
		{"never below the process's GOGC", 64 * mib, 40 * mib, 0, 100, 100},
		{"a heap above the floor keeps GOGC", 64 * mib, 200 * mib, 0, 100, 100},
		{"a heap at the floor keeps GOGC", 64 * mib, 64 * mib, 0, 50, 50},
		{"an empty heap is bounded", 1 << 40, 0, 0, 100, maxPercent},
		{"collection off stays off", 64 * mib, 1 * mib, 0, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percent(tc.floor, tc.live, tc.roots, tc.base); got != tc.want {
				t.Errorf("Percent(%d, %d, %d, %d) = %d, want %d", tc.floor, tc.live, tc.roots, tc.base, got, tc.want)
			}
		})
	}
}

func read(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestHoldRaisesTheGoalAndPutsGOGCBack runs Hold on this test process:
// after a collection its heap goal reaches the floor, and when Hold stops
// GOGC is what it was.
func TestHoldRaisesTheGoalAndPutsGOGCBack(t *testing.T) {
	if Chosen() {
		t.Skip("GOGC is set in the environment: Hold leaves it alone")
	}
	const floor = 256 << 20
	before := read("/gc/gogc:percent")
	if goal := read("/gc/heap/goal:bytes"); goal >= floor {
		t.Skipf("the heap goal is %d B already", goal)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Hold(ctx, floor) }()
	deadline := time.Now().Add(10 * time.Second)
	for read("/gc/heap/goal:bytes") < floor {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("heap goal %d B after 10s, want at least %d", read("/gc/heap/goal:bytes"), floor)
		}
		runtime.GC()
		time.Sleep(Every)
	}
	if p := read("/gc/gogc:percent"); p <= before {
		t.Errorf("GOGC %d while holding, want above %d", p, before)
	}
	cancel()
	<-done
	if p := read("/gc/gogc:percent"); p != before {
		t.Errorf("GOGC %d after Hold stopped, want %d back", p, before)
	}
}

func TestHoldLeavesAChosenGOGC(t *testing.T) {
	t.Setenv("GOGC", "100")
	before := read("/gc/gogc:percent")
	done := make(chan struct{})
	go func() { defer close(done); Hold(context.Background(), 1<<40) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Hold still running with GOGC set in the environment")
	}
	runtime.GC()
	if p := read("/gc/gogc:percent"); p != before {
		t.Errorf("GOGC %d, want %d: the environment's choice was changed", p, before)
	}
}
