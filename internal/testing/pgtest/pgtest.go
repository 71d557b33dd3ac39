// Package pgtest starts a real PostgreSQL server for a test: Debian's
// server binaries (scripts/install-postgres.sh installs them), a cluster
// made by initdb in a temporary directory, a free loopback port and a unix
// socket directory of its own, stopped when the test ends. Tests of
// intentd's archive run against it, never a mock.
//
// A test can stop the server and start it again on the same data (Stop,
// Start), crash it (Kill), and freeze it (Pause, Resume: SIGSTOP and
// SIGCONT of the postmaster and every process it started), for the
// reliability scenarios of a slow or vanished archive.
//
// initdb and postgres refuse to run as root; when the test runs as root
// they run as the user "postgres" (which Debian's packages create), or
// "nobody" where there is none, on directories handed to that user.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/intentd/intentd/internal/core/freeport"
)

// BinDirs is where Bin looks for the server's binaries: Debian's layout,
// one directory per major version.
const BinDirs = "/usr/lib/postgresql/*/bin"

// Install is what to run when the binaries are missing.
const Install = "./scripts/install-postgres.sh (as root; it runs apt-get install postgresql-<major>)"

// Superuser is the role initdb creates and every DSN names.
const Superuser = "postgres"

// Bin is the directory of the newest installed PostgreSQL server that has
// both initdb and postgres.
func Bin() (string, error) { return binIn(BinDirs) }

func binIn(glob string) (string, error) {
	dirs, _ := filepath.Glob(glob)
	type found struct {
		major int
		dir   string
	}
	var all []found
	for _, d := range dirs {
		major, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil {
			continue
		}
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			all = append(all, found{major, d})
		}
	}
	if len(all) == 0 {
		return "", fmt.Errorf("pgtest: no PostgreSQL server binaries (initdb and postgres in %s); run %s", glob, Install)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].major > all[j].major })
	return all[0].dir, nil
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Server is a PostgreSQL server started for a test.
type Server struct {
	// Port is the loopback TCP port the server listens on (127.0.0.1).
	Port int
	// Dir is the data directory.
	Dir string

	bin     string
	sockDir string
	logPath string
	cred    *syscall.Credential // nil: run as ourselves

	mu     sync.Mutex
	proc   *os.Process
	exited chan struct{} // closed when proc has been waited for
	paused bool
	dbs    atomic.Int64
}

// Start initializes a cluster in a temporary directory and starts a server
// on it, on a free loopback port; the server is stopped when the test
// ends. It fails the test, saying what to install, when the binaries are
// missing.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Bin()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{bin: bin}
	base := t.TempDir()
	s.Dir = filepath.Join(base, "data")
	s.logPath = filepath.Join(base, "postgres.log")
	// A unix socket's path is at most 107 bytes: the socket directory is
	// a short one of its own, not inside the test's.
	s.sockDir, err = os.MkdirTemp("", "pgtest")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(s.sockDir) })
	if os.Geteuid() == 0 {
		if err := s.runAsUnprivileged(base); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.Dir, "-U", Superuser, "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Env = env()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	t.Cleanup(s.stop)
	var lastErr error
	for range 5 { // another test may take the free port between our look and the server's bind
		if s.Port, err = freeport.Port(); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("pgtest: %v", lastErr)
	return nil
}

// runAsUnprivileged picks the user the server runs as (we are root) and
// hands it the test's directory and the socket directory.
func (s *Server) runAsUnprivileged(base string) error {
	var u *user.User
	var err error
	for _, name := range []string{"postgres", "nobody"} {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("running as root, and neither user postgres nor nobody exists to run initdb as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	for _, d := range []string{base, s.sockDir} {
		if err := os.Chown(d, uid, gid); err != nil {
			return err
		}
	}
	// The directories above base (the test's temporary root, 0700) must
	// let that user through.
	for d := filepath.Dir(base); d != "/" && d != filepath.Clean(os.TempDir()); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o011); err != nil {
				return err
			}
		}
	}
	return nil
}

// env is the environment of initdb and postgres: ours, without the
// variables that would point them elsewhere.
func env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LC_ALL=C", "TZ=UTC")
}

// start runs postgres on the data directory and waits until it accepts
// connections.
func (s *Server) start() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.Dir,
		"-p", strconv.Itoa(s.Port), "-k", s.sockDir,
		"-c", "listen_addresses=127.0.0.1",
		// A test's cluster is thrown away: durability buys nothing.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB", "-c", "max_connections=60")
	cmd.Env = env()
	cmd.Stdout, cmd.Stderr = logf, logf
	// A test binary killed before its cleanups (a -timeout panic, a
	// SIGKILL) takes its server along: SIGQUIT is postgres's immediate
	// shutdown. (The kernel sends it when the thread that started the
	// server ends; Go ends a thread only with a goroutine that locked it
	// and did not unlock it, which nothing here does.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.proc, s.exited, s.paused = cmd.Process, exited, false
	s.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("postgres exited while starting on port %d; its log:\n%s", s.Port, s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if s.ready(cmd.Process.Pid) {
			return nil
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("postgres not ready after 60s on port %d; its log:\n%s", s.Port, s.logTail())
		}
	}
}

// ready reports whether the postmaster pid says it accepts connections:
// the eighth line of postmaster.pid is "ready" from then on (PostgreSQL
// 10 and later). The first line is the postmaster's pid: a file left by
// a postmaster that was killed says "ready" too.
func (s *Server) ready(pid int) bool {
	b, err := os.ReadFile(filepath.Join(s.Dir, "postmaster.pid"))
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	return len(lines) >= 8 && strings.TrimSpace(lines[0]) == strconv.Itoa(pid) && strings.TrimSpace(lines[7]) == "ready"
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Log is what the server wrote to its log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// DSN is a connection string for database name on the server, as the
// superuser, over TCP without TLS.
func (s *Server) DSN(name string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", Superuser, s.Addr(), name)
}

// NewDatabase creates an empty database of its own on the server and
// returns its DSN, so that tests can share one server.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("test%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connecting: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return s.DSN(name)
}

// Stop shuts the server down (a fast shutdown: sessions are ended) and
// waits until it has exited; its data stays for Start. A paused server is
// resumed first.
func (s *Server) Stop() error {
	s.mu.Lock()
	proc, exited, paused := s.proc, s.exited, s.paused
	s.mu.Unlock()
	if proc == nil {
		return nil
	}
	if paused {
		s.Resume()
	}
	proc.Signal(syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		s.kill()
		return fmt.Errorf("pgtest: postgres ignored a fast shutdown for 60s; killed it")
	}
	s.mu.Lock()
	s.proc = nil
	s.mu.Unlock()
	return nil
}

// Start starts the server again on the same data directory and port.
func (s *Server) Start() error {
	s.mu.Lock()
	running := s.proc != nil
	s.mu.Unlock()
	if running {
		return errors.New("pgtest: the server is running")
	}
	return s.start()
}

// Kill crashes the server: SIGKILL to the postmaster and every process it
// started, as a machine's power loss would (the data directory recovers
// on Start, as after a crash).
func (s *Server) Kill() {
	s.kill()
}

func (s *Server) kill() {
	s.mu.Lock()
	proc, exited := s.proc, s.exited
	s.proc = nil
	s.paused = false
	s.mu.Unlock()
	if proc == nil {
		return
	}
	kids := children(proc.Pid)
	proc.Signal(syscall.SIGKILL)
	for _, pid := range kids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	<-exited
	// The children were killed too; wait until they are gone, or the
	// next postmaster finds its shared memory still attached.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range kids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Pause freezes the server: SIGSTOP to the postmaster and every process
// it started. Connections stay open and calls hang, as on a stalled
// machine, until Resume.
func (s *Server) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.paused {
		return
	}
	// The postmaster first, so that it starts no process we would miss.
	s.proc.Signal(syscall.SIGSTOP)
	for _, pid := range children(s.proc.Pid) {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	s.paused = true
}

// Resume undoes Pause.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || !s.paused {
		return
	}
	for _, pid := range children(s.proc.Pid) {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	s.proc.Signal(syscall.SIGCONT)
	s.paused = false
}

// Pids is the postmaster's process id and its children's.
func (s *Server) Pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	return append([]int{s.proc.Pid}, children(s.proc.Pid)...)
}

// children is the processes whose parent is pid (the postmaster's
// children each lead a session of their own, so a process group does
// not hold them).
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after
		// its closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// stop is the test's cleanup.
func (s *Server) stop() {
	if err := s.Stop(); err != nil {
		s.kill()
	}
}
