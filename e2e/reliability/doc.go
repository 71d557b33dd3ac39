// Package reliability proves intentd's promises under faults, the way etcd
// and Jepsen prove theirs: it causes the faults on purpose, records what every
// client saw, and checks the history.
//
// The topology is real processes on loopback, started with package
// harness: a three-member etcd cluster (bin/etcd, built from tools/go.mod at
// a pinned version), each member's client port reached through a
// fault-injecting TCP harness.Proxy (and, to partition members, each
// member's peer port through a peer proxy that tells the members apart); one
// or two intentd processes built from cmd/intentd and pointed at the
// proxies; worker goroutines, and worker processes (WorkerProcs: the test
// binary re-executed, so that a worker can be SIGKILLed or SIGSTOPped), that
// run client.Session.Run against an effect-counting Merchant.
// Nothing here imports the server side of intentd: it is a black box reached
// over gRPC, exactly as a worker fleet reaches it.
//
// Every gRPC call a worker, approver or reader makes goes through a Recorder,
// which keeps its input, its output or error, and when it started and ended.
// A call that ends UNAVAILABLE or DEADLINE_EXCEEDED (or in any other way that
// does not say whether intentd acted) is recorded as an unknown outcome. A
// worker process writes each call's start and end to its stdout and the
// parent records them; a call the process died in is an unknown outcome too.
// The history is then checked three ways:
//
//   - linearizability, with porcupine, against Model: one intent's state
//     machine, partitioned by intent key (see Model for the invariants it
//     encodes);
//   - the world: the Merchant holds exactly one order per intent, the one
//     the intent's result names;
//   - the acknowledged past: every transition a caller was told about is in
//     the intent's history at the end, tokens increase in real time across
//     the cluster, and no lease was taken over from a session that was
//     provably alive afterwards.
//
// Every run also records proof that its faults happened (FaultLog): when each
// was injected and healed, how many calls saw it, and how much load ran
// before it. A run that injected nothing, or whose faults no call noticed,
// fails.
//
// The scenarios, numbered as in the reliability issue (each a test; each
// asserts the invariants above):
//
//	1  TestEtcdLeaderKilled          etcd leader kill -9 under load, restarted
//	2  TestEtcdQuorumLost            2 of 3 members down 10s: UNAVAILABLE within deadlines, nothing hangs
//	3  TestEtcdMemberPaused          leader SIGSTOPped 3s, six election timeouts
//	4  TestEtcdUnreachable           every intentd→etcd link cut: no decision without etcd
//	5  TestEtcdRepliesLost           half-open link: writes applied, replies dropped
//	6  TestIntentdKilled             intentd kill -9 and restart
//	6  TestIntentdReplicaKilled      one of two replicas killed
//	7  TestReplicaCutOff             one of two replicas cut off from etcd: no split brain
//	8  TestSlowLinkLateHeartbeats    slow links, then late heartbeats: lapse, stale Complete refused
//	9  TestClockJumps                two replicas' clocks jump ±5 min: no lease lapses, nothing changes but history times
//	10 TestEtcdCompactionAndDefrag   compaction and defragmentation under load: watches report it and recover
//	11 TestEtcdBackendQuotaExhausted backend quota exhausted: STORE_FULL at once, reads served, recovery
//	12 TestManyLeasesExpireAtOnce    2,000 leases lapse together: all reconciled, none executed twice
//	13 TestRestoreFromSnapshot       restore without a revision bump refused; with it, tokens keep growing
//	   TestEtcdLeaderPartitioned     the etcd leader partitioned from its peers (peer links)
//	   TestWorkerProcessesKilledAndPaused  worker processes SIGKILLed between effect and report, SIGSTOPped past their TTL
//	   TestStalledEtcdLeaderKeepsServing    leader SIGSTOPped 10s under back-to-back load: from 3s in, at least half the rate before, p99 cycle under the request timeout
//	   TestStalledEtcdFollowerKeepsServing  the same with a follower SIGSTOPped
//	   TestBlackholedEtcdMemberKeepsServing the same with the leader's client link black-holed (packets dropped, no reset)
//	   TestGatewayUnderFaults        load through two fencing gateways (intentd gateway) to a courier without idempotency: etcd leader killed, a gateway SIGKILLed mid-call, the other restarted; one pickup per intent
//	   TestRollingUpgrade            the last release (RELEASES) and this checkout as replicas under load, replaced one at a time and rolled back; the storage format version advances once both are new
//	   TestArchivePostgresStoppedAndPaused  two replicas on one PostgreSQL archive: PostgreSQL SIGSTOPped 5s, then stopped 5s; live intents complete at half the rate before or more, archived ones answer as before or ARCHIVE_UNAVAILABLE
//	   TestArchiveReplicaKilledMidMove      the janitor's replica SIGKILLed three times while records move; each final intent then in exactly one tier, answers unchanged
//	   TestArchiveJanitorPausedPastItsElection  the janitor's replica SIGSTOPped mid-pass past its election's TTL, the other moving the same records, then resumed: moves go on, one tier per intent
//	   TestArchiveEtcdLeaderStalled         the etcd leader SIGSTOPped 3s while records move, under back-to-back load: the stall scenarios' rate bars, one tier per intent
//	14 TestSoak                      seeded mixed faults (-soak for an hour, -seed to vary)
//
// The scenarios' files are named by fault family: members_test.go (etcd
// members killed, paused, partitioned), links_test.go (intentd's links to
// etcd cut, half-open, slow), replicas_test.go (intentd processes killed),
// clock_test.go, storage_test.go (compaction, quota, snapshot restore),
// leases_test.go, stalls_test.go, workers_test.go (worker processes killed
// and paused), gateway_test.go (the fencing gateway's processes),
// archive_test.go (the archive tier on a real PostgreSQL: the server paused
// and stopped, the archiving replica killed or paused past its election,
// an etcd stall while records move) and soak_test.go.
//
// The latest figures, and what this package cannot prove, are in
// RELIABILITY.md beside it.
package reliability
