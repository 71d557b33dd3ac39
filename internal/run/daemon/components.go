package daemon

import (
	"context"
	"sync"

	"golang.org/x/sync/errgroup"
)

// A component is one part of the serving daemon (health, janitor, gRPC
// server, ...). run serves until ctx ends and then returns nil once the part
// has stopped, or returns early, with the error that stops the daemon.
type component func(ctx context.Context) error

// components is the serving daemon: its components running together, and
// stopped one at a time in the order they were given.
type components struct {
	g       errgroup.Group
	list    []component
	cancels []context.CancelFunc
	done    []chan struct{}
	once    sync.Once
	ended   chan struct{} // closed when the first component returns, or stop begins
	first   error         // what the first component to return returned
}

// startComponents runs every component in its own goroutine, each with its
// own context: not ctx's children, so that none stops before the ones
// before it in cs have (ctx's values are kept).
func startComponents(ctx context.Context, cs ...component) *components {
	c := &components{list: cs, ended: make(chan struct{})}
	base := context.WithoutCancel(ctx)
	for _, comp := range cs {
		cctx, cancel := context.WithCancel(base)
		done := make(chan struct{})
		c.cancels, c.done = append(c.cancels, cancel), append(c.done, done)
		c.g.Go(func() error { // exits when its cancel is called, or on its own
			defer close(done)
			err := comp(cctx)
			c.end(err)
			return err
		})
	}
	return c
}

// end records the error of the first component to return.
func (c *components) end(err error) {
	c.once.Do(func() {
		c.first = err
		close(c.ended)
	})
}

// wait blocks until ctx ends or a component returns, then calls
// stopping with that component's error (nil when ctx ended), and stops
// every component in order: each one's context is cancelled only after the
// one before it has returned. It returns the error that stopped the
// daemon; errors returned while stopping are not the cause, and are left
// to the components to log.
func (c *components) wait(ctx context.Context, stopping func(cause error)) error {
	select {
	case <-ctx.Done():
	case <-c.ended:
	}
	c.end(nil)
	stopping(c.first)
	for i := range c.list {
		c.cancels[i]()
		<-c.done[i]
	}
	_ = c.g.Wait() // every goroutine has returned already
	return c.first
}

// goUntilStopped runs fn in a goroutine until stop is called; stop returns
// once fn has. It is for the parts that live longer than the serving
// components (they start before and stop after them).
func goUntilStopped(ctx context.Context, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // exits when stop is called or ctx ends
		defer close(done)
		fn(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
