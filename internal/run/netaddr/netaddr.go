// Package netaddr answers questions about network addresses that both
// intentd and intentctl ask before they send or accept credentials.
package netaddr

import "net"

// Loopback reports whether addr (host:port) can only be reached from this
// machine: "localhost" or a loopback IP.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
