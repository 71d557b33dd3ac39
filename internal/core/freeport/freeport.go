// Package freeport hands out loopback ports for the processes and servers
// that tests and benchmark commands start by address rather than by
// listener.
//
// A port the kernel picks for ":0" comes from the ephemeral range
// (32768–60999 on Linux), and once the picking listener is closed the
// kernel may give that same port to the next ":0" listener of any process.
// The test packages run side by side, so another package's server could
// take the port between the check and the bind of the process under test:
// intentd then failed to start with "address already in use", or a test
// read another server's answers. The ports here are drawn at random below
// that range, where no ":0" listener is ever placed, nor an outgoing
// connection's port, which also matters while a process the test restarts
// is down. A port is handed out once per process; another process's draw
// can collide with it one time in thousands.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// The range the ports are drawn from: below Linux's default ephemeral
// range, above the ports services commonly use.
const (
	low   = 20000
	count = 12000
)

// handedOut holds the ports Port returned, so that a process stopped for
// a restart does not find its port given to another.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Port returns a loopback port that nothing listened on a moment ago and
// that this process was not given before.
func Port() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := low + rand.IntN(count)
		if handedOut.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken
		}
		if err := l.Close(); err != nil {
			return 0, err
		}
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port in 127.0.0.1:%d-%d after 200 tries", low, low+count-1)
}

// Loopback returns "127.0.0.1:port" for a port from Port.
func Loopback() (string, error) {
	port, err := Port()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// Addr is Loopback for a test: it ends the test if no port is found.
func Addr(t testing.TB) string {
	t.Helper()
	addr, err := Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
