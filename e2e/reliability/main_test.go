package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
)

// report gathers every run's figures; TestMain prints it at the end.
var report = &Report{}

// TestMain builds cmd/intentd, finds or builds etcd (Main), runs
// the suite and prints the reliability report.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Want{Etcd: true, FaultClock: true}, func(took time.Duration) {
		if report.Runs() == 0 {
			return
		}
		text := fmt.Sprintf("%s  suite time                           %v\n", report, took.Round(time.Second))
		// go test shows a passing package's output only with -v (or when
		// run on one directory); $RELIABILITY_ARTIFACTS keeps it anyway.
		fmt.Print("\n" + text)
		if dir := os.Getenv("RELIABILITY_ARTIFACTS"); dir != "" {
			if err := writeReport(dir, text); err != nil {
				fmt.Fprintln(os.Stderr, "reliability: writing the report:", err)
			}
		}
	}))
}

// writeReport keeps the report as dir/report.txt.
func writeReport(dir, text string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.txt"), []byte(text), 0o644)
}
