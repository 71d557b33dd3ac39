// Package harness is what intentd's black-box suites (the end-to-end
// scenarios in package e2e and the fault suite in e2e/reliability) run on:
// one of each, so that a new scenario in either finds it here.
//
//   - Main and Bins: a suite's TestMain builds cmd/intentd once (from the
//     intentd module, as it ships) and, if asked, finds or builds etcd and
//     etcdutl at EtcdVersion; under -short nothing is built and every test
//     that needs a binary skips.
//   - StartProcess: a child process whose output is kept for failure
//     reports and which dies with the test binary; StartIntentd: an intentd
//     process on a fixed loopback port, restartable, killable.
//   - ChildCommand and ChildSpec: a worker as a real process (the test
//     binary re-executed to run the suite's TestWorkerProcess), so that a
//     scenario can SIGSTOP and SIGKILL it.
//   - The faults: Proxy (bytes on a TCP link delayed, black-holed, replies
//     dropped, cut; peer links refused by sender) and FaultyConn (a worker's
//     gRPC calls held as in a stopped process, failed as in a dead one, or
//     their answers lost).
//   - Dial (intentd replicas, round robin) and Shop (a worker's side of the
//     fake providers of package fakes).
//   - The flags both suites share: -seed, -soak, -soak-duration.
//
// Nothing here imports the server side of intentd: the suites reach it over
// gRPC, as a worker fleet does.
package harness
