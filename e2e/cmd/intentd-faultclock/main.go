// Command intentd-faultclock is intentd built for the reliability suite's
// clock-jump scenario, and never shipped: the same command, flags and
// daemon as cmd/intentd (package intentdcmd), with a wall clock the test
// can move while it runs. intentd reads the wall clock only for history
// timestamps, retention and lease-expiry estimates; lease liveness is
// etcd's, so a jump must change those timestamps and nothing else.
//
// The file named by $FAULT_CLOCK_OFFSET_FILE holds a Go duration ("5m",
// "-5m"; missing or empty: 0) added to the wall clock the store reads
// (etcdstore.Config.Now), re-read every 100 ms. Without the variable it
// refuses to start.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/run/intentdcmd"
)

// clockFileEnv names the clock offset file. It is no INTENTD_* variable,
// which would read as a flag of intentd's: intentd has no such setting.
const clockFileEnv = "FAULT_CLOCK_OFFSET_FILE"

func main() {
	os.Exit(intentdcmd.Main(os.Args[1:], os.Stderr, injectClock))
}

// injectClock gives the store the shifted clock. The clock's reloading
// goroutine ends with the process.
func injectClock(cfg *daemon.Config) error {
	path := os.Getenv(clockFileEnv)
	if path == "" {
		return fmt.Errorf("intentd-faultclock: $%s names no clock offset file", clockFileEnv)
	}
	log := cfg.Logger()
	clock := newOffsetClock(path, log)
	log.Warn("fault injection: the wall clock is shifted by the duration in the clock offset file; testing only",
		"file", path, "offset", time.Duration(clock.offset.Load()))
	go clock.run(context.Background())
	cfg.Store.Now = clock.Now
	return nil
}
