package reliability

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var (
	soakFlag = flag.Bool("soak", false, "run the mixed-fault soak for -soak-duration (default one hour) instead of its short CI form")
	soakFor  = flag.Duration("soak-duration", time.Hour, "how long -soak runs")
	seedFlag = flag.Uint64("seed", 1, "seed of the soak's fault plan and of every workload (printed by each run)")
)

// bins are the executables TestMain built or found.
var bins Binaries

// report gathers every run's figures; TestMain prints it at the end.
var report = &Report{}

// TestMain builds cmd/intentd, finds or builds etcd, runs the suite and
// prints the reliability report. A worker process (envWorkerProcess set)
// builds nothing: it only runs TestWorkerProcess; nor does -short, which
// skips every scenario (NewEnv).
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(envWorkerProcess) != "" || testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "intentd-reliability-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "reliability:", err)
		os.Exit(1)
	}
	root, err := filepath.Abs("../..")
	if err == nil {
		bins, err = BuildBinaries(root, dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "reliability:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	start := time.Now()
	code := m.Run()
	if report.Runs() > 0 {
		text := fmt.Sprintf("%s  suite time                           %v\n", report, time.Since(start).Round(time.Second))
		// go test shows a passing package's output only with -v (or when
		// run on one directory); $RELIABILITY_ARTIFACTS keeps it anyway.
		fmt.Print("\n" + text)
		if dir := os.Getenv("RELIABILITY_ARTIFACTS"); dir != "" {
			if err := writeReport(dir, text); err != nil {
				fmt.Fprintln(os.Stderr, "reliability: writing the report:", err)
			}
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// writeReport keeps the report as dir/report.txt.
func writeReport(dir, text string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.txt"), []byte(text), 0o644)
}
