// Package fencing defines intentd's fencing token and the check that a
// downstream resource runs on it. It imports the standard library only, so a
// resource can embed it without etcd or gRPC.
//
// # What a token is
//
// Every lease intentd hands a worker carries a Token. Tokens strictly
// increase over every lease the cluster ever issues: when a worker's lease
// lapses and the intent is acquired again, the new holder gets a larger
// token, and the old one is superseded. A worker sends its token with every
// write it makes (the Header for HTTP, MetadataKey for gRPC metadata).
//
// Tokens are compared, never interpreted. A larger token was issued later;
// that is all the number says. It is not a count of attempts, not a
// timestamp and not promised to equal any etcd revision.
//
// # What fencing guarantees
//
// A resource that checks tokens rejects writes from a worker whose lease was
// superseded, once it has seen a write under the newer token. Concretely: if
// worker A holds token 7, pauses, loses its lease, and worker B acquires the
// intent with token 9 and writes, then A's next write under 7 is refused by
// every resource that has admitted 9. The resource does this by remembering,
// per guarded object, the highest token it has admitted and refusing anything
// lower (see Checker). Because tokens only grow, that one number per resource
// is all the state the check needs. Equal tokens are admitted: they are the
// same lease retrying.
//
// # What fencing does not guarantee
//
// The check protects only a resource that performs it:
//
//   - A provider that never sees the token, or sees it and never checks it,
//     is not protected by it. A merchant or payment API does not know intentd's
//     tokens; a stale worker that reaches it will be served. Against such a
//     provider use its own duplicate handling: send the intent's operation key
//     ("<intent key>:<operation>") as the provider's idempotency key, which is
//     the same for every worker and every retry of that operation.
//
//   - The check must be atomic with the write it guards. The resource has to
//     compare the token and apply the write in one step (one lock held across
//     both, one database transaction, one etcd Txn). A resource that checks,
//     then writes in a separate step, lets a stale writer pass the check, pause,
//     and land its write after a newer token has been admitted. Checker.Admit
//     on its own is such a separate step unless the resource holds its own lock
//     across Admit and the write, or stores its data in the same transaction
//     (see etcdstore/etcdfence, Cmp and Op).
//
//   - A resource that has not yet seen the newer token cannot know the older
//     one is superseded. Fencing orders writers at each resource; it does not
//     stop a superseded worker from acting on resources the new holder has not
//     touched yet, and it says nothing about writes that happened before the
//     newer token arrived.
//
//   - The checker's memory is the guarantee. A MemoryChecker forgets
//     everything when its process exits, so it suits a resource whose state
//     lives and dies in one process; a resource spread over processes, or
//     that must survive restarts, needs a shared durable checker such as
//     etcdstore/etcdfence.
package fencing
