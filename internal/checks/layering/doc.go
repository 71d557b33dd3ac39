// Package layering holds no code: its test enforces which packages of
// intentd may depend on which. The layering itself — the picture, the four
// floors of internal/ and why — is described once, in docs/DESIGN.md
// ("Layering"); the test's rules are that picture as forbidden edges, one
// each.
//
// The test reads the real import graph with `go list -deps -json` (of the
// root module and of e2e) and fails on each forbidden edge, printing the
// chain of imports that reaches it (for example "server → intent →
// etcdstore"). Only non-test imports count: a test may reach across layers
// (the server tests run a real etcdstore, for instance). A rule about a
// package that does not exist yet applies as soon as it does.
package layering
