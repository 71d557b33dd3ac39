// Package etcdstore keeps intents in etcd. Every etcd key, transaction, lease
// and watch of intentd lives here; the rest of intentd sees plain domain
// types from package intent.
//
// # Key layout
//
// All keys live under a prefix (default "/intentd/v1/"), then the tenant:
//
//	<prefix>t/<tenant>/i/<key>          the intent record (JSON): state, params,
//	                                    fingerprint, current lease, result, history
//	<prefix>t/<tenant>/s/<session-id>   a worker session (JSON: worker, ttl),
//	                                    attached to the session's etcd lease
//
// A session id is the hex id of the etcd lease behind it. A session is alive
// exactly while its key exists with the create revision recorded when it was
// opened; etcd deletes the key when the lease lapses, so whether a lease has
// expired is decided by etcd alone, never by comparing intentd replicas'
// clocks.
//
// # Transitions
//
// Every transition is one etcd transaction on one intent record, guarded by
// compares: the record's mod revision must equal the one the decision was
// made from, and where it matters the acquiring session must be alive
// (create revision equal) or the holder's session must be gone (create
// revision different). History entries go into the record written by that
// same transaction. A happy-path intent costs two etcd writes: Acquire
// (registering the intent in the same transaction when asked to) and
// Complete.
//
// # Fencing tokens
//
// The token of a lease is the etcd revision of the transaction that issued
// it, so tokens strictly increase over every lease the cluster ever issued.
// The acquiring write cannot know its own revision, so it stores token 0,
// meaning "the mod revision of this version"; the next write of the record
// stores the number. Tokens are opaque to clients.
//
// # Failure modes
//
// An etcd call that fails with a timeout, Unavailable or a leader change may
// still have committed. The store never repeats a write blindly: it reads the
// record back and decides again. Every write compares the revision it was
// decided from, so a write that did commit makes its retry's compare fail,
// and every operation recognizes its own effect on read-back (Acquire by
// session and request id, reports by token and kind in the history). Every
// etcd call carries a deadline; when the store cannot reach etcd within the
// operation timeout it returns intent.ErrUnavailable, and the caller may
// retry the same call safely.
//
// A report from the current token is accepted even after the holder's
// session lapsed, as long as no newer token was issued: it is the best
// evidence there is. A report under a superseded token changes nothing; it
// is appended to the history as evidence.
//
// Final records (COMPLETED, FAILED, CANCELLED) never change their state or
// result, so the store replays them from memory without touching etcd.
// Records that are not final are always read linearizably.
package etcdstore
