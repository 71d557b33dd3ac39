// Package intentdtest runs intentd in-process for the unit tests of the
// packages around it: Start runs the whole daemon (internal/run/daemon.Run,
// with its own embedded etcd or the etcd the config names), Serve runs the
// server package's IntentService alone on an etcdstore over a given etcd
// member. Either way the test gets a real gRPC server on a loopback port
// the kernel chose, and everything stops when the test ends. (Black-box
// tests run the built binary instead: see e2e/harness.)
package intentdtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/server"
)

// How long an intentd may take to serve, and to stop.
const (
	readyWithin = 60 * time.Second
	stopWithin  = 30 * time.Second
)

// Config returns daemon.DefaultConfig with its data in dataDir and every
// listener (gRPC, metrics, the embedded etcd's) on a loopback port the
// kernel chooses, so that a test's intentd runs beside any other.
func Config(dataDir string) daemon.Config {
	cfg := daemon.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = dataDir
	cfg.EmbedClientURL = "http://127.0.0.1:0"
	cfg.EmbedPeerURL = "http://127.0.0.1:0"
	cfg.MetricsListen = "127.0.0.1:0"
	return cfg
}

// Intentd is one intentd run in-process.
type Intentd struct {
	// Addr is where it serves gRPC (host:port).
	Addr string
	// Store is the store Serve built, for tests that drive it directly (a
	// janitor pass); nil for Start's.
	Store *etcdstore.Store

	shutdown func()
	exited   chan error
	result   error
	ended    bool // result holds what exited said
	seen     bool // a caller of Wait or Stop has been given result
}

// Run runs daemon.Run with cfg in-process, logging to log, and returns
// once it serves; an error if Run returned first, or if it did not serve
// within a minute. Stop ends it. Tests use Start; Run is for a TestMain.
func Run(cfg daemon.Config, log *slog.Logger) (*Intentd, error) {
	ctx, cancel := context.WithCancel(context.Background())
	in := &Intentd{shutdown: cancel, exited: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() { in.exited <- daemon.Run(ctx, cfg, log, func(addr string) { ready <- addr }) }() // returns once ctx ends
	select {
	case in.Addr = <-ready:
		return in, nil
	case err := <-in.exited:
		cancel()
		return nil, fmt.Errorf("intentd exited at start: %w", err)
	case <-time.After(readyWithin):
		cancel()
		return nil, fmt.Errorf("intentd not ready after %v", readyWithin)
	}
}

// Main is the TestMain of a package whose tests share one intentd: it runs
// intentd with Config (data in a new temporary directory), changed by
// configure unless nil, sets *addr to where it serves, runs the tests, stops
// intentd, and exits with the tests' status.
func Main(m *testing.M, addr *string, configure func(*daemon.Config)) {
	dir, err := os.MkdirTemp("", "intentdtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg := Config(dir)
	if configure != nil {
		configure(&cfg)
	}
	in, err := Run(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*addr = in.Addr
	code := m.Run()
	_ = in.Stop()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// Start is Run for a test: it fails t unless intentd serves, and when the
// test ends it stops intentd and fails t unless Run returned nil within 30
// seconds (unless the test took Run's result itself, from Wait or Stop).
func Start(t testing.TB, cfg daemon.Config, log *slog.Logger) *Intentd {
	t.Helper()
	in, err := Run(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.stopAtCleanup(t) })
	return in
}

// Serve starts one IntentService replica on the etcd member e, for the
// tests of package server: an etcdstore.Store configured by cfg (its
// logger discarded), and the service alone (no guard, no daemon) on a
// gRPC server decoding requests as intentd's does (server.RequestCodec,
// DecodedService, DecodeInterceptors ahead of the interceptors in opts).
// Two replicas on one member share nothing but etcd, as two intentd
// processes would. Everything stops when the test ends.
func Serve(t testing.TB, e *etcdtest.Server, cfg etcdstore.Config, opts ...grpc.ServerOption) *Intentd {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	store, err := etcdstore.New(e.Client(t), cfg)
	if err != nil {
		t.Fatalf("etcdstore.New: %v", err)
	}
	svc, err := server.New(store, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	decodeUnary, decodeStream := server.DecodeInterceptors()
	opts = append([]grpc.ServerOption{
		server.RequestCodec(),
		grpc.ChainUnaryInterceptor(decodeUnary), grpc.ChainStreamInterceptor(decodeStream),
	}, opts...)
	srv := grpc.NewServer(opts...)
	srv.RegisterService(server.DecodedService(&intentv1.IntentService_ServiceDesc), svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	in := &Intentd{Addr: lis.Addr().String(), Store: store, shutdown: srv.Stop, exited: make(chan error, 1)}
	go func() { in.exited <- srv.Serve(lis) }() // returns once srv.Stop runs
	t.Cleanup(func() { in.stopAtCleanup(t) })
	return in
}

// Dial returns a plaintext gRPC connection to in, closed when the test
// ends (before in stops).
func (in *Intentd) Dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(in.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", in.Addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Shutdown begins stopping intentd, as SIGTERM does; Wait tells when it
// has stopped. Calling it again does nothing.
func (in *Intentd) Shutdown() { in.shutdown() }

// Wait waits up to within for intentd to stop, on its own or after
// Shutdown, and returns Run's (or the gRPC server's) result; ok is false
// if it still runs.
func (in *Intentd) Wait(within time.Duration) (err error, ok bool) {
	if !in.ended {
		select {
		case in.result = <-in.exited:
			in.ended = true
		case <-time.After(within):
			return nil, false
		}
	}
	in.seen = true
	return in.result, true
}

// Goroutines is the stack of every goroutine of this process, intentd's
// included (it runs in the test's process): what a test prints when
// intentd does not stop, to say what holds it.
func Goroutines() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return b.String()
}

// errStillRunning is Stop's error for an intentd that did not stop in time.
var errStillRunning = fmt.Errorf("intentd did not stop within %v", stopWithin)

// Stop shuts intentd down and returns Run's result once it stopped, or an
// error if it still runs after 30 seconds.
func (in *Intentd) Stop() error {
	in.Shutdown()
	err, ok := in.Wait(stopWithin)
	if !ok {
		return errStillRunning
	}
	return err
}

// stopAtCleanup stops intentd when the test ends, failing t unless it
// stopped cleanly or the test took its result already.
func (in *Intentd) stopAtCleanup(t testing.TB) {
	seen := in.seen
	err := in.Stop()
	switch {
	case errors.Is(err, errStillRunning):
		t.Errorf("%v; what holds it:\n%s", err, Goroutines())
	case err != nil && !seen:
		t.Errorf("intentd exited with %v, want a clean stop", err)
	}
}
