// Package intentdcmd is the intentd command: its flags, their environment
// variables and config file, their validation, its exit statuses, and the
// daemon run with what they settled on (the behaviour cmd/intentd's package
// doc describes). cmd/intentd is Main; a main built only for tests (e2e's
// fault-clock intentd) runs the same command, flags and all, and changes
// the settled config through Configure.
package intentdcmd

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/intentd/intentd/internal/run/cliflag"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/run/heapfloor"
	"github.com/intentd/intentd/internal/run/version"
)

// Exit statuses.
const (
	exitFailure = 1
	exitUsage   = 2
)

// Configure changes the config intentd settled on (defaults, config file,
// environment, flags; validated) before the daemon runs with it.
type Configure func(cfg *daemon.Config) error

// Main runs the intentd command with args (without the program name) and
// returns its exit status; cmd/intentd is this and nothing else. Every
// error is printed here, once, on stderr: cobra finds bad flags before RunE
// runs, so printing only in RunE would exit silently on them. configure,
// if not nil, runs just before the daemon starts: a main built for tests
// injects what intentd must never be able to do by itself (a test main in
// e2e shifts its clock through cfg.Store.Now); cmd/intentd passes nil.
func Main(args []string, stderr io.Writer, configure Configure) int {
	cmd := newCommand(stderr, configure)
	cmd.SetArgs(args)
	cmd.SetOut(os.Stdout)
	cmd.SetErr(stderr)
	ran, err := cmd.ExecuteC()
	if err == nil {
		return 0
	}
	// Errors from the daemon name intentd already. Several at once (two bad
	// flags) are one line each, each saying whose it is.
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintln(stderr, "intentd: "+strings.TrimPrefix(line, "intentd: "))
	}
	// A --archive-dsn intentd cannot start with is a bad setting too,
	// found only once PostgreSQL is asked: exit 2, the line said.
	if _, ok := errors.AsType[*daemon.ArchiveDSNError](err); ok {
		return exitUsage
	}
	var u *usageError
	if errors.As(err, &u) {
		path := "intentd"
		if ran != nil {
			path = ran.CommandPath()
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", path)
		return exitUsage
	}
	return exitFailure
}

// usageError is an error in how intentd was called: a flag, environment
// variable or argument. Nothing was started; it exits 2.
type usageError struct{ err error }

func (u *usageError) Error() string { return u.err.Error() }
func (u *usageError) Unwrap() error { return u.err }

// envName is the environment variable of a flag: --etcd-endpoints is
// INTENTD_ETCD_ENDPOINTS.
func envName(flag string) string {
	return "INTENTD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func newCommand(stderr io.Writer, configure Configure) *cobra.Command {
	cfg := daemon.DefaultConfig()
	// The heap floor is the process's, not the daemon's: Run is also
	// called in-process by tests, several at once.
	heapFloor := int64(heapfloor.Default)
	cmd := &cobra.Command{
		Use:     "intentd",
		Version: version.String(),
		Short:   "Durable, fenced records of approved business intents, on etcd",
		Long: `intentd serves the intent.v1.IntentService API: the durable, fenced record
of approved business intents, on an embedded or external etcd.

Every flag can also be set by the environment variable named after it
(--etcd-endpoints is INTENTD_ETCD_ENDPOINTS), or by the key of its name in
the YAML file of --config (etcd-endpoints: [https://etcd-0:2379]). A flag on
the command line wins over the environment, which wins over the file, which
wins over the default; an unknown key in the file is an error.

Exit status: 0 after a clean stop, 1 when intentd fails while starting or
serving, 2 for a bad flag, environment variable, config file key or
argument (also a --archive-dsn PostgreSQL refuses or that does not answer
at start).`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{err: fmt.Errorf("unexpected argument %q: intentd takes flags only", args[0])}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := settle(cmd.Flags()); err != nil {
				return &usageError{err: err}
			}
			if err := cfg.Validate(); err != nil {
				return &usageError{err: err}
			}
			if heapFloor < 0 {
				return &usageError{err: fmt.Errorf("--gc-heap-floor %d: want 0 (off) or a number of bytes", heapFloor)}
			}
			if configure != nil {
				if err := configure(&cfg); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			log := cfg.Logger()
			if heapFloor > 0 && heapfloor.Chosen() {
				log.Info("GOGC is set in the environment: it governs the collector, --gc-heap-floor does not", "gogc", os.Getenv("GOGC"))
			}
			floorHeld := make(chan struct{})
			go func() { defer close(floorHeld); heapfloor.Hold(ctx, uint64(heapFloor)) }()
			defer func() { stop(); <-floorHeld }() // the floor is let go once intentd has stopped
			var ready func(addr string)
			if cfg.LogFormat == "text" {
				ready = func(addr string) { fmt.Fprint(stderr, nextSteps(addr, cfg)) }
			}
			return daemon.Run(ctx, cfg, log, ready)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: cliflag.Explain(err)} })
	cmd.SetVersionTemplate("intentd {{.Version}}\n")
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.AddCommand(newGatewayCommand(stderr))
	cmd.AddCommand(newMCPGuardCommand(stderr))
	f := cmd.Flags()
	f.String(configFlag, "", "YAML file of flag settings, keys named as the flags (the command line and the environment win over it)")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen address")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "external etcd endpoints (comma-separated); empty runs an embedded etcd")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory: the revision floor file (also with --etcd-endpoints; one per replica) and the embedded etcd's data")
	f.StringVar(&cfg.EmbedClientURL, "embed-client-url", cfg.EmbedClientURL, "loopback TCP client URL of the embedded etcd (http://127.0.0.1:2379), opened only when given and only without --tls-cert and --tokens-file; empty: the unix socket <data-dir>/etcd.sock only, which it always serves")
	f.StringVar(&cfg.EmbedPeerURL, "embed-peer-url", cfg.EmbedPeerURL, "peer URL the embedded etcd's single member is registered under (nothing listens there)")
	f.Int64Var(&cfg.EmbedQuotaBytes, "embed-quota-bytes", cfg.EmbedQuotaBytes, "backend quota of the embedded etcd (1 MiB to 8 GiB); past it writes fail STORE_FULL")
	f.StringVar(&cfg.EmbedCompaction.Mode, "embed-compaction-mode", cfg.EmbedCompaction.Mode, "how the embedded etcd compacts its history: periodic or revision")
	f.StringVar(&cfg.EmbedCompaction.Retention, "embed-compaction-retention", cfg.EmbedCompaction.Retention, "history the embedded etcd keeps: a duration (periodic, at least 100ms) or a number of revisions (revision); Watch and List resume within it")
	f.StringVar(&cfg.Store.Prefix, "prefix", cfg.Store.Prefix, "etcd key prefix of this installation")
	f.DurationVar(&cfg.DialTimeout, "dial-timeout", cfg.DialTimeout, "time allowed to reach etcd at start")
	f.DurationVar(&cfg.Store.RequestTimeout, "request-timeout", cfg.Store.RequestTimeout, "deadline of each etcd call")
	f.DurationVar(&cfg.Store.OperationTimeout, "operation-timeout", cfg.Store.OperationTimeout, "deadline of one store operation with its retries")
	f.DurationVar(&cfg.HealthInterval, "health-interval", cfg.HealthInterval, "how often etcd is probed for the health service")
	f.DurationVar(&cfg.EtcdKeepAliveTime, "etcd-keepalive-time", cfg.EtcdKeepAliveTime, "ping an etcd connection silent this long (at least 10s)")
	f.DurationVar(&cfg.EtcdKeepAliveTimeout, "etcd-keepalive-timeout", cfg.EtcdKeepAliveTimeout, "close an etcd connection whose ping is not answered within this")
	f.DurationVar(&cfg.EtcdProbeInterval, "etcd-probe-interval", cfg.EtcdProbeInterval, "with several etcd endpoints: how often each member is asked for its status")
	f.DurationVar(&cfg.EtcdProbeTimeout, "etcd-probe-timeout", cfg.EtcdProbeTimeout, "a member that does not answer within this gets no new calls until it does (below --request-timeout)")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "time in-flight calls get to finish on SIGTERM")
	f.DurationVar(&cfg.JanitorInterval, "janitor-interval", cfg.JanitorInterval, "how often the elected replica sweeps lapsed leases and expired records")
	f.DurationVar(&cfg.Store.DefaultRetention, "retention", cfg.Store.DefaultRetention, "how long a final record is kept unless its registration says otherwise")
	f.DurationVar(&cfg.Store.MaxRetention, "max-retention", cfg.Store.MaxRetention, "the longest retention a registration may ask for")
	f.DurationVar(&cfg.Store.TombstoneRetention, "tombstone-retention", cfg.Store.TombstoneRetention, "how long the tombstone of a removed record is kept")
	f.IntVar(&cfg.Store.MaxAttempts, "max-attempts", cfg.Store.MaxAttempts, "attempts of an intent that may end without a report (lease lapsed, MarkUnknown) before it goes to NEEDS_REVIEW, unless its registration sets max_attempts (1-1000)")
	f.Int64Var(&cfg.Store.CacheBytes, "cache-bytes", cfg.Store.CacheBytes, "memory for remembered records (final ones replay without etcd) and sessions, in bytes of heap (at least 1 MiB)")
	f.Int64Var(&heapFloor, "gc-heap-floor", heapFloor, "smallest heap, in bytes, Go's collector lets intentd grow to before it collects (0: GOGC alone); a fixed amount of memory under load that spares a small heap frequent collections; GOGC set in the environment wins, GOMEMLIMIT still caps")
	f.StringVar(&cfg.ArchiveDSN, "archive-dsn", "", "PostgreSQL database that final intents move to after --archive-after (postgres://user:password@host:5432/db?sslmode=verify-full, or key=value pairs; TLS and credentials are the DSN's); empty: etcd keeps every record. Prefer the environment variable or the config file to the command line, which other users of the machine can read")
	f.DurationVar(&cfg.Store.ArchiveAfter, "archive-after", cfg.Store.ArchiveAfter, "with --archive-dsn: how long a final intent stays in etcd before it moves to the archive")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate of the gRPC listener (turns TLS on; reloaded on change or SIGHUP)")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "PEM CA that client certificates must chain to (mutual TLS)")
	f.StringVar(&cfg.TLSClientAuth, "tls-client-auth", cfg.TLSClientAuth, "with --tls-client-ca: require a client certificate, or accept one (optional)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "allow plaintext gRPC, or no --tokens-file, on a non-loopback address")
	f.StringVar(&cfg.TokensFile, "tokens-file", "", "JSON file of principals (hashed bearer tokens, certificate names, tenants, roles); empty turns authentication off")
	f.StringVar(&cfg.EtcdCACert, "etcd-cacert", "", "PEM CA of an external etcd cluster")
	f.StringVar(&cfg.EtcdCert, "etcd-cert", "", "PEM client certificate toward etcd")
	f.StringVar(&cfg.EtcdKey, "etcd-key", "", "PEM private key of --etcd-cert")
	f.Float64Var(&cfg.RatePerPrincipal, "rate-per-principal", cfg.RatePerPrincipal, "requests per second per principal (0: unlimited)")
	f.IntVar(&cfg.BurstPerPrincipal, "burst-per-principal", cfg.BurstPerPrincipal, "burst per principal")
	f.Float64Var(&cfg.RatePerTenant, "rate-per-tenant", cfg.RatePerTenant, "requests per second per tenant (0: unlimited)")
	f.IntVar(&cfg.BurstPerTenant, "burst-per-tenant", cfg.BurstPerTenant, "burst per tenant")
	f.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "address of the HTTP listener for Prometheus /metrics, /healthz, /readyz and, without --console-listen, the review console (empty: off)")
	f.StringVar(&cfg.PprofListen, "pprof-listen", "", "loopback address that serves Go's profiles at /debug/pprof/ (empty: off)")
	f.StringVar(&cfg.ConsoleListen, "console-listen", "", "address that serves the review console alone, at /console/, without /metrics and the health endpoints (empty: the console is served on --metrics-listen)")
	f.StringVar(&cfg.Tracing.Endpoint, "otlp-endpoint", "", "OTLP/gRPC collector URL that receives traces (http://host:4317 plaintext, https:// TLS); unset: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then $OTEL_EXPORTER_OTLP_ENDPOINT; empty: no tracing")
	f.Float64Var(&cfg.Tracing.SampleRatio, "trace-sample-ratio", cfg.Tracing.SampleRatio, "share of the traces intentd starts that are recorded (0-1); a caller's sampled trace context is always followed")
	f.IntVar(&cfg.MaxRecvMsgSize, "max-recv-msg-size", cfg.MaxRecvMsgSize, "largest request accepted, in bytes")
	f.DurationVar(&cfg.ReloadInterval, "reload-interval", cfg.ReloadInterval, "how often the tokens and TLS files are checked for changes")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
	f.BoolVar(&cfg.AccessLog, "access-log", false, "log every call at INFO, health checks and reflection included (off: refused calls only)")
	f.VisitAll(func(fl *pflag.Flag) { fl.Usage += " (env " + envName(fl.Name) + ")" })
	return cmd
}

// nextSteps is what a person who just started intentd by hand reads once it
// serves: where, and what to try. Only with text logs: a JSON log stays
// JSON for the machines that read it.
func nextSteps(addr string, cfg daemon.Config) string {
	exe, _ := os.Executable()
	cwd, _ := os.Getwd()
	return steps(addr, cfg, intentctlCommand(exe, cwd, exec.LookPath), exe != "" && underGoRun(exe))
}

// steps is nextSteps with what it finds out about the machine given: ctl,
// the command that runs intentctl here, and goRun, whether intentd runs
// from `go run`. Every command it shows works as shown against this
// intentd, except for what only the reader has (a token, a CA's file when
// intentd cannot tell where it is), shown as $TOKEN or <...>.
func steps(addr string, cfg daemon.Config, ctl string, goRun bool) string {
	var cert *x509.Certificate
	if cfg.TLS() {
		cert = leafCert(cfg.TLSCert)
	}
	dial := dialAddr(addr, cert)
	var s string
	if !cfg.TLS() && cfg.TokensFile == "" {
		s = fmt.Sprintf("intentd: serving on %s. Try the grpcurl tour in README.md, or `%s --addr %s review-queue`.", addr, ctl, dial)
	} else {
		// The README's tour is plaintext and anonymous: it would fail here.
		var ctlFlags, curlFlags, what []string
		if cfg.TLS() {
			what = append(what, "TLS")
			ca := "<CA of --tls-cert>"
			if p := filepath.Join(filepath.Dir(cfg.TLSCert), "ca.pem"); fileExists(p) {
				ca = p // where `intentctl dev-certs` puts its CA
			}
			ctlFlags = append(ctlFlags, "--cacert "+ca)
			curlFlags = append(curlFlags, "-cacert "+ca)
			if cfg.TLSClientCA != "" && cfg.TLSClientAuth == "require" {
				ctlFlags = append(ctlFlags, "--cert <client.pem> --key <client-key.pem>")
				curlFlags = append(curlFlags, "-cert <client.pem> -key <client-key.pem>")
			}
		} else {
			curlFlags = append(curlFlags, "-plaintext")
		}
		token := ""
		if cfg.TokensFile != "" {
			what = append(what, "a tokens file")
			ctlFlags = append(ctlFlags, `--token "$TOKEN"`)
			curlFlags = append(curlFlags, `-H "authorization: Bearer $TOKEN"`)
			token = " $TOKEN: the bearer token of a reviewer or reader of the tokens file (or INTENTCTL_TOKEN for intentctl)."
		}
		s = fmt.Sprintf("intentd: serving on %s with %s. Try `%s --addr %s %s review-queue`, or `grpcurl %s -d '{}' %s intent.v1.IntentService/List`.%s docs/SECURITY.md (\"Running securely\") shows more.",
			addr, strings.Join(what, " and "), ctl, dial, strings.Join(ctlFlags, " "), strings.Join(curlFlags, " "), dial, token)
	}
	if host, port, err := net.SplitHostPort(cfg.ConsoleAddr()); err == nil && port != "0" {
		s += fmt.Sprintf(" Review console: http://%s/console/", dialAddr(net.JoinHostPort(host, port), nil))
	}
	s += "\n"
	if goRun {
		s += "intentd: started by `go run`, which does not pass SIGTERM on; beyond a first try, `go build -o bin/ ./cmd/intentd ./cmd/intentctl` and run ./bin/intentd.\n"
	}
	return s
}

// dialAddr is the address a client on this machine dials to reach a
// listener on addr: an unspecified host (0.0.0.0, ::, none) becomes the
// loopback address of its family, which every certificate intentctl
// dev-certs makes is valid for. With cert, the first host the certificate
// is valid for among that loopback address, the other family's and
// localhost (else its first DNS name), so that the TLS check passes.
func dialAddr(addr string, cert *x509.Certificate) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	candidates := []string{host}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if ip != nil && ip.To4() == nil {
			candidates = []string{"::1", "127.0.0.1", "localhost"}
		} else {
			candidates = []string{"127.0.0.1", "::1", "localhost"}
		}
	}
	pick := candidates[0]
	if cert != nil {
		found := false
		for _, h := range candidates {
			if cert.VerifyHostname(h) == nil {
				pick, found = h, true
				break
			}
		}
		if !found && len(cert.DNSNames) > 0 {
			pick = cert.DNSNames[0]
		}
	}
	return net.JoinHostPort(pick, port)
}

// leafCert is the first certificate of the PEM file path, or nil.
func leafCert(path string) *x509.Certificate {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil
		}
		if blk.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil
			}
			return c
		}
	}
}

// intentctlCommand is how to run intentctl here: the binary built beside
// intentd's (./bin/intentctl when both were built into ./bin), else `go
// run ./cmd/intentctl` when intentd itself runs from `go run` (so from a
// checkout), else intentctl on the PATH, else `go run ./cmd/intentctl`,
// which works from a checkout.
func intentctlCommand(exe, cwd string, lookPath func(string) (string, error)) string {
	const fromCheckout = "go run ./cmd/intentctl"
	if exe == "" || underGoRun(exe) {
		return fromCheckout
	}
	if sib := filepath.Join(filepath.Dir(exe), "intentctl"); fileExists(sib) {
		if rel, err := filepath.Rel(cwd, sib); err == nil && cwd != "" && !strings.HasPrefix(rel, "..") {
			return "./" + filepath.ToSlash(rel)
		}
		return sib
	}
	if _, err := lookPath("intentctl"); err == nil {
		return "intentctl"
	}
	return fromCheckout
}

func fileExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir()
}

// underGoRun reports whether exe, the running binary, is one `go run` built:
// it lives in a go-build directory under the build cache's temporary root.
func underGoRun(exe string) bool {
	return strings.Contains(filepath.ToSlash(exe), "/go-build")
}

// fromEnv sets every flag not given on the command line from its INTENTD_*
// variable. --help and --version are requests, not settings: an
// INTENTD_VERSION an image sets for its own bookkeeping is no flag value.
func fromEnv(fs *pflag.FlagSet) error { return fromEnvNamed(fs, envName) }

// fromEnvNamed is fromEnv with the variables named by envName.
func fromEnvNamed(fs *pflag.FlagSet, envName func(string) string) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Name == "version" {
			return
		}
		name := envName(f.Name)
		v, ok := os.LookupEnv(name)
		if !ok || f.Changed || err != nil {
			return
		}
		if fs.Set(f.Name, v) != nil {
			err = cliflag.BadValue(fmt.Sprintf("%s (--%s)", name, f.Name), v, f)
		}
	})
	return err
}
