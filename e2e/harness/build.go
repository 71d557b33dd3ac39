package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// EtcdVersion is the etcd release the suites run as processes: the one
// tools/go.mod pins and scripts/install-tools.sh builds into bin/etcd.
const EtcdVersion = "3.7.3"

// Binaries are the executables a suite starts.
type Binaries struct {
	// Intentd is cmd/intentd, built from the intentd module as it ships.
	Intentd string
	// FaultClockIntentd is the same command with a wall clock a test can
	// move (e2e/cmd/intentd-faultclock), when the suite asked for it
	// (Want.FaultClock): StartIntentd runs it for IntentdConfig.InjectedClock.
	FaultClockIntentd string
	// Etcd and Etcdutl are the etcd server and its offline tool (restoring
	// snapshots), when the suite asked for them (Want.Etcd).
	Etcd, Etcdutl string
}

// Want says what a suite needs built besides intentd.
type Want struct {
	// Etcd finds or builds etcd and etcdutl at EtcdVersion.
	Etcd bool
	// FaultClock builds e2e/cmd/intentd-faultclock.
	FaultClock bool
}

// built is what Main built, for Bins.
var built *Binaries

// Main is the body of a suite's TestMain: it returns the exit code of
// m.Run. In a worker child (the test binary re-executed, see
// ChildCommand) and under -short it builds nothing, and Bins skips every
// test that needs a binary; otherwise it builds what want says into a
// temporary directory first, and after, if set, runs after the tests with
// how long they took (not counting the builds).
func Main(m *testing.M, want Want, after func(took time.Duration)) int {
	flag.Parse()
	if InChild() || testing.Short() {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "intentd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	b, err := build(dir, want)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	built = &b
	start := time.Now()
	code := m.Run()
	if after != nil {
		after(time.Since(start))
	}
	return code
}

// Bins returns the binaries Main built. Under -short it skips the test:
// the scenarios that start processes run only in full mode.
func Bins(t testing.TB) Binaries {
	t.Helper()
	if testing.Short() {
		t.Skip("the black-box scenarios run without -short")
	}
	if built == nil {
		t.Fatal("harness: no binaries: the suite's TestMain must call harness.Main")
	}
	return *built
}

// build builds cmd/intentd into dir, and finds or builds etcd and etcdutl
// when want says so.
func build(dir string, want Want) (Binaries, error) {
	root, err := moduleRoot()
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{Intentd: filepath.Join(dir, "intentd")}
	// Built in intentd's own module, with the versions its go.mod picks,
	// exactly as it ships.
	if err := goBuild(root, b.Intentd, "./cmd/intentd"); err != nil {
		return Binaries{}, err
	}
	if want.FaultClock {
		// A main of the e2e module: built in it (the test runs in it).
		b.FaultClockIntentd = filepath.Join(dir, "intentd-faultclock")
		if err := goBuild("", b.FaultClockIntentd, "github.com/intentd/intentd/e2e/cmd/intentd-faultclock"); err != nil {
			return Binaries{}, err
		}
	}
	if !want.Etcd {
		return b, nil
	}
	if b.Etcd, err = findTool(root, dir, "etcd", "go.etcd.io/etcd/server/v3", os.Getenv("RELIABILITY_ETCD")); err != nil {
		return Binaries{}, err
	}
	if b.Etcdutl, err = findTool(root, dir, "etcdutl", "go.etcd.io/etcd/etcdutl/v3", ""); err != nil {
		return Binaries{}, err
	}
	return b, nil
}

// moduleRoot is the directory of the intentd module, as e2e's go.mod
// replaces it (../).
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/intentd/intentd").Output()
	if err != nil {
		return "", fmt.Errorf("harness: finding the intentd module: go list -m: %w", err)
	}
	root := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(root, "cmd", "intentd")); err != nil {
		return "", fmt.Errorf("harness: %s is not the intentd module root: %w", root, err)
	}
	return root, nil
}

// findTool returns given if set, else root/bin/name if it is EtcdVersion,
// else a build of pkg from root/tools into dir; each checked to be
// EtcdVersion.
func findTool(root, dir, name, pkg, given string) (string, error) {
	if given != "" {
		return given, checkEtcd(given)
	}
	bin := filepath.Join(root, "bin", name)
	if checkEtcd(bin) == nil {
		return bin, nil
	}
	bin = filepath.Join(dir, name)
	if err := goBuild(filepath.Join(root, "tools"), bin, pkg); err != nil {
		return "", fmt.Errorf("%w (run scripts/install-tools.sh to build bin/%s once)", err, name)
	}
	return bin, checkEtcd(bin)
}

// goBuild runs `go build -o out pkg` in dir ("": the test's own directory).
func goBuild(dir, out, pkg string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("harness: no go command: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: go build %s (in %s): %v\n%s", pkg, dir, err, b)
	}
	return nil
}

// checkEtcd asks bin (etcd or etcdutl) for its version and wants
// EtcdVersion.
func checkEtcd(bin string) error {
	arg := "--version"
	if filepath.Base(bin) == "etcdutl" {
		arg = "version"
	}
	out, err := exec.Command(bin, arg).Output()
	if err != nil {
		return fmt.Errorf("harness: %s %s: %w", bin, arg, err)
	}
	if !strings.Contains(string(out), "ersion: "+EtcdVersion+"\n") {
		return fmt.Errorf("harness: %s is not etcd %s:\n%s", bin, EtcdVersion, out)
	}
	return nil
}
