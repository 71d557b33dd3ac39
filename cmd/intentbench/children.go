package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/intentd/intentd/internal/run/embedetcd"
	"github.com/intentd/intentd/internal/run/intentdcmd"
)

// childEnv tells a copy of this binary which server it is. Every server
// the benchmark measures runs in a process of its own, so that its CPU
// time and memory can be read from /proc and the clients' work is not
// counted in it.
const childEnv = "INTENTBENCH_CHILD"

// runChild runs the server named by childEnv, if any, and reports whether
// it did; its exit status is then the process's.
func runChild() (int, bool) {
	switch os.Getenv(childEnv) {
	case "intentd":
		// intentd's own command, flags and all: what cmd/intentd runs.
		return intentdcmd.Main(os.Args[1:], os.Stderr, nil), true
	case "etcd":
		return childMain(serveEtcd), true
	case "echo":
		return childMain(serveEcho), true
	case "front":
		return childMain(serveFront), true
	}
	return 0, false
}

func childMain(serve func(args []string) error) int {
	if err := serve(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "intentbench child:", err)
		return 1
	}
	return 0
}

// serveEtcd runs an embedded etcd with its defaults (fsync on), as
// intentd's embedded one, in data directory args[0], serving clients on
// args[1], until SIGTERM.
func serveEtcd(args []string) error {
	if len(args) != 2 {
		return errors.New("etcd: want a data directory and a client URL")
	}
	client, err := url.Parse(args[1])
	if err != nil {
		return err
	}
	e, err := startEmbedded("raw", args[0], *client)
	if err != nil {
		return err
	}
	defer e.Close()
	return waitTerm(e.Err())
}

// startEmbedded starts a single-member etcd named name, with etcd's
// defaults, its data in dir, serving clients on the URLs given (the first
// advertised), and waits until it is ready.
func startEmbedded(name, dir string, clients ...url.URL) (*embed.Etcd, error) {
	peer, _ := url.Parse("http://127.0.0.1:0")
	cfg := embedetcd.Config(name, dir, *peer)
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.ListenClientUrls = clients
	cfg.AdvertiseClientUrls = clients[:1]
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	if err := embedetcd.WaitReady(e, time.Minute); err != nil {
		return nil, err // WaitReady closed it
	}
	return e, nil
}

// serveEcho serves the gRPC health service on args[0]: the cheapest unary
// call a gRPC server here can answer, the floor of any service.
func serveEcho(args []string) error {
	if len(args) != 1 {
		return errors.New("echo: want a listen address")
	}
	l, err := net.Listen("tcp", args[0])
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(l) }()
	defer s.Stop()
	return waitTerm(errc)
}

// waitTerm returns when SIGTERM arrives (nil) or errc yields.
func waitTerm(errc <-chan error) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	select {
	case <-sig:
		return nil
	case err := <-errc:
		return err
	}
}

// child is a server process started by the benchmark.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startChild starts this binary as the server kind with args, its output
// in dir/<name>.log. The child dies with the benchmark (Pdeathsig).
func startChild(dir, name, kind string, args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return startExec(dir, name, self, []string{childEnv + "=" + kind}, args...)
}

// startProgram starts the program at path (another intentd binary, say)
// with args, as startChild starts this binary.
func startProgram(dir, name, path string, args ...string) (*child, error) {
	return startExec(dir, name, path, nil, args...)
}

func startExec(dir, name, self string, env []string, args ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) // a restart appends
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.done) }() // exits with the child
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// exited returns an error with the tail of its log if the child has
// exited, nil while it runs.
func (c *child) exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited (%v): %s", c.name, c.err, c.tail())
	default:
		return nil
	}
}

func (c *child) tail() string {
	b, _ := os.ReadFile(c.log)
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// stop sends SIGTERM and waits for the exit, then kills after 15 s.
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// waitServing polls the gRPC health service on conn until it answers
// SERVING, the child exits, or a minute passes.
func waitServing(ctx context.Context, c *child, conn *grpc.ClientConn) error {
	hc := healthpb.NewHealthClient(conn)
	return poll(ctx, c, "serving", func(ctx context.Context) error {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("status %v", resp.GetStatus())
		}
		return err
	})
}

// poll calls try, with a second for each call, every 50 ms until it
// succeeds, the child (if any) exits, or a minute passes; the error then
// says the server was not yet what, with try's last error.
func poll(ctx context.Context, c *child, what string, try func(context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := try(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if c != nil {
			if err := c.exited(); err != nil {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not %s within a minute (last: %v)", what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func etcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux architecture Go runs on.
const clockTicks = 100

// proc reads a server process's CPU time and memory from /proc. A zero
// pid (a server the benchmark did not start) reads as unknown.
type proc struct{ pid int }

// cpu is the process's user plus system time; negative when unknown.
func (p proc) cpu() time.Duration {
	f, ok := p.stat()
	if !ok {
		return -1
	}
	return statTicks(f, statUtime)
}

// The fields of /proc/<pid>/stat that the benchmark reads, as indexes of
// proc.stat's fields: the parent's pid (field 4), utime and stime (14 and
// 15), cutime and cstime (16 and 17: the children that have ended and
// that the process has waited for).
const (
	statPPid   = 1
	statUtime  = 11
	statCutime = 13
)

// stat is the fields of /proc/<pid>/stat after the command name (which
// may hold spaces), the state (field 3) first; ok is false when unknown.
func (p proc) stat() (_ []string, ok bool) {
	if p.pid == 0 {
		return nil, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return nil, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(b[i+1:])), true
}

// statTicks adds two clock-tick fields of a stat, at and the next (utime
// and stime, or cutime and cstime); negative when unknown.
func statTicks(f []string, at int) time.Duration {
	if len(f) < at+2 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[at], 10, 64)
	s, err2 := strconv.ParseInt(f[at+1], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(u+s) * time.Second / clockTicks
}

// idleWindow is how long the heartbeat workload watches intentd with no
// call in flight, to tell its background CPU from what calls cost.
const idleWindow = 2 * time.Second

// idleCPU is the CPU the process uses in d while nothing is asked of it,
// -1 when unknown (a running intentd of another host, or ctx ended).
func (p proc) idleCPU(ctx context.Context, d time.Duration) time.Duration {
	c0 := p.cpu()
	select {
	case <-ctx.Done():
		return -1
	case <-time.After(d):
	}
	return p.cpuSince(c0)
}

// cpuSince is the CPU time the process has spent since cpu returned c0;
// negative when either reading is unknown.
func (p proc) cpuSince(c0 time.Duration) time.Duration {
	if c1 := p.cpu(); c0 >= 0 && c1 >= 0 {
		return c1 - c0
	}
	return -1
}

// mem is a process's resident memory, in bytes (zero: unknown): now, at
// its peak, now without file-backed pages (anon), and those pages alone
// (file: etcd's bbolt database is memory-mapped; its pages are the page
// cache's, reclaimable).
type mem struct{ rss, peak, anon, file int64 }

// memory reads the process's resident memory from /proc.
func (p proc) memory() mem {
	var m mem
	if p.pid == 0 {
		return m
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		return m
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var field *int64
		switch name {
		case "VmRSS":
			field = &m.rss
		case "VmHWM":
			field = &m.peak
		case "RssAnon":
			field = &m.anon
		case "RssFile":
			field = &m.file
		default:
			continue
		}
		if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64); err == nil {
			*field = kb << 10
		}
	}
	return m
}
