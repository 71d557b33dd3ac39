// Package e2e holds intentd's end-to-end tests: they build cmd/intentd,
// start it as a process with its own embedded etcd, and drive it only
// through package client, as a worker fleet would. What they assert is the
// world: how many orders, authorizations and pickups the providers of
// e2e/fakes actually hold, not what a status field says.
package e2e
