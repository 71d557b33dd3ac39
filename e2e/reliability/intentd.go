package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/intentd/intentd/internal/testlog"
)

// EtcdVersion is the etcd release the suite runs: the one tools/go.mod pins
// and scripts/install-tools.sh builds into bin/etcd.
const EtcdVersion = "3.7.3"

// Binaries are the executables a run starts.
type Binaries struct {
	Intentd string
	Etcd    string
	// Etcdutl restores snapshots (scenario 13).
	Etcdutl string
}

// BuildBinaries builds cmd/intentd of the module at root into dir, and
// finds etcd: $RELIABILITY_ETCD, else root/bin/etcd if it is EtcdVersion,
// else a build from root/tools into dir; etcdutl likewise (root/bin/etcdutl,
// else a build).
func BuildBinaries(root, dir string) (Binaries, error) {
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.Contains(mod, []byte("module github.com/intentd/intentd\n")) {
		return Binaries{}, fmt.Errorf("reliability: %s is not the intentd module root (go.mod: %v)", root, err)
	}
	var b Binaries
	b.Intentd = filepath.Join(dir, "intentd")
	if err := goBuild(root, b.Intentd, "./cmd/intentd"); err != nil {
		return Binaries{}, err
	}
	if b.Etcd, err = findTool(root, dir, "etcd", "go.etcd.io/etcd/server/v3", os.Getenv("RELIABILITY_ETCD")); err != nil {
		return Binaries{}, err
	}
	if b.Etcdutl, err = findTool(root, dir, "etcdutl", "go.etcd.io/etcd/etcdutl/v3", ""); err != nil {
		return Binaries{}, err
	}
	return b, nil
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

func goBuild(dir, out, pkg string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("reliability: no go command: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("reliability: go build %s (in %s): %v\n%s", pkg, dir, err, b)
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
		return fmt.Errorf("reliability: %s %s: %w", bin, arg, err)
	}
	if !strings.Contains(string(out), "ersion: "+EtcdVersion+"\n") {
		return fmt.Errorf("reliability: %s is not etcd %s:\n%s", bin, EtcdVersion, out)
	}
	return nil
}

// IntentdConfig shapes an intentd process.
type IntentdConfig struct {
	// Endpoints are the etcd endpoints (the cluster's proxies).
	Endpoints []string
	// RequestTimeout bounds each etcd call, OperationTimeout one store
	// operation with its retries: what a caller waits at most for an
	// UNAVAILABLE while etcd does not answer (defaults 1s and 3s).
	RequestTimeout, OperationTimeout time.Duration
	// InjectedClock starts intentd with a wall clock the test can move
	// (Intentd.SetClock).
	InjectedClock bool
}

// Intentd is an intentd process serving on a fixed loopback port, so that
// clients find it again after a restart.
type Intentd struct {
	// Name tells replicas apart in messages.
	Name string
	// Addr is its gRPC address.
	Addr string
	// Config is what it was started with.
	Config IntentdConfig
	// DataDir is its own data directory, kept across restarts: it holds
	// the highest etcd revision the replica has seen (a store restored
	// behind it is refused).
	DataDir string
	// ClockFile holds the offset added to its wall clock (SetClock), with
	// IntentdConfig.InjectedClock.
	ClockFile string

	bin  string
	args []string
	logs *testlog.Lines

	// served counts the calls it logged as finished, over its restarts.
	served atomic.Int64

	mu   sync.Mutex
	proc *process
}

// Served is how many calls the replica has answered (its "finished call"
// log lines), over all its runs: proof that it carried load.
func (d *Intentd) Served() int64 { return d.served.Load() }

// StartIntentd starts intentd from bin against cfg.Endpoints and waits until
// it serves. It is stopped when the test ends.
func StartIntentd(t testing.TB, bin, name string, cfg IntentdConfig) *Intentd {
	t.Helper()
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = time.Second
	}
	if cfg.OperationTimeout == 0 {
		cfg.OperationTimeout = 3 * time.Second
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	// Every call is logged at info (--access-log); the failure report wants
	// the rest.
	quiet := func(line string) bool { return strings.Contains(line, `"msg":"finished call"`) }
	d := &Intentd{Name: name, Addr: fmt.Sprintf("127.0.0.1:%d", port), Config: cfg, bin: bin, logs: &testlog.Lines{Skip: quiet}}
	d.DataDir = t.TempDir()
	d.ClockFile = filepath.Join(d.DataDir, "clock-offset")
	d.args = []string{
		"--listen", d.Addr,
		"--data-dir", d.DataDir,
		"--etcd-endpoints", strings.Join(cfg.Endpoints, ","),
		"--request-timeout", cfg.RequestTimeout.String(),
		"--operation-timeout", cfg.OperationTimeout.String(),
		"--dial-timeout", "10s",
		"--janitor-interval", "200ms",
		"--health-interval", "500ms",
		"--shutdown-timeout", "2s",
		"--rate-per-principal", "0",
		"--rate-per-tenant", "0",
		// The model (model.go) does not count attempts: an intent that
		// faults sent to NEEDS_REVIEW after too many lapses would read as
		// a violation. The limit itself is tested in etcdstore.
		"--max-attempts", "1000",
		"--log-format", "json",
		// Served counts the access log's "finished call" lines.
		"--access-log",
		// Replicas and concurrent test packages must not compete for the
		// default metrics port; nothing here scrapes it.
		"--metrics-listen", "",
	}
	if cfg.InjectedClock {
		d.args = append(d.args, "--fault-clock-offset-file", d.ClockFile)
	}
	t.Cleanup(func() {
		d.mu.Lock()
		p := d.proc
		d.mu.Unlock()
		if p != nil && !p.terminate(5*time.Second) {
			t.Errorf("intentd %s ignored SIGTERM for 5s; killed", name)
		}
		if t.Failed() {
			t.Logf("intentd %s log (last lines):\n%s", name, d.logs.Tail(20))
		}
	})
	if err := d.Restart(); err != nil {
		t.Fatal(err)
	}
	return d
}

// Restart starts the process (again) and waits until it logs "intentd
// serving".
func (d *Intentd) Restart() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil && d.proc.running() {
		return fmt.Errorf("reliability: intentd %s is already running", d.Name)
	}
	serving := make(chan struct{})
	var once sync.Once
	p, err := startProcess("intentd "+d.Name, d.bin, d.args, d.logs, func(line string) {
		var rec struct {
			Msg string `json:"msg"`
		}
		if strings.Contains(line, `"msg":"finished call"`) {
			d.served.Add(1)
			return
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "intentd serving" {
			once.Do(func() { close(serving) })
		}
	})
	if err != nil {
		return err
	}
	d.proc = p
	select {
	case <-serving:
		return nil
	case <-p.exited:
		return fmt.Errorf("reliability: intentd %s exited before serving:\n%s", d.Name, d.logs.Tail(20))
	case <-time.After(30 * time.Second):
		p.kill()
		return fmt.Errorf("reliability: intentd %s did not serve within 30s:\n%s", d.Name, d.logs.Tail(20))
	}
}

// Stop sends SIGTERM and waits until the process is gone (SIGKILL after
// 5s); it reports whether the process ended on SIGTERM.
func (d *Intentd) Stop() bool {
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	return p == nil || p.terminate(5*time.Second)
}

// SetClock makes the replica's wall clock run offset away from the
// machine's from now on (0: back to the machine's). intentd rereads the
// file within 100ms.
func (d *Intentd) SetClock(offset time.Duration) error {
	tmp := d.ClockFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(offset.String()+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, d.ClockFile)
}

// Exited reports whether the process ended on its own within wait.
func (d *Intentd) Exited(wait time.Duration) bool {
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return true
	case <-time.After(wait):
		return false
	}
}

// Kill sends SIGKILL and waits until the process is gone.
func (d *Intentd) Kill() {
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	if p != nil {
		p.kill()
	}
}
