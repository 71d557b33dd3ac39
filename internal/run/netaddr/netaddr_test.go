package netaddr_test

import (
	"testing"

	"github.com/intentd/intentd/internal/run/netaddr"
)

func TestLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:7650", true},
		{"127.1.2.3:1", true},
		{"[::1]:7650", true},
		{"localhost:7650", true},
		{"0.0.0.0:7650", false},
		{"[::]:7650", false},
		{"10.0.0.1:7650", false},
		{"example.com:7650", false},
		{"127.0.0.1", false}, // no port: not host:port
		{"", false},
	} {
		if got := netaddr.Loopback(tc.addr); got != tc.want {
			t.Errorf("Loopback(%q) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}
