// Package testlog holds what tests need to read a log while the code under
// test writes it.
package testlog

import (
	"bytes"
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
