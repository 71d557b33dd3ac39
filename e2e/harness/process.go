package harness

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/intentd/intentd/internal/testing/testlog"
)

// ProcessConfig says what to do with a child process's output and exit.
type ProcessConfig struct {
	// Name names the process in errors ("etcd m1", "worker process p0").
	Name string
	// Logs keeps its stderr, line by line (and what Stdout chooses to add).
	Logs *testlog.Lines
	// OnLine, if set, sees every line of its stderr.
	OnLine func(line string)
	// Stdout, if set, reads its stdout until EOF; the process is reaped
	// only after Stdout returned, so nothing it wrote is lost. Unset: the
	// command's own Stdout stands.
	Stdout func(r io.Reader)
	// OnExit, if set, runs once the process was reaped, with what Wait
	// returned, before Exited is closed.
	OnExit func(err error)
}

// Process is one run of a child process. It is killed (SIGKILL) if the test
// binary dies first (Pdeathsig): a crashed suite leaves no etcd, intentd
// or worker behind.
type Process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process exited and was reaped
}

// StartProcess starts cmd and reads its output as cfg says, from goroutines
// that end when the process does.
func StartProcess(cmd *exec.Cmd, cfg ProcessConfig) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	var stdout io.Reader
	if cfg.Stdout != nil {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness: start %s: %w", cfg.Name, err)
	}
	p := &Process{name: cfg.Name, cmd: cmd, exited: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Go(func() { // exits when the process closes stderr, i.e. exits
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if cfg.Logs != nil {
				cfg.Logs.Add(line)
			}
			if cfg.OnLine != nil {
				cfg.OnLine(line)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	})
	if stdout != nil {
		readers.Go(func() {
			cfg.Stdout(stdout)
			_, _ = io.Copy(io.Discard, stdout)
		})
	}
	go func() { // exits once the process is reaped
		readers.Wait()
		err := cmd.Wait()
		if cfg.OnExit != nil {
			cfg.OnExit(err)
		}
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed once the process exited and was reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig unless the process already exited.
func (p *Process) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return fmt.Errorf("harness: %s already exited", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL (which also ends a stopped process) and waits for the
// exit.
func (p *Process) Kill() {
	if p.Running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.exited
}

// Terminate sends SIGCONT and SIGTERM, and SIGKILL if the process is still
// there after grace; it reports whether the process ended on SIGTERM.
func (p *Process) Terminate(grace time.Duration) bool {
	if !p.Running() {
		return true
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return true
	case <-time.After(grace):
		p.Kill()
		return false
	}
}
