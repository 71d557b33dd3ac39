// Package machine is the intent state diagram of DESIGN.md as pure
// functions: for every call that changes an intent, a function of the shape
//
//	decide(view, call, now) → Decision
//
// where the view is the record as the store read it (with its revision, its
// tombstone, the sessions and other intents read with it) and the decision
// is plain data: the guards it relies on, the writes (the record's next
// version, records created beside it, a tombstone), the answer to give or
// the refusal, the evidence to keep (inside the next version), and what the
// store should count. Nothing here reads etcd, a clock or a context: the
// store reads the view, turns guards into compares and writes into
// operations, commits with compare-and-swap and, on a conflict or an
// ambiguous commit, reads again and decides again (package etcdstore). A
// transition is therefore tested here, as a table, without etcd; and
// because a decision is a list of guards and writes, many decisions on
// distinct intents can be committed in one etcd transaction.
//
// The shape follows etcd's raft package (a pure state machine stepped by
// its caller, which does the I/O) and client-go's leader election, which
// keeps the decision apart from the resource lock.
//
// # Where it lives, and why
//
// internal/core/machine, not package intent: intent is the vocabulary every layer
// speaks (client and server included), while the records, sessions and
// guards here are the store's working form, no API. Not etcdstore: there,
// the rules would again sit beside transactions and be testable only with
// etcd. It imports intent and fencing and the standard library only (the
// layering test holds it to that).
//
// Where a new transition goes (a decide function here, a row in its table
// test, the store only for a new guard or write) is CONTRIBUTING.md's "A new
// transition". Every call that carries a fencing token checks it with fence,
// the one place that says what a stale or never-issued token does.
package machine
