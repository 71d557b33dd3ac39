package periodic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestEveryCallsUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func() {
			if calls.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context ended")
	}
	if got := calls.Load(); got != 3 {
		t.Errorf("got %d calls, want 3 (none after the context ended)", got)
	}
}

func TestEveryWaitsOneIntervalFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var calls atomic.Int32
	Every(ctx, time.Hour, func() { calls.Add(1) })
	if got := calls.Load(); got != 0 {
		t.Errorf("got %d calls before the first interval, want 0", got)
	}
}
