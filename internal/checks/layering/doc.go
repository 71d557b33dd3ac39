// Package layering holds no code: its test enforces which packages of
// intentd may depend on which, so that the layers of STYLE.md ("The house")
// stay true as the code grows. Dependencies point one way:
//
//	cmd/intentd ──► server, etcdstore, fencing, gen   (with internal/run/intentdcmd and internal/run/daemon, the only code that knows both server and etcdstore)
//	server      ──► gen, intent, fencing              (declares the Store interface it consumes; no etcd)
//	etcdstore   ──► intent, fencing, etcd client/v3   (no gRPC codes or status; plain Go domain types at its boundary)
//	client      ──► gen, intent, fencing, grpc        (no server, no etcdstore)
//	intent      ──► fencing, standard library         (the domain model every layer speaks)
//	machine     ──► intent, fencing, standard library (internal/core/machine: the state diagram, pure; etcdstore runs it)
//	fencing     ──► standard library only             (a downstream resource imports it without etcd or gRPC)
//	e2e         ──► client, gen, fencing, fakes       (black box: no server, etcdstore or daemon)
//	intentctl   ──► client, gen, intent, access       (an operator's tool: talks to intentd only over gRPC)
//	access      ──► intent, standard library          (principals and the tokens file; no gRPC, no etcd)
//
// The test reads the real import graph with `go list -deps -json` and fails
// on each forbidden edge, printing the chain of imports that reaches it
// (for example "server → intent → etcdstore"). The rules, one forbidden
// edge each:
//
//   - fencing depends on the standard library only.
//   - intent depends on the standard library and fencing only.
//   - internal/core/machine depends on intent, fencing and the standard library
//     only: no etcd, no gRPC, no clock, so that every transition is tested
//     without them.
//   - server depends on no go.etcd.io package and not on etcdstore.
//   - etcdstore does not import google.golang.org/grpc/codes or
//     google.golang.org/grpc/status itself (the etcd client does, inside; a
//     store error becomes a gRPC status in server/errors.go only), and
//     depends neither on server nor on the generated API in gen.
//   - gen depends on nothing of intentd outside gen: it is generated code.
//   - client depends neither on server nor on etcdstore.
//   - No package but etcdstore itself, the commands (cmd/..., and
//     e2e/cmd/..., the intentd mains the e2e module builds with a fault
//     injected), internal/run/intentdcmd and internal/run/daemon (the body of
//     cmd/intentd) depends on etcdstore; nor does any but
//     internal/testing/intentdtest, which composes an intentd in-process for the
//     unit tests as internal/run/daemon does.
//   - No product package depends on internal/testing/etcdtest or
//     internal/testing/intentdtest, the helpers that start etcd and intentd in
//     tests (they import package testing).
//   - e2e (a module of its own, whose packages the test reads too), but
//     for its commands, depends on none of server, etcdstore and
//     internal/run/daemon.
//   - cmd/intentctl depends on none of server, etcdstore, internal/run/daemon
//     and the etcd client.
//   - access depends on no gRPC and no etcd package.
//
// Only non-test imports count: a test may reach across layers (the server
// tests run a real etcdstore, for instance). A rule about a package that
// does not exist yet (client) applies as soon as it does.
package layering
