package daemon

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

// TestComponentsStopInOrder: whatever ends the daemon (ctx, or one
// component's error), every component is stopped in the order given, each
// only after the one before it has returned, and the cause is what ended
// the daemon.
func TestComponentsStopInOrder(t *testing.T) {
	failed := errors.New("listener failed")
	for _, tc := range []struct {
		name      string
		failFirst int // index of the component that returns early, -1: none
		want      error
	}{
		{"ctx ends", -1, nil},
		{"a component fails", 1, failed},
		{"the last component fails", 2, failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var stopped []int
			part := func(i int) component {
				return func(ctx context.Context) error {
					if i == tc.failFirst {
						return failed
					}
					<-ctx.Done()
					mu.Lock()
					defer mu.Unlock()
					stopped = append(stopped, i)
					return nil
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := startComponents(ctx, part(0), part(1), part(2))
			if tc.failFirst < 0 {
				cancel()
			}
			var cause error
			err := c.wait(ctx, func(err error) { cause = err })
			if !errors.Is(err, tc.want) || !errors.Is(cause, tc.want) {
				t.Errorf("wait = %v, stopping(%v); want %v for both", err, cause, tc.want)
			}
			want := slices.DeleteFunc([]int{0, 1, 2}, func(i int) bool { return i == tc.failFirst })
			if !slices.Equal(stopped, want) {
				t.Errorf("stopped in order %v, want %v", stopped, want)
			}
		})
	}
}
