package main

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/intentd/intentd/internal/core/periodic"
)

// clockReload is how often an offset clock re-reads its file.
const clockReload = 100 * time.Millisecond

// offsetClock is the wall clock shifted by a duration read from a file: it
// lets a test jump one replica's clock while it runs, as libfaketime would
// for a C program.
// intentd reads the wall clock only for history timestamps, retention and
// lease-expiry estimates; lease liveness is decided by etcd, so a jump must
// change those timestamps and nothing else.
//
// The file holds a Go duration ("5m", "-5m"); a missing or empty file is 0.
// A background goroutine re-reads it every clockReload, so Now costs one
// atomic load.
type offsetClock struct {
	path   string
	log    *slog.Logger
	offset atomic.Int64 // a time.Duration
}

func newOffsetClock(path string, log *slog.Logger) *offsetClock {
	c := &offsetClock{path: path, log: log}
	c.load()
	return c
}

// Now is the wall clock plus the current offset.
func (c *offsetClock) Now() time.Time {
	return time.Now().Add(time.Duration(c.offset.Load()))
}

// load reads the file once. A file that does not parse keeps the previous
// offset, with a warning: a test writing it non-atomically may be caught
// half way.
func (c *offsetClock) load() {
	d, err := readOffset(c.path)
	if err != nil {
		c.log.Warn("fault clock offset file does not parse; keeping the previous offset", "file", c.path, "err", err)
		return
	}
	if old := time.Duration(c.offset.Swap(int64(d))); old != d {
		c.log.Warn("fault clock offset changed", "file", c.path, "from", old, "to", d)
	}
}

// run re-reads the file every clockReload until ctx ends.
func (c *offsetClock) run(ctx context.Context) {
	periodic.Every(ctx, clockReload, c.load)
}

func readOffset(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return 0, nil
	}
	return time.ParseDuration(s)
}
