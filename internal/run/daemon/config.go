// Package daemon assembles intentd: configuration, the etcd connection
// (embedded or external), the store, the gRPC server with health and
// reflection, and an orderly shutdown. cmd/intentd parses flags into a
// Config and calls Run; tests call Run in-process.
package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/internal/run/netaddr"
	"github.com/intentd/intentd/internal/run/tracing"
)

// Config is intentd's configuration. Start from DefaultConfig.
type Config struct {
	// Listen is the gRPC listen address.
	Listen string
	// EtcdEndpoints, when set, use an external etcd cluster instead of the
	// embedded one.
	EtcdEndpoints []string
	// DataDir holds the revision floor file (etcdstore.FloorFileName), in both
	// modes, and with the embedded etcd also its data (DataDir/etcd).
	// External-etcd replicas on one machine should each have their own,
	// or share one knowingly: the file is merged, never lowered.
	DataDir string
	// EmbedClientURL, when set, is a loopback TCP listener of the
	// embedded etcd, opened only when intentd runs without credentials
	// (embedTCP); empty, the default, opens none: the embedded etcd always
	// serves EmbedSocket, which is all intentd and its tools need, and
	// etcd's well-known port 2379 is often taken by an etcd of the
	// machine's own. EmbedPeerURL is the URL its single member is
	// registered under; nothing listens there. Port 0 picks a free one.
	EmbedClientURL string
	EmbedPeerURL   string
	// EmbedQuotaBytes is the embedded etcd's backend quota: past it etcd
	// only reads and deletes, and writes fail STORE_FULL.
	EmbedQuotaBytes int64
	// EmbedCompaction is how much history the embedded etcd keeps.
	EmbedCompaction Compaction
	// Store configures the store: the etcd key prefix (--prefix), the
	// timeouts of etcd calls (--request-timeout, --operation-timeout),
	// retentions and the attempts limit. Run sets its Logger,
	// TracerProvider, ObserveTxn and ObserveBatch; Now (nil: the wall
	// clock) is left to whoever builds the config (a test main shifts it).
	Store etcdstore.Config
	// DialTimeout bounds connecting to etcd at start.
	DialTimeout time.Duration
	// HealthInterval is how often etcd is probed for the health service.
	HealthInterval time.Duration
	// EtcdKeepAliveTime and EtcdKeepAliveTimeout are gRPC keepalive toward
	// etcd: after EtcdKeepAliveTime without a byte from a member its
	// connection is pinged, and closed (failing the calls and streams on
	// it) if no answer comes within EtcdKeepAliveTimeout.
	EtcdKeepAliveTime, EtcdKeepAliveTimeout time.Duration
	// EtcdProbeInterval and EtcdProbeTimeout: with several endpoints,
	// every member is asked for its status each EtcdProbeInterval, and one
	// that does not answer within EtcdProbeTimeout (or knows no leader
	// while others do) gets no new calls until it answers again.
	EtcdProbeInterval, EtcdProbeTimeout time.Duration
	// ShutdownTimeout bounds the graceful stop before connections are cut.
	ShutdownTimeout time.Duration
	// JanitorInterval is how often the elected replica sweeps: lapsed
	// leases to UNKNOWN, expired final records to tombstones.
	JanitorInterval time.Duration
	// LogLevel is debug, info, warn or error; LogFormat is text or json.
	LogLevel  string
	LogFormat string
	// AccessLog logs every call, health checks and reflection included, at
	// INFO. Off, a call is logged only when it is refused (at the level its
	// code calls for); successful calls are DEBUG, and health checks and
	// reflection are not logged.
	AccessLog bool

	// TLSCert and TLSKey turn on TLS for the gRPC listener; TLSClientCA
	// verifies client certificates, which TLSClientAuth ("require" or
	// "optional") demands or merely accepts.
	TLSCert, TLSKey, TLSClientCA string
	TLSClientAuth                string
	// Insecure allows plaintext, and serving without authentication, on a
	// non-loopback address.
	Insecure bool
	// TokensFile lists the principals; empty turns authentication off
	// (every call is an anonymous admin: development on loopback only).
	TokensFile string
	// EtcdCACert, EtcdCert and EtcdKey configure TLS toward an external
	// etcd cluster.
	EtcdCACert, EtcdCert, EtcdKey string
	// RatePerPrincipal and RatePerTenant are requests per second (0:
	// unlimited), with bursts.
	RatePerPrincipal, RatePerTenant   float64
	BurstPerPrincipal, BurstPerTenant int
	// MetricsListen serves Prometheus metrics at /metrics; empty: off.
	MetricsListen string
	// PprofListen serves Go's profiles (net/http/pprof) at /debug/pprof/;
	// empty: off, the default. Loopback only: see servePprof.
	PprofListen string
	// ConsoleListen serves the review console alone, under /console/, so
	// that exposing it (behind a TLS-terminating proxy) exposes neither
	// /metrics nor the health endpoints; empty: the console is served on
	// MetricsListen.
	ConsoleListen string
	// Tracing exports spans over OTLP when Tracing.Endpoint is set
	// (--otlp-endpoint, --trace-sample-ratio); see package tracing.
	Tracing tracing.Config
	// MaxRecvMsgSize bounds a request's size in bytes.
	MaxRecvMsgSize int
	// ReloadInterval is how often the tokens and TLS files are checked for
	// changes (SIGHUP reloads at once).
	ReloadInterval time.Duration
	// ArchiveDSN, when set, names the PostgreSQL database final intents
	// move to after Store.ArchiveAfter (--archive-after): the archive
	// (issue 26; see archive.go). Empty: etcd keeps everything.
	ArchiveDSN string
}

// DefaultDataDir is where the embedded etcd keeps its data unless told
// otherwise: $XDG_DATA_HOME/intentd, else ~/.local/share/intentd.
func DefaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "intentd")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "intentd")
	}
	return "intentd-data"
}

// DefaultConfig returns the configuration `intentd` runs with when given no
// flags: embedded etcd, loopback only.
func DefaultConfig() Config {
	return Config{
		Listen:            "127.0.0.1:7650",
		DataDir:           DefaultDataDir(),
		Store:             etcdstore.DefaultConfig(),
		EmbedPeerURL:      "http://127.0.0.1:2380",
		EmbedQuotaBytes:   DefaultEmbedQuotaBytes,
		EmbedCompaction:   Compaction{Mode: "periodic", Retention: DefaultEmbedCompactionRetention},
		DialTimeout:       10 * time.Second,
		HealthInterval:    2 * time.Second,
		ShutdownTimeout:   10 * time.Second,
		JanitorInterval:   5 * time.Second,
		LogLevel:          "info",
		LogFormat:         "text",
		TLSClientAuth:     "require",
		RatePerPrincipal:  500,
		BurstPerPrincipal: 1000,
		RatePerTenant:     2000,
		BurstPerTenant:    4000,
		MaxRecvMsgSize:    2 << 20,
		ReloadInterval:    2 * time.Second,
		MetricsListen:     "127.0.0.1:7651",
		Tracing:           tracing.Config{SampleRatio: 1},

		// gRPC never pings more often than every 10s, and an etcd with
		// its default --grpc-keepalive-min-time (5s) closes connections
		// that do.
		EtcdKeepAliveTime:    10 * time.Second,
		EtcdKeepAliveTimeout: 3 * time.Second,
		EtcdProbeInterval:    500 * time.Millisecond,
		EtcdProbeTimeout:     500 * time.Millisecond,
	}
}

// TLS reports whether the gRPC listener serves TLS.
func (c Config) TLS() bool { return c.TLSCert != "" }

// ConsoleAddr is the address the review console is served on:
// ConsoleListen, else MetricsListen; empty when neither is set.
func (c Config) ConsoleAddr() string {
	if c.ConsoleListen != "" {
		return c.ConsoleListen
	}
	return c.MetricsListen
}

// Embedded reports whether intentd runs its own etcd.
func (c Config) Embedded() bool { return len(c.EtcdEndpoints) == 0 }

// checkListen checks a listen address: host:port, the port a number up to
// 65535 or a service name, so that a port out of range is a bad flag at
// start rather than a failure once the embedded etcd is up.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("port %q: want 0 to 65535 or a service name", port)
	}
	return nil
}

// sameListen reports whether two listen addresses are the one address
// (port 0, a port the system picks, is never the same).
func sameListen(a, b string) bool {
	_, port, _ := net.SplitHostPort(a)
	return a == b && port != "0"
}

// Validate checks every field and how fields relate; messages name the
// flag.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	listenErr := checkListen(c.Listen)
	if listenErr != nil {
		bad("--listen %q: %v", c.Listen, listenErr)
	}
	if c.DataDir == "" {
		bad("--data-dir: required: it holds the revision floor, and the embedded etcd's data")
	}
	if c.Embedded() {
		errs = append(errs, c.validateEmbedded()...)
	}
	for _, e := range c.EtcdEndpoints {
		if strings.TrimSpace(e) == "" {
			bad("--etcd-endpoints: empty endpoint in %q", strings.Join(c.EtcdEndpoints, ","))
		}
	}
	// The store validates its own fields; storeFlag renames them to the
	// flags that set them.
	var storeErrs etcdstore.ConfigError
	if err := c.Store.Validate(); errors.As(err, &storeErrs) {
		for _, fe := range storeErrs {
			bad("%s", fe.Describe(storeFlag))
		}
	} else if err != nil {
		errs = append(errs, err)
	}
	for flag, d := range map[string]time.Duration{
		"--dial-timeout": c.DialTimeout, "--health-interval": c.HealthInterval,
		"--shutdown-timeout": c.ShutdownTimeout, "--janitor-interval": c.JanitorInterval,
		"--etcd-keepalive-timeout": c.EtcdKeepAliveTimeout, "--etcd-probe-interval": c.EtcdProbeInterval,
		"--etcd-probe-timeout": c.EtcdProbeTimeout,
	} {
		if d <= 0 {
			bad("%s %v: must be positive", flag, d)
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("--tls-cert and --tls-key: give both or neither")
	}
	if c.TLSClientCA != "" && !c.TLS() {
		bad("--tls-client-ca %q: needs --tls-cert and --tls-key", c.TLSClientCA)
	}
	if c.TLSClientAuth != "require" && c.TLSClientAuth != "optional" {
		bad("--tls-client-auth %q: want require or optional", c.TLSClientAuth)
	}
	// One line per bad --listen: an address that does not parse was said
	// above, and off loopback what is missing is said together.
	if listenErr == nil && !c.Insecure && !netaddr.Loopback(c.Listen) {
		switch {
		case !c.TLS() && c.TokensFile == "":
			bad("--listen %s: off loopback intentd needs TLS and callers it knows; give --tls-cert, --tls-key and --tokens-file, or --insecure to serve plaintext without authentication anyway", c.Listen)
		case !c.TLS():
			bad("--listen %s: without TLS intentd serves loopback only; give --tls-cert and --tls-key, or --insecure to serve plaintext anyway", c.Listen)
		case c.TokensFile == "":
			bad("--listen %s: without --tokens-file every caller is an anonymous admin, which intentd allows on loopback only; give --tokens-file, or --insecure to serve without authentication anyway", c.Listen)
		}
	}
	if (c.EtcdCert == "") != (c.EtcdKey == "") {
		bad("--etcd-cert and --etcd-key: give both or neither")
	}
	for _, r := range []struct {
		flag  string
		value float64
	}{
		{"--rate-per-principal", c.RatePerPrincipal}, {"--rate-per-tenant", c.RatePerTenant},
		{"--burst-per-principal", float64(c.BurstPerPrincipal)}, {"--burst-per-tenant", float64(c.BurstPerTenant)},
	} {
		if r.value < 0 {
			bad("%s %v: must not be negative", r.flag, r.value)
		}
	}
	if c.MaxRecvMsgSize < 64<<10 || c.MaxRecvMsgSize > 16<<20 {
		bad("--max-recv-msg-size %d: want 64 KiB to 16 MiB", c.MaxRecvMsgSize)
	}
	if c.MetricsListen != "" {
		if err := checkListen(c.MetricsListen); err != nil {
			bad("--metrics-listen %q: %v", c.MetricsListen, err)
		} else if sameListen(c.MetricsListen, c.Listen) {
			bad("--metrics-listen %s: the address of --listen; give each its own", c.MetricsListen)
		}
	}
	if c.ConsoleListen != "" {
		if err := checkListen(c.ConsoleListen); err != nil {
			bad("--console-listen %q: %v", c.ConsoleListen, err)
		} else if sameListen(c.ConsoleListen, c.MetricsListen) {
			bad("--console-listen %s: the address of --metrics-listen; leave --console-listen empty to serve the console there", c.ConsoleListen)
		} else if sameListen(c.ConsoleListen, c.Listen) {
			bad("--console-listen %s: the address of --listen; give each its own", c.ConsoleListen)
		}
	}
	if c.PprofListen != "" && !netaddr.Loopback(c.PprofListen) {
		bad("--pprof-listen %q: want a loopback host:port (127.0.0.1, [::1] or localhost): profiles show the process's code paths and stacks, and serve without authentication", c.PprofListen)
	}
	if c.Tracing.Endpoint != "" {
		if err := tracing.ParseEndpoint(c.Tracing.Endpoint); err != nil {
			bad("--otlp-endpoint %q: %v", c.Tracing.Endpoint, err)
		}
	}
	if !(c.Tracing.SampleRatio >= 0 && c.Tracing.SampleRatio <= 1) { // NaN too
		bad("--trace-sample-ratio %v: want 0 to 1", c.Tracing.SampleRatio)
	}
	if c.ArchiveDSN != "" {
		if err := checkArchiveDSN(c.ArchiveDSN); err != nil {
			bad("--archive-dsn: %v", err)
		}
	}
	if c.Store.ArchiveAfter <= 0 {
		bad("--archive-after %v: must be positive", c.Store.ArchiveAfter)
	}
	if c.ReloadInterval <= 0 {
		bad("--reload-interval %v: must be positive", c.ReloadInterval)
	}
	if c.EtcdKeepAliveTime < minKeepAliveTime {
		bad("--etcd-keepalive-time %v: must be at least %v (gRPC pings no more often, and etcd's default --grpc-keepalive-min-time of 5s refuses faster pings)", c.EtcdKeepAliveTime, minKeepAliveTime)
	}
	if len(c.EtcdEndpoints) > 1 && c.EtcdProbeTimeout >= c.Store.RequestTimeout {
		bad("--etcd-probe-timeout %v: must be below --request-timeout %v, or calls on a stalled etcd member time out before it is found", c.EtcdProbeTimeout, c.Store.RequestTimeout)
	}
	if _, err := c.level(); err != nil {
		bad("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("--log-format %q: want text or json", c.LogFormat)
	}
	return errors.Join(errs...)
}

// storeFlags names the flag that sets each etcdstore.Config field, so that
// the store's own validation, which names fields, reaches the operator
// naming flags.
var storeFlags = map[string]string{
	"Prefix":             "--prefix",
	"RequestTimeout":     "--request-timeout",
	"OperationTimeout":   "--operation-timeout",
	"DefaultRetention":   "--retention",
	"MaxRetention":       "--max-retention",
	"TombstoneRetention": "--tombstone-retention",
	"MaxAttempts":        "--max-attempts",
	"CacheBytes":         "--cache-bytes",
	"ArchiveAfter":       "--archive-after",
}

// storeFlag is the flag of a store field, or "store " and the field's name
// for one no flag sets (the daemon itself does).
func storeFlag(field string) string {
	if f, ok := storeFlags[field]; ok {
		return f
	}
	return "store " + field
}

// minKeepAliveTime is gRPC's floor for the keepalive ping interval: a
// shorter one is raised to it.
const minKeepAliveTime = 10 * time.Second

func (c Config) level() (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(c.LogLevel))
	return l, err
}

// Logger builds the slog logger the config asks for.
func (c Config) Logger() *slog.Logger {
	l, _ := c.level()
	opts := &slog.HandlerOptions{Level: l}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
