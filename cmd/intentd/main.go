// Command intentd serves the intent.v1.IntentService API.
//
// With no flags it runs an embedded single-member etcd with its data under
// $XDG_DATA_HOME/intentd (else ~/.local/share/intentd) and serves gRPC on
// 127.0.0.1:7650. --etcd-endpoints points it at an external etcd cluster
// instead. Every flag can also be set as an INTENTD_* environment variable:
// --etcd-endpoints is INTENTD_ETCD_ENDPOINTS. A flag given on the command
// line wins over the environment, which wins over the optional --config
// file (YAML, its keys the flags' names), which wins over the default.
//
// Exit status: 0 after a clean stop, 1 when intentd fails while starting or
// serving (etcd unreachable, port taken, a replica without an archive on a
// cluster that uses one), 2 for a bad flag, environment variable or
// argument, or an --archive-dsn that PostgreSQL refuses or does not answer
// at start (nothing was started).
package main

import (
	"os"

	"github.com/intentd/intentd/internal/run/intentdcmd"
)

func main() {
	os.Exit(intentdcmd.Main(os.Args[1:], os.Stderr, nil))
}
