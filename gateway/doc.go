// Package gateway is intentd's fencing gateway: an HTTP egress gateway that
// workers send their side-effecting HTTP calls through, for upstreams that
// cannot check a fencing token or honour an idempotency key themselves (a
// supplier's order form, a courier, a webhook, an email relay). How to run
// it, its headers and its configuration are docs/GATEWAY.md; the rules it
// relies on are DESIGN.md's "The fencing gateway".
//
// A worker calls
//
//	POST /u/<upstream>/<path>
//	Authorization: Bearer <the worker's intentd token>
//	Intentd-Key: <intent key>
//	Intentd-Operation: <operation>
//	Intentd-Fencing-Token: <the lease's token>
//	[Intentd-Tenant: <tenant>]
//
// and the gateway, holding no state of its own:
//
//  1. asks intentd, with the worker's credentials, to begin a submission of
//     the operation under the token (BeginSubmission): intentd checks the
//     token is the intent's current, live lease and records that the
//     submission started, in one etcd transaction;
//  2. sends the request to the configured upstream only when told to, never
//     following a redirect, without intentd's credentials or hop-by-hop
//     headers, with the operation key as the upstream's idempotency key if
//     it reads one;
//  3. records the answer (status, kept headers, bounded body) in the
//     intent's record (RecordSubmission) before it answers the worker; a
//     timeout or a connection lost after the request may have reached the
//     upstream is recorded as lost instead, and is never sent again.
//
// A retry of the operation (the same lease, or a newer holder after a
// takeover) is answered the recorded answer, with Intentd-Replayed: true,
// and the upstream is not called again; a superseded token is refused with
// intentd's STALE_TOKEN statement; a submission in flight makes a
// concurrent one wait (409). Every refusal's body is a Statement in JSON.
//
// Any number of gateway replicas may serve one intentd: everything they
// know is in intentd's records.
package gateway
