package reliability

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/intentd/intentd/internal/testlog"
)

// process is one run of a child process whose stderr is read line by line.
// It is killed (SIGKILL) if the test binary dies first (Pdeathsig).
type process struct {
	name   string
	cmd    *exec.Cmd
	logs   *testlog.Lines
	exited chan struct{} // closed once the process exited and was reaped
}

// startProcess starts bin with args; onLine, if not nil, sees every line of
// its stderr (from a goroutine that exits when the process does).
func startProcess(name, bin string, args []string, logs *testlog.Lines, onLine func(string)) (*process, error) {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("reliability: start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logs: logs, exited: make(chan struct{})}
	go func() { // exits when the process closes stderr, i.e. exits
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			logs.Add(line)
			if onLine != nil {
				onLine(line)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig unless the process already exited.
func (p *process) signal(sig syscall.Signal) error {
	if !p.running() {
		return fmt.Errorf("reliability: %s already exited", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// kill sends SIGKILL (which also ends a stopped process) and waits for the
// exit.
func (p *process) kill() {
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.exited
}

// terminate sends SIGCONT and SIGTERM, and SIGKILL if the process is still
// there after grace; it reports whether the process ended on SIGTERM.
func (p *process) terminate(grace time.Duration) bool {
	if !p.running() {
		return true
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return true
	case <-time.After(grace):
		p.kill()
		return false
	}
}

// handedOut remembers the ports freePort returned: each is given once.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort returns a loopback port nobody listens on, never the same twice,
// chosen below the kernel's ephemeral range so that no outgoing connection
// takes it between the check and the bind, nor while a member is down for a
// restart.
func freePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := 20000 + rand.IntN(12000)
		if handedOut.ports[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		_ = ln.Close()
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("reliability: no free loopback port in 20000-32000")
}
