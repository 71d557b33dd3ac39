package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// Gateway is an `intentd gateway` process (the fencing gateway) serving on
// a fixed loopback port, so that workers find it again after a restart.
type Gateway struct {
	// Name tells replicas apart in messages.
	Name string
	// URL is where it serves (http://127.0.0.1:port).
	URL string

	bin  string
	args []string
	logs *testlog.Lines

	mu   sync.Mutex
	proc *Process
}

// StartGateway starts `intentd gateway` from bins in front of the intentd
// at intentdAddr, with config (YAML: its upstreams, and flags by name) and
// the extra flags, and waits until it serves; it is stopped when the test
// ends. It logs JSON, and gives in-flight calls 5s on SIGTERM.
func StartGateway(t testing.TB, bins Binaries, name, intentdAddr, config string, flags ...string) *Gateway {
	t.Helper()
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	g := &Gateway{Name: name, URL: "http://" + addr, bin: bins.Intentd, logs: &testlog.Lines{}}
	g.args = append([]string{"gateway", "--config", path, "--listen", addr, "--intentd", intentdAddr,
		"--log-format", "json", "--shutdown-timeout", "5s"}, flags...)
	t.Cleanup(func() {
		g.mu.Lock()
		p := g.proc
		g.mu.Unlock()
		if p != nil && !p.Terminate(10*time.Second) {
			t.Errorf("gateway %s ignored SIGTERM for 10s; killed", name)
		}
		if t.Failed() {
			t.Logf("gateway %s log (last lines):\n%s", name, g.logs.Tail(20))
		}
	})
	if err := g.Restart(); err != nil {
		t.Fatal(err)
	}
	return g
}

// Restart starts the process (again) and waits until it logs "intentd
// gateway serving".
func (g *Gateway) Restart() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.proc != nil && g.proc.Running() {
		return fmt.Errorf("harness: gateway %s is already running", g.Name)
	}
	serving := make(chan struct{})
	var once sync.Once
	p, err := StartProcess(exec.Command(g.bin, g.args...), ProcessConfig{Name: "gateway " + g.Name, Logs: g.logs, OnLine: func(line string) {
		var rec struct {
			Msg string `json:"msg"`
		}
		if strings.Contains(line, "intentd gateway serving") && json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "intentd gateway serving" {
			once.Do(func() { close(serving) })
		}
	}})
	if err != nil {
		return err
	}
	g.proc = p
	select {
	case <-serving:
		return nil
	case <-p.Exited():
		return fmt.Errorf("harness: gateway %s exited before serving:\n%s", g.Name, g.logs.Tail(20))
	case <-time.After(30 * time.Second):
		p.Kill()
		return fmt.Errorf("harness: gateway %s did not serve within 30s:\n%s", g.Name, g.logs.Tail(20))
	}
}

// Kill sends SIGKILL and waits until the process is gone: calls in flight
// lose their answers.
func (g *Gateway) Kill() {
	g.mu.Lock()
	p := g.proc
	g.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Stop sends SIGTERM and waits until the process is gone (SIGKILL after
// 10s); it reports whether it ended on SIGTERM.
func (g *Gateway) Stop() bool {
	g.mu.Lock()
	p := g.proc
	g.mu.Unlock()
	return p == nil || p.Terminate(10*time.Second)
}
