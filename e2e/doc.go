// Package e2e holds intentd's end-to-end tests: they build cmd/intentd,
// start it as a process with its own embedded etcd, and drive it only
// through package client, as a worker fleet would. What they assert is the
// world: how many orders, authorizations and pickups the providers of
// e2e/fakes actually hold, not what a status field says.
//
// This directory is a Go module of its own, so that the suites' test-only
// dependencies stay out of intentd's go.mod. It also holds the fault suite
// (e2e/reliability), and the harness both suites run on (e2e/harness).
package e2e
