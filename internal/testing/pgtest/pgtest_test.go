package pgtest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/intentd/intentd/internal/testing/pgtest"
)

func query(t *testing.T, dsn string, timeout time.Duration, sql string) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, sql).Scan(&n)
	return n, err
}

func TestServerLifecycle(t *testing.T) {
	s := pgtest.Start(t)
	dsn := s.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	steps := []struct {
		name    string
		do      func(t *testing.T)
		want    int  // kept's value, when the query answers
		hangs   bool // the query must time out instead
		refused bool // the query must fail at once
	}{
		{name: "running", do: func(*testing.T) {}, want: 7},
		{name: "stopped", do: func(t *testing.T) {
			if err := s.Stop(); err != nil {
				t.Fatal(err)
			}
		}, refused: true},
		{name: "started again on the same data", do: func(t *testing.T) {
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
		}, want: 7},
		{name: "paused", do: func(*testing.T) { s.Pause() }, hangs: true},
		{name: "resumed", do: func(*testing.T) { s.Resume() }, want: 7},
		{name: "killed", do: func(*testing.T) { s.Kill() }, refused: true},
		{name: "recovered after the crash", do: func(t *testing.T) {
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
		}, want: 7},
		{name: "paused, then stopped", do: func(t *testing.T) {
			s.Pause()
			if err := s.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
		}, want: 7},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do(t)
			start := time.Now()
			n, err := query(t, dsn, 2*time.Second, "SELECT n FROM kept")
			switch {
			case st.hangs:
				if !errors.Is(err, context.DeadlineExceeded) && time.Since(start) < 2*time.Second {
					t.Fatalf("a paused server answered after %v: n=%d err=%v", time.Since(start), n, err)
				}
			case st.refused:
				if err == nil {
					t.Fatalf("a server that is down answered %d", n)
				}
				if time.Since(start) > time.Second {
					t.Errorf("a server that is down took %v to refuse", time.Since(start))
				}
			default:
				if err != nil || n != st.want {
					t.Fatalf("got %d, %v; want %d\nlog:\n%s", n, err, st.want, s.Log())
				}
			}
		})
	}
}

func TestPauseFreezesEveryProcess(t *testing.T) {
	s := pgtest.Start(t)
	pids := s.Pids()
	if len(pids) < 3 { // the postmaster, its checkpointer, writer, ...
		t.Fatalf("pids %v: want the postmaster and its children", pids)
	}
	state := func(pid int) byte {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return '?'
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] == ')' && i+2 < len(b) {
				return b[i+2]
			}
		}
		return '?'
	}
	// A signal is delivered when the kernel next schedules the process:
	// give it a moment.
	await := func(pid int, stopped bool) byte {
		var st byte
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if st = state(pid); (st == 'T') == stopped {
				break
			}
		}
		return st
	}
	s.Pause()
	for _, pid := range pids {
		if st := await(pid, true); st != 'T' {
			t.Errorf("process %d in state %c while paused, want T", pid, st)
		}
	}
	s.Resume()
	for _, pid := range pids {
		if st := await(pid, false); st == 'T' {
			t.Errorf("process %d still stopped after Resume", pid)
		}
	}
}

func TestTwoServersAtOnce(t *testing.T) {
	a, b := pgtest.Start(t), pgtest.Start(t)
	if a.Port == b.Port {
		t.Fatalf("both on port %d", a.Port)
	}
	for _, s := range []*pgtest.Server{a, b} {
		if n, err := query(t, s.DSN("postgres"), 10*time.Second, "SELECT 1"); err != nil || n != 1 {
			t.Fatalf("%s: %d, %v", s.Addr(), n, err)
		}
	}
}

// TestServerDiesWithItsTest runs a test binary that starts a server and
// is then killed before its cleanups: the server must not outlive it.
func TestServerDiesWithItsTest(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") != "" {
		s := pgtest.Start(t)
		fmt.Println("PID", s.Pids()[0])
		os.Stdout.Sync()
		time.Sleep(time.Minute) // killed before it wakes
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^TestServerDiesWithItsTest$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "PID %d", &pid); err == nil {
			break
		}
	}
	if pid == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the child test started no server")
	}
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("postgres %d outlived its killed test by 30s", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
