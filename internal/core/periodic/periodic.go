// Package periodic runs a function on a fixed interval until its context
// ends: the loop every file watcher, prober and reloader of intentd shares.
package periodic

import (
	"context"
	"time"
)

// Every calls fn every interval until ctx ends. The first call comes one
// interval after Every starts, not at once: callers have already done the
// work once (loaded the file, probed the members) before they start it.
// A call that runs longer than interval delays the next one; ticks are
// never queued up behind it.
func Every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
