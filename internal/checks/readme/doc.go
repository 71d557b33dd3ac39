// Package readme holds a test, and nothing else: the README is what a
// newcomer reads first, so it stays short (at most 250 lines), starts with
// the two commands a fresh machine with Go needs, links every document of
// docs/, shows what intentd really prints when it starts, and its Go worker
// compiles and runs against a real intentd. What the README once held
// lives in docs/ now; the tests of those blocks follow them there.
package readme
