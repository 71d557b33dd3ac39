package access

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/intentd/intentd/internal/core/periodic"
)

// Source holds the current Directory of a tokens file and reloads it when
// the file changes or Reload is called (on SIGHUP). A file that fails to
// parse keeps the previous directory in force: a typo must not lock
// everyone out, nor let anyone in.
type Source struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[Directory]

	mu    sync.Mutex
	mtime time.Time
	size  int64
}

// Open reads the tokens file at path; it must parse.
func Open(path string, log *slog.Logger) (*Source, error) {
	s := &Source{path: path, log: log}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Directory returns the directory in force.
func (s *Source) Directory() *Directory { return s.cur.Load() }

// Reload reads the file again.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("access: tokens file: %w", err)
	}
	b, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("access: tokens file: %w", err)
	}
	d, err := Parse(b)
	if err != nil {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	s.cur.Store(d)
	s.mtime, s.size = st.ModTime(), st.Size()
	return nil
}

// changed reports whether the file looks different from what was loaded.
func (s *Source) changed() bool {
	st, err := os.Stat(s.path)
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !st.ModTime().Equal(s.mtime) || st.Size() != s.size
}

// Watch reloads the file whenever it changes, checking every interval,
// until ctx ends.
func (s *Source) Watch(ctx context.Context, every time.Duration) {
	periodic.Every(ctx, every, func() {
		if !s.changed() {
			return
		}
		if err := s.Reload(); err != nil {
			s.log.Error("tokens file changed but does not load; keeping the previous one", "err", err)
			return
		}
		s.log.Info("tokens file reloaded", "path", s.path, "principals", s.Directory().Len())
	})
}
