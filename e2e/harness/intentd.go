package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// IntentdConfig shapes an intentd process.
type IntentdConfig struct {
	// Endpoints are the etcd endpoints (a cluster's proxies). None: intentd
	// runs its embedded etcd in its data directory, on loopback ports of
	// its choosing.
	Endpoints []string
	// RequestTimeout bounds each etcd call, OperationTimeout one store
	// operation with its retries: what a caller waits at most for an
	// UNAVAILABLE while etcd does not answer (zero: intentd's defaults).
	RequestTimeout, OperationTimeout time.Duration
	// Flags are added to the ones every intentd here gets (see
	// StartIntentd).
	Flags []string
	// InjectedClock runs Binaries.FaultClockIntentd instead of intentd: a
	// wall clock the test can move (Intentd.SetClock), starting ClockOffset
	// away from the machine's.
	InjectedClock bool
	ClockOffset   time.Duration
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
	env  []string
	logs *testlog.Lines

	// served counts the calls it logged as finished, over its restarts.
	served atomic.Int64

	mu   sync.Mutex
	proc *Process
}

// Served is how many calls the replica has answered (its "finished call"
// log lines), over all its runs: proof that it carried load.
func (d *Intentd) Served() int64 { return d.served.Load() }

// StartIntentd starts intentd from bins and waits until it serves; it is
// stopped when the test ends (SIGTERM, SIGKILL 5s later). Every intentd
// here serves on a fixed loopback port (clients find it again after a
// restart), logs JSON with every call (--access-log: Served counts them),
// sweeps every 200ms, gives in-flight calls 2s on SIGTERM and leaves the
// metrics port alone (replicas and concurrent test binaries would collide
// on it); cfg adds the rest.
func StartIntentd(t testing.TB, bins Binaries, name string, cfg IntentdConfig) *Intentd {
	t.Helper()
	bin := bins.Intentd
	if cfg.InjectedClock {
		if bin = bins.FaultClockIntentd; bin == "" {
			t.Fatal("harness: an injected clock needs Want.FaultClock")
		}
	}
	port, err := freeport.Port()
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
		"--janitor-interval", "200ms",
		"--shutdown-timeout", "2s",
		"--log-format", "json",
		// Served counts the access log's "finished call" lines.
		"--access-log",
		"--metrics-listen", "",
	}
	if len(cfg.Endpoints) > 0 {
		d.args = append(d.args, "--etcd-endpoints", strings.Join(cfg.Endpoints, ","), "--dial-timeout", "10s")
	} else {
		d.args = append(d.args, "--embed-client-url", "http://127.0.0.1:0", "--embed-peer-url", "http://127.0.0.1:0")
	}
	if cfg.RequestTimeout > 0 {
		d.args = append(d.args, "--request-timeout", cfg.RequestTimeout.String())
	}
	if cfg.OperationTimeout > 0 {
		d.args = append(d.args, "--operation-timeout", cfg.OperationTimeout.String())
	}
	d.args = append(d.args, cfg.Flags...)
	if cfg.InjectedClock {
		// See e2e/cmd/intentd-faultclock.
		d.env = []string{"FAULT_CLOCK_OFFSET_FILE=" + d.ClockFile}
		if err := d.SetClock(cfg.ClockOffset); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		d.mu.Lock()
		p := d.proc
		d.mu.Unlock()
		if p != nil && !p.Terminate(5*time.Second) {
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
	if d.proc != nil && d.proc.Running() {
		return fmt.Errorf("harness: intentd %s is already running", d.Name)
	}
	serving := make(chan struct{})
	var once sync.Once
	p, err := StartProcess(d.command(), ProcessConfig{Name: "intentd " + d.Name, Logs: d.logs, OnLine: func(line string) {
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
	}})
	if err != nil {
		return err
	}
	d.proc = p
	select {
	case <-serving:
		return nil
	case <-p.Exited():
		return fmt.Errorf("harness: intentd %s exited before serving:\n%s", d.Name, d.logs.Tail(20))
	case <-time.After(30 * time.Second):
		p.Kill()
		return fmt.Errorf("harness: intentd %s did not serve within 30s:\n%s", d.Name, d.logs.Tail(20))
	}
}

func (d *Intentd) command() *exec.Cmd {
	cmd := exec.Command(d.bin, d.args...)
	cmd.Env = append(os.Environ(), d.env...)
	return cmd
}

// Stop sends SIGTERM and waits until the process is gone (SIGKILL after
// 5s); it reports whether the process ended on SIGTERM.
func (d *Intentd) Stop() bool {
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	return p == nil || p.Terminate(5*time.Second)
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
	case <-p.Exited():
		return true
	case <-time.After(wait):
		return false
	}
}

// Pause stops the process (SIGSTOP): it answers nothing and its etcd
// sessions' leases run out, until Resume.
func (d *Intentd) Pause() error { return d.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT) where it stopped.
func (d *Intentd) Resume() error { return d.signal(syscall.SIGCONT) }

func (d *Intentd) signal(sig syscall.Signal) error {
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	if p == nil {
		return fmt.Errorf("harness: %s is not running", d.Name)
	}
	return p.Signal(sig)
}

// Kill sends SIGKILL and waits until the process is gone.
func (d *Intentd) Kill() {
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}
