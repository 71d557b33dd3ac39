package freeport

import (
	"net"
	"strconv"
	"testing"
)

// The ports are below the ephemeral range, bindable, and never handed out
// twice, even when one is free again.
func TestPortsAreFreshAndBelowTheEphemeralRange(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		port, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if port < low || port >= low+count {
			t.Fatalf("port %d outside %d-%d", port, low, low+count-1)
		}
		if seen[port] {
			t.Fatalf("port %d handed out twice", port)
		}
		seen[port] = true
	}
	addr := Addr(t)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address Addr gave cannot be bound: %v", err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(addr)
	if p, _ := strconv.Atoi(port); seen[p] {
		t.Errorf("Addr gave port %s, handed out before", port)
	}
}
