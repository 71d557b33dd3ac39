package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/run/console"
	"github.com/intentd/intentd/internal/run/embedetcd"
	"github.com/intentd/intentd/internal/run/etcdsteer"
	"github.com/intentd/intentd/internal/run/netaddr"
	"github.com/intentd/intentd/internal/run/tracing"
	"github.com/intentd/intentd/server"
)

// Run serves intentd until ctx ends, or until the gRPC listener fails or
// etcd's revision goes back, then shuts down in order: /readyz 503 and
// health NOT_SERVING, the background parts stop, in-flight calls finish
// within ShutdownTimeout (then connections are cut; the console's own
// listener, if any, closes before the in-process server its pages call),
// the revision floor is persisted, the metrics and pprof listeners close, the etcd client closes, the
// embedded etcd stops. ready, if not nil, is called with the gRPC address
// once it accepts calls.
func Run(ctx context.Context, cfg Config, log *slog.Logger, ready func(addr string)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	scfg := cfg.Store
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("intentd: --data-dir %s: %w", cfg.DataDir, err)
	}
	// First: a bad --archive-dsn refuses before etcd starts.
	arch, err := openArchive(ctx, cfg, log)
	if err != nil {
		return err
	}
	if arch != nil {
		defer arch.Close() // last: after every component stopped
	}
	etcd, closeEtcd, err := connectEtcd(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeEtcd()
	cli, endpoints := etcd.cli, etcd.endpoints
	scfg.LocalGet = etcd.localGet
	m := newMetrics()
	am := newArchiveMetrics()
	if arch != nil {
		scfg.Archive = archiveAdapter{a: arch, m: am}
	}
	tr, err := tracing.Start(ctx, cfg.Tracing)
	if err != nil {
		return fmt.Errorf("intentd: --otlp-endpoint: %w", err)
	}
	defer flushTraces(tr, cfg.ShutdownTimeout, log)
	scfg.Logger = log
	scfg.TracerProvider = tr.Provider()
	scfg.ObserveTxn, scfg.ObserveBatch = m.observeTxn, m.observeBatch
	store, floor, err := openStore(ctx, cfg, scfg, cli, endpoints, m, log)
	if err != nil {
		return err
	}
	activity := console.NewActivity(scfg.Now)
	api, err := newAPI(cfg, store, m, tr, activity, log)
	if err != nil {
		return err
	}
	review, closeReview, err := newConsole(cfg, api, store.ConsoleSessions(), activity, consoleTiers(m, am, store, arch != nil), scfg.Now, log)
	if err != nil {
		return err
	}
	defer closeReview()
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("intentd: --listen %s: %w", cfg.Listen, err)
	}
	// Before anything serves: a build too old for the cluster's storage
	// format version refuses here, and the store's format gate is current
	// before its first write.
	id := replicaID(lis.Addr().String())
	formats, err := joinFormats(ctx, store, id, cfg)
	if err != nil {
		_ = lis.Close()
		return err
	}
	m.exportFormats(store, formats)
	m.formats = formatsHandler(store, formats.Replica)
	every := dbSizeEvery * cfg.HealthInterval
	lead := &janitorLease{every: cfg.JanitorInterval}
	am.register(m, store)
	watchArch, expireArch, filterArch := idle, idle, idle
	if arch != nil {
		watchArch = func(ctx context.Context) error {
			watchArchive(ctx, arch, am, api.serving, cfg.HealthInterval, every, cfg.Store.RequestTimeout, log)
			return nil
		}
		filterArch = func(ctx context.Context) error {
			store.RunArchiveFilter(ctx, cfg.HealthInterval, func(err error) {
				log.Warn("the filter of archived keys stopped; every key etcd does not hold asks the archive until it is loaded again", "err", err)
			})
			return nil
		}
		now := scfg.Now
		if now == nil {
			now = time.Now
		}
		expireArch = func(ctx context.Context) error { expireArchive(ctx, arch, lead, now, am, log); return nil }
	}
	// Stopped in this order: see Run's doc.
	c := startComponents(ctx,
		drain(api.serving),
		func(ctx context.Context) error {
			watchHealth(ctx, store, api.serving, cfg.HealthInterval, cfg.Store.RequestTimeout, log)
			return nil
		},
		func(ctx context.Context) error {
			watchDBSize(ctx, cli, endpoints, every, cfg.Store.RequestTimeout, m, log)
			return nil
		},
		func(ctx context.Context) error { watchDepths(ctx, store, every, m, log); return nil },
		func(ctx context.Context) error {
			reload(ctx, api.tokens, api.certs, cfg.ReloadInterval, log)
			return nil
		},
		// Its election carries the replica's id, which tells an
		// announced replica from one of a release before format versions.
		janitor(store, cli, id, cfg.JanitorInterval, lead, m, log),
		returnStartMemory(store),
		watchArch,
		expireArch,
		filterArch,
		serveGRPC(api.srv, lis, cfg.ShutdownTimeout, log),
		// Before the in-process server its pages call.
		serveConsole(cfg.ConsoleListen, review, log),
		serveGRPC(api.inProcess, api.inProcessLis, cfg.ShutdownTimeout, log),
		// After the servers: stopped, it persists the floor once more,
		// after the last call has been answered, so that the file holds
		// every revision a client was told.
		floorComponent(floor, api.serving, cfg, log),
		// After the servers too: the announcement is revoked once this
		// replica writes nothing more.
		formatsComponent(formats, api.serving, cfg, log),
		// The metrics listener outlives gRPC: probes read /readyz 503
		// while in-flight calls finish.
		serveMetrics(m, cfg.MetricsListen, api.serving, consoleBesideMetrics(cfg, review), log),
		servePprof(cfg.PprofListen, log),
	)
	log.Info("intentd serving", "grpc", lis.Addr().String(), "etcd", endpoints, "embedded", cfg.Embedded(), "data_dir", cfg.DataDir,
		"installation", floor.Installation(), "revision", store.HighestRevision(),
		"replica", id, "storage_format_written", store.WritesFormat(), "storage_format_readable", store.ReadsFormat())
	if ready != nil {
		ready(lis.Addr().String())
	}
	return c.wait(ctx, func(cause error) {
		if _, failed := errors.AsType[*serveError](cause); !failed {
			log.Info("intentd stopping", "timeout", cfg.ShutdownTimeout)
		}
	})
}

// etcdConn is how intentd reaches etcd.
type etcdConn struct {
	cli *clientv3.Client
	// endpoints are what it serves (for logs and the database-size
	// checks).
	endpoints []string
	// localGet reads the embedded member's own store
	// (etcdstore.Config.LocalGet); nil with external members.
	localGet func(context.Context, string) (*mvccpb.KeyValue, error)
}

// connectEtcd starts the embedded etcd, or with EtcdEndpoints steers among
// the external members, and returns the way to it; closeAll stops
// steering, closes the client and stops the embedded etcd, in that order.
//
// The embedded etcd's client is in-process (etcd's v3client): its calls
// are function calls into the etcd server, through the same request
// handlers a gRPC call reaches (quotas, request size limits, errors),
// without the socket, HTTP/2 framing and protobuf coding in between,
// which cost a third of intentd's CPU at one client. Its sockets still
// serve etcdctl and backups (see docs/BACKUP.md, "Backup and restore").
// The store reads the record of a replay that missed its cache from the
// member's own store (embedetcd.LocalGet), without even those handlers.
func connectEtcd(ctx context.Context, cfg Config, log *slog.Logger) (_ etcdConn, closeAll func(), err error) {
	var closers []func()
	closeOpened := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeOpened()
		}
	}()
	if cfg.Embedded() {
		e, err := startEmbedded(cfg, log)
		if err != nil {
			return etcdConn{}, nil, err
		}
		closers = append(closers, func() {
			e.Close()
			log.Info("embedded etcd stopped")
		})
		cli := v3client.New(e.Server)
		closers = append(closers, func() { _ = cli.Close() })
		// A single member: nothing to steer among.
		return etcdConn{cli: cli, endpoints: []string{"unix://" + cfg.EmbedSocket()}, localGet: embedetcd.LocalGet(e)}, closeOpened, nil
	}
	endpoints := cfg.EtcdEndpoints
	etcdTLSConfig, err := etcdTLS(cfg)
	if err != nil {
		return etcdConn{}, nil, err
	}
	etcdClient := func(endpoints ...string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{
			Endpoints:            endpoints,
			DialTimeout:          cfg.DialTimeout,
			DialKeepAliveTime:    cfg.EtcdKeepAliveTime,
			DialKeepAliveTimeout: cfg.EtcdKeepAliveTimeout,
			TLS:                  etcdTLSConfig,
			Logger:               zap.NewNop(),
		})
	}
	cli, err := etcdClient(endpoints...)
	if err != nil {
		return etcdConn{}, nil, fmt.Errorf("intentd: etcd client for %v: %w", endpoints, err)
	}
	closers = append(closers, func() { _ = cli.Close() })
	if len(endpoints) > 1 {
		stopSteering, err := steer(ctx, cli, cfg, endpoints, etcdClient, log)
		if err != nil {
			return etcdConn{}, nil, err
		}
		closers = append(closers, stopSteering) // before cli closes
	}
	return etcdConn{cli: cli, endpoints: endpoints}, closeOpened, nil
}

// openStore builds the store on cli and, once etcd answers, holds it to
// the revision floor kept in the data directory (etcdstore.Floor): it
// refuses to start on an etcd already below it.
func openStore(ctx context.Context, cfg Config, scfg etcdstore.Config, cli *clientv3.Client, endpoints []string, m *metrics, log *slog.Logger) (*etcdstore.Store, *etcdstore.Floor, error) {
	store, err := etcdstore.New(cli, scfg)
	if err != nil {
		return nil, nil, err
	}
	m.exportStore(store)
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	err = store.Ping(pctx)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("intentd: etcd at %v does not answer: %w", endpoints, err)
	}
	floor, err := store.HoldFloor(ctx, cfg.DataDir)
	if errors.Is(err, intent.ErrStoreRolledBack) {
		err = fmt.Errorf("intentd: refusing to start: %w", err)
		log.Error("etcd's revision went back; refusing to start", "err", err)
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, fmt.Errorf("intentd: %w", err)
	}
	return store, floor, nil
}

// api is the gRPC side of intentd: the server with its services, the
// readiness its health service tells, and the credentials it reloads; and
// the in-process server the review console calls.
type api struct {
	srv     *grpc.Server
	serving *readiness
	tokens  *access.Source // nil: authentication is off
	certs   *certs         // nil: plaintext
	// inProcess serves the same IntentService, with the same interceptors
	// (guard, validation, metrics, the console's activity), on an
	// in-memory listener and without TLS: the review console's calls never
	// leave the process, and a listener that requires client certificates
	// would refuse them.
	inProcess    *grpc.Server
	inProcessLis *bufconn.Listener
}

// newAPI builds the gRPC server on store: credentials, guard, TLS, the
// intent, health and reflection services; and the in-process server.
func newAPI(cfg Config, store *etcdstore.Store, m *metrics, tr *tracing.Tracing, activity *console.Activity, log *slog.Logger) (*api, error) {
	var a api
	var err error
	var directory func() *access.Directory
	if cfg.TokensFile != "" {
		if a.tokens, err = access.Open(cfg.TokensFile, log); err != nil {
			return nil, fmt.Errorf("intentd: --tokens-file: %w", err)
		}
		directory = a.tokens.Directory
	} else {
		log.Warn("authentication is off: every call acts as an anonymous admin; give --tokens-file to require credentials")
	}
	guard, err := server.NewGuard(directory, server.RateLimits{
		PerPrincipal: rate.Limit(cfg.RatePerPrincipal), PrincipalBurst: cfg.BurstPerPrincipal,
		PerTenant: rate.Limit(cfg.RatePerTenant), TenantBurst: cfg.BurstPerTenant,
	}, log)
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize)}, tr.ServerOptions()...)
	svc, err := server.New(store, log)
	if err != nil {
		return nil, err
	}
	a.inProcess = newGRPCServer(log, guard, m, activity, cfg.AccessLog, opts...)
	a.inProcess.RegisterService(server.DecodedService(&intentv1.IntentService_ServiceDesc), svc)
	a.inProcessLis = bufconn.Listen(1 << 20)
	if cfg.TLS() {
		if a.certs, err = loadCerts(cfg, log); err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(a.certs.config())))
	} else {
		log.Warn("serving plaintext gRPC", "listen", cfg.Listen, "loopback_only", netaddr.Loopback(cfg.Listen))
	}
	a.srv = newGRPCServer(log, guard, m, activity, cfg.AccessLog, opts...)
	a.srv.RegisterService(server.DecodedService(&intentv1.IntentService_ServiceDesc), svc)
	hs := health.NewServer()
	a.srv.RegisterService(server.DecodedService(&healthpb.Health_ServiceDesc), hs)
	a.serving = newReadiness(hs)
	m.exportReadiness(a.serving)
	reflection.Register(a.srv)
	// After every service is registered: it starts their series at zero.
	m.grpc.InitializeMetrics(a.srv)
	return &a, nil
}

// newConsole builds the review console on a client of the in-process
// server, its sign-in sessions in etcd beside the intents (so that every
// replica sees them), its overview's storage section from tiers, on the
// store's clock (nil: the wall clock); closeConn closes that client.
func newConsole(cfg Config, a *api, sessions console.SessionStore, activity *console.Activity, tiers func() console.Tiers, now func() time.Time, log *slog.Logger) (h http.Handler, closeConn func(), err error) {
	conn, err := grpc.NewClient("passthrough:///intentd-console",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return a.inProcessLis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.MaxRecvMsgSize)))
	if err != nil {
		return nil, nil, fmt.Errorf("intentd: console: %w", err)
	}
	ccfg := console.DefaultConfig()
	ccfg.Service, ccfg.Sessions, ccfg.Activity, ccfg.Tiers, ccfg.Now, ccfg.Log = intentv1.NewIntentServiceClient(conn), sessions, activity, tiers, now, log
	if a.tokens != nil {
		ccfg.Directory = a.tokens.Directory
	}
	c, err := console.New(ccfg)
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return c, func() { _ = conn.Close() }, nil
}

// drain turns the replica not ready for good when it is stopped (first):
// gRPC health NOT_SERVING and /readyz 503, so that load balancers drain it
// before gRPC stops.
func drain(serving *readiness) component {
	return func(ctx context.Context) error {
		<-ctx.Done()
		serving.shutdown()
		return nil
	}
}

// janitor campaigns for the janitor election and sweeps while elected.
func janitor(store *etcdstore.Store, cli *clientv3.Client, id string, every time.Duration, lead *janitorLease, m *metrics, log *slog.Logger) component {
	return func(ctx context.Context) error {
		store.RunJanitor(ctx, cli, id, every, func(r etcdstore.SweepReport, err error) {
			lead.passed(time.Now())
			if err == nil {
				m.sweep(r)
			}
			switch {
			case err != nil:
				log.Warn("janitor pass failed", "err", err)
			case r != (etcdstore.SweepReport{}):
				log.Info("janitor pass", "lapsed", r.Lapsed, "removed", r.Removed, "archived", r.Archived, "tombstones_removed", r.TombstonesRemoved, "overdue_unfinished", r.Overdue)
			}
		})
		return nil
	}
}

// returnStartMemory gives the memory a start read through back to the
// system once the store has learnt the tombstones: etcd's recovery and
// LearnTombstones read the whole database once, and under the collector's
// floor (intentd --gc-heap-floor) Go's scavenger keeps freed pages up to
// the floor as headroom, so an idle intentd would hold them; from here its
// resident memory is what it keeps, until load grows the heap again.
func returnStartMemory(store *etcdstore.Store) component {
	return func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return nil
		case <-store.TombstonesLearnt():
			debug.FreeOSMemory()
		}
		<-ctx.Done()
		return nil
	}
}

// idle is a component with nothing to do: it waits to be stopped.
func idle(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// serveError is the gRPC listener's failure, which stops the daemon.
type serveError struct{ err error }

func (e *serveError) Error() string { return "intentd: serve: " + e.err.Error() }
func (e *serveError) Unwrap() error { return e.err }

// serveGRPC serves srv on lis; stopped, it lets in-flight calls finish
// within timeout, then cuts the connections.
func serveGRPC(srv *grpc.Server, lis net.Listener, timeout time.Duration, log *slog.Logger) component {
	return func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- srv.Serve(lis) }() // exits when srv stops
		select {
		case err := <-served:
			return &serveError{err: err}
		case <-ctx.Done():
		}
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }() // exits when calls finish or Stop cuts them
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case <-stopped:
		case <-timer.C:
			log.Warn("graceful stop timed out; cutting connections")
			srv.Stop()
			<-stopped
		}
		<-served
		return nil
	}
}

// floorComponent runs the store's revision floor (etcdstore.Floor.Run),
// which keeps the floor file current; it stops the daemon when etcd's
// revision went back, whichever call noticed: the store refuses every call
// already, and a supervisor's restart meets the check at start
// (openStore).
func floorComponent(floor *etcdstore.Floor, serving *readiness, cfg Config, log *slog.Logger) component {
	return func(ctx context.Context) error {
		err := floor.Run(ctx, cfg.HealthInterval)
		if err == nil {
			return nil
		}
		serving.set(err, cfg.Store.RequestTimeout) // not ready, saying why, until drained
		err = fmt.Errorf("intentd: stopped serving: %w", err)
		log.Error("etcd's revision went back; stopping", "err", err)
		return err
	}
}

// serveMetrics serves /metrics, the HTTP health endpoints and the review
// console at addr (empty: off). Its failure is logged, not fatal: gRPC
// goes on serving.
func serveMetrics(m *metrics, addr string, serving *readiness, review http.Handler, log *slog.Logger) component {
	return func(ctx context.Context) error {
		if addr == "" {
			<-ctx.Done()
			return nil
		}
		if err := m.serve(ctx, addr, serving, review, log); err != nil {
			log.Error("metrics listener failed; serving gRPC without metrics and HTTP health", "addr", addr, "err", err)
			<-ctx.Done()
		}
		return nil
	}
}

// flushTraces exports the spans not sent yet, within timeout.
func flushTraces(tr *tracing.Tracing, timeout time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		log.Warn("spans not exported at shutdown", "err", err)
	}
}

// steer keeps cli's calls off the etcd members that do not answer: it asks
// every member once before intentd uses the cluster (so that a member
// stalled at start does not fail the first reads), then every
// EtcdProbeInterval in the background until stop is called.
func steer(ctx context.Context, cli *clientv3.Client, cfg Config, endpoints []string,
	dial func(...string) (*clientv3.Client, error), log *slog.Logger) (stop func(), err error) {
	s, err := etcdsteer.New(cli, etcdsteer.Config{
		Endpoints: endpoints, Interval: cfg.EtcdProbeInterval, Timeout: cfg.EtcdProbeTimeout,
		Dial: func(ep string) (*clientv3.Client, error) { return dial(ep) }, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("intentd: %w", err)
	}
	s.Steer(ctx)
	stopRun := goUntilStopped(ctx, s.Run)
	return func() {
		stopRun()
		s.Close()
	}, nil
}

// reload keeps the tokens file and the TLS files current: on change (polled)
// and at once on SIGHUP. Exits when ctx ends.
func reload(ctx context.Context, tokens *access.Source, serverCerts *certs, every time.Duration, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var wg sync.WaitGroup
	if tokens != nil {
		wg.Go(func() { tokens.Watch(ctx, every) })
	}
	if serverCerts != nil {
		wg.Go(func() { serverCerts.watch(ctx, every) })
	}
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		log.Info("SIGHUP: reloading tokens and TLS files")
		if tokens != nil {
			if err := tokens.Reload(); err != nil {
				log.Error("tokens file does not load; keeping the previous one", "err", err)
			}
		}
		if serverCerts != nil {
			if err := serverCerts.reload(); err != nil {
				log.Error("TLS files do not load; keeping the previous ones", "err", err)
			}
		}
	}
}

// newGRPCServer builds the server with logging, panic recovery, request
// decoding (bytes that are not a valid request become INVALID_ARGUMENT, not
// grpc-go's INTERNAL) and the guard (authentication, roles, tenants, rate
// limits), in that order; the handlers then validate their requests
// against the protovalidate rules of the proto. A panic becomes INTERNAL with a generic message: the stack
// goes to the log, never to the client. Services are to be registered
// through server.DecodedService.
//
// Without accessLog the log is what an operator reads: refused calls at the
// level their code calls for, successful ones at DEBUG, health checks and
// reflection (a grpcurl session makes dozens of calls) not at all. With it,
// every call is logged.
func newGRPCServer(log *slog.Logger, guard *server.Guard, m *metrics, activity *console.Activity, accessLog bool, opts ...grpc.ServerOption) *grpc.Server {
	decodeUnary, decodeStream := server.DecodeInterceptors()
	onPanic := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	calls := callLog{log: log, all: accessLog}
	unary := append([]grpc.UnaryServerInterceptor{
		m.grpc.UnaryServerInterceptor(),
		m.answers.unary(),
		calls.unary(),
		recovery.UnaryServerInterceptor(onPanic),
		decodeUnary,
	}, guard.Unary()...)
	// Last: the console's activity reads each request's tenant as the
	// guard settled it.
	unary = append(unary, activity.Unary())
	stream := append([]grpc.StreamServerInterceptor{
		m.grpc.StreamServerInterceptor(),
		calls.stream(),
		recovery.StreamServerInterceptor(onPanic),
		decodeStream,
	}, guard.Stream()...)
	opts = append(opts, server.RequestCodec(), grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...),
		grpc.NumStreamWorkers(streamWorkers))
	return grpc.NewServer(opts...)
}

// streamWorkers is how many goroutines the gRPC server keeps to run calls
// on. Without them grpc-go starts a goroutine per call, whose stack starts
// at 8 KiB and is grown by copying, several times over, as the call goes
// down the interceptor chain into validation (its regular expressions take
// deep frames): that copying was a large part of a replay's CPU (see
// docs/PERFORMANCE.md, "The hot spots"). A worker's stack stays grown. Calls beyond the busy workers still get a goroutine
// of their own, so this bounds nothing; it is sized for the 64 callers the
// benchmarks run, each idle worker costing its stack.
const streamWorkers = 64

// watchHealth decides readiness (gRPC health SERVING and /readyz 200) only
// while etcd answers a linearizable read, every interval until ctx ends.
// An etcd whose revision went back makes the probe fail like any other
// refusal, saying why; stopping the daemon then is the floor's
// (floorComponent).
func watchHealth(ctx context.Context, store *etcdstore.Store, ready *readiness, every, requestTimeout time.Duration, log *slog.Logger) {
	last := "unprobed"
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		err := store.Ping(ctx)
		if err != nil && ctx.Err() != nil {
			return
		}
		ready.set(err, requestTimeout)
		if reason := ready.state(); reason != last {
			if reason == "" {
				log.Info("health", "status", healthpb.HealthCheckResponse_SERVING.String())
			} else {
				log.Info("health", "status", healthpb.HealthCheckResponse_NOT_SERVING.String(), "reason", reason)
			}
			last = reason
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
