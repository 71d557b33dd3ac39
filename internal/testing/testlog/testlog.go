// Package testlog holds what tests need to read a log while the code under
// test (or a process it started) writes it.
package testlog

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a log destination safe for concurrent use: goroutines of the
// code under test write to it while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// keepLines is how many lines Lines keeps at least; it trims to that once
// it holds twice as many.
const keepLines = 400

// Lines keeps the last lines a process wrote, for a failure report. It is
// safe for concurrent use.
type Lines struct {
	// Skip, if set, leaves out lines not worth keeping.
	Skip  func(string) bool
	mu    sync.Mutex
	lines []string
}

// Add keeps line s.
func (l *Lines) Add(s string) {
	if l.Skip != nil && l.Skip(s) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
	if len(l.lines) > 2*keepLines {
		l.lines = append([]string(nil), l.lines[len(l.lines)-keepLines:]...)
	}
}

// Write makes Lines an io.Writer of whole lines.
func (l *Lines) Write(p []byte) (int, error) {
	for _, s := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		l.Add(s)
	}
	return len(p), nil
}

// Tail returns the last n lines kept.
func (l *Lines) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.lines
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
