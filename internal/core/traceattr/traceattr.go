// Package traceattr declares the span attributes intentd records, once, for
// the server's and the store's spans alike. None carries params, results,
// reasons or the intent key itself: an intent is named by KeyHash.
package traceattr

import "go.opentelemetry.io/otel/attribute"

const (
	// KeyHash is intent.KeyHash of the intent a span is about.
	KeyHash = attribute.Key("intentd.intent.key_hash")
	// Outcome is what an Acquire answered (EXECUTE, RECONCILE, COMPLETED,
	// …), or on the Go client's Run span what Run ended with.
	Outcome = attribute.Key("intentd.acquire.outcome")
	// Executed tells whether the Go client's Run called the task's Execute.
	Executed = attribute.Key("intentd.run.executed")
	// Token is a fencing token: of the lease an Acquire answered with, or
	// of the lease a committed write left on the intent.
	Token = attribute.Key("intentd.fencing.token")
	// TxnAttempt counts the store's tries of one transition from 0: a
	// conflict or an ambiguous commit is decided again on a fresh read.
	TxnAttempt = attribute.Key("intentd.txn.attempt")
	// TxnOutcome is what etcd made of a write: committed, conflict (a
	// compare failed), ambiguous (no answer: read back), no_space (quota
	// exhausted: read back) or refused (nothing to read back).
	TxnOutcome = attribute.Key("intentd.txn.outcome")
	// State is the state a committed write gave the intent.
	State = attribute.Key("intentd.intent.state")
)
