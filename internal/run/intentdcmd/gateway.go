package intentdcmd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/gateway"
	"github.com/intentd/intentd/internal/run/cliflag"
	"github.com/intentd/intentd/internal/run/netaddr"
	"github.com/intentd/intentd/internal/run/tracing"
)

// GatewayOptions are `intentd gateway`'s settings: its flags, and the
// upstreams of its config file (docs/GATEWAY.md).
type GatewayOptions struct {
	Listen          string
	TLSCert         string
	TLSKey          string
	Insecure        bool
	Intentd         string
	IntentdCA       string
	IntentdName     string
	RecordGrace     time.Duration
	CallTimeout     time.Duration
	ShutdownTimeout time.Duration
	LogLevel        string
	LogFormat       string
	Tracing         tracing.Config
	Upstreams       map[string]*gateway.Upstream
}

// gatewayEnvName is the environment variable of a gateway flag: --listen
// is INTENTD_GATEWAY_LISTEN.
func gatewayEnvName(flag string) string {
	return "INTENTD_GATEWAY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func newGatewayCommand(stderr io.Writer) *cobra.Command {
	o := GatewayOptions{
		Listen: "127.0.0.1:7660", Intentd: "127.0.0.1:7650", RecordGrace: gateway.DefaultRecordGrace, CallTimeout: gateway.DefaultCallTimeout,
		ShutdownTimeout: 30 * time.Second, LogLevel: "info", LogFormat: "text", Tracing: tracing.Config{SampleRatio: 1, ServiceName: "intentd-gateway"},
	}
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the fencing gateway: workers' side-effecting HTTP calls, checked against intentd",
		Long: `intentd gateway serves the fencing gateway (docs/GATEWAY.md): workers send
their side-effecting HTTP calls to /u/<upstream>/<path> with the headers
Intentd-Key, Intentd-Operation, Intentd-Fencing-Token (and Intentd-Tenant),
and their intentd credentials (Authorization: Bearer <token>). The gateway
asks intentd, with those credentials, whether the token is the intent's
current lease and records that the submission starts, in one etcd
transaction; it calls the configured upstream only then, records the
answer before it answers, replays it to every retry, refuses stale tokens,
and never sends a call whose answer was lost again.

The upstreams are the "upstreams" key of the YAML file of --config (the
only places the gateway sends anything to); its other keys are the flags'
names. Every flag can also be set by the environment variable named after
it (--listen is INTENTD_GATEWAY_LISTEN). A flag on the command line wins
over the environment, which wins over the file, which wins over the
default; an unknown key in the file is an error naming it.

Exit status: 0 after a clean stop, 1 when the gateway fails while starting
or serving, 2 for a bad flag, environment variable or config file key.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{err: fmt.Errorf("unexpected argument %q: intentd gateway takes flags only", args[0])}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := settleGateway(cmd.Flags(), &o); err != nil {
				return &usageError{err: err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return RunGateway(ctx, o, gatewayLogger(o, stderr), nil)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: cliflag.Explain(err)} })
	f := cmd.Flags()
	f.String(configFlag, "", "YAML file: the upstreams (key upstreams, see docs/GATEWAY.md) and flag settings, keys named as the flags")
	f.StringVar(&o.Listen, "listen", o.Listen, "HTTP listen address of the gateway (workers' calls, /healthz, /readyz, /metrics)")
	f.StringVar(&o.TLSCert, "tls-cert", "", "PEM certificate of the listener (turns HTTPS on)")
	f.StringVar(&o.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	f.BoolVar(&o.Insecure, "insecure", false, "allow plaintext HTTP on a non-loopback address (workers' intentd tokens cross it)")
	f.StringVar(&o.Intentd, "intentd", o.Intentd, "intentd's gRPC address")
	f.StringVar(&o.IntentdCA, "intentd-ca", "", "PEM CA of intentd's TLS certificate (turns TLS toward intentd on)")
	f.StringVar(&o.IntentdName, "intentd-server-name", "", "the name intentd's certificate is checked against (default: the host of --intentd)")
	f.DurationVar(&o.RecordGrace, "record-grace", o.RecordGrace, "how long past an upstream's timeout the gateway may take to record its answer; a submission not recorded by then reads unknown")
	f.DurationVar(&o.CallTimeout, "call-timeout", o.CallTimeout, "deadline of each call to intentd, with its retries")
	f.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "time in-flight calls get to finish (and record) on SIGTERM")
	f.StringVar(&o.Tracing.Endpoint, "otlp-endpoint", "", "OTLP/gRPC collector URL that receives traces (http://host:4317); empty: no tracing")
	f.Float64Var(&o.Tracing.SampleRatio, "trace-sample-ratio", o.Tracing.SampleRatio, "share of the traces the gateway starts that are recorded (0-1)")
	f.StringVar(&o.LogLevel, "log-level", o.LogLevel, "debug, info, warn or error")
	f.StringVar(&o.LogFormat, "log-format", o.LogFormat, "text or json")
	f.VisitAll(func(fl *pflag.Flag) { fl.Usage += " (env " + gatewayEnvName(fl.Name) + ")" })
	return cmd
}

// settleGateway sets the flags the command line left unset from the
// environment, then from the config file, reads its upstreams, and checks
// the whole: every error names the flag, variable or key.
func settleGateway(fs *pflag.FlagSet, o *GatewayOptions) error {
	if err := fromEnvNamed(fs, gatewayEnvName); err != nil {
		return err
	}
	path := fs.Lookup(configFlag).Value.String()
	if path == "" {
		return fmt.Errorf("--%s is required: its upstreams key names the upstreams the gateway may call (docs/GATEWAY.md)", configFlag)
	}
	err := fromFileWith(fs, path, "the gateway's flag names, e.g. listen, and upstreams", map[string]func(json.RawMessage) error{
		"upstreams": func(raw json.RawMessage) error {
			ups, err := gateway.ParseUpstreams(raw)
			o.Upstreams = ups
			return err
		},
	})
	if err != nil {
		return err
	}
	if o.Upstreams == nil {
		return fmt.Errorf("--%s %s: key \"upstreams\" is missing: it names the upstreams the gateway may call", configFlag, path)
	}
	return o.validate()
}

func (o *GatewayOptions) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: %v", o.Listen, err))
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if o.TLSCert == "" && !o.Insecure && !netaddr.Loopback(o.Listen) {
		errs = append(errs, fmt.Errorf("--listen %s is not a loopback address: serve HTTPS (--tls-cert, --tls-key), or pass --insecure, since workers' intentd tokens cross it", o.Listen))
	}
	if _, _, err := net.SplitHostPort(o.Intentd); err != nil {
		errs = append(errs, fmt.Errorf("--intentd %q: want host:port: %v", o.Intentd, err))
	}
	if o.RecordGrace <= 0 {
		errs = append(errs, fmt.Errorf("--record-grace %v: must be positive", o.RecordGrace))
	}
	if o.CallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--call-timeout %v: must be positive", o.CallTimeout))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %v: must be positive", o.ShutdownTimeout))
	}
	if _, err := parseLevel(o.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", o.LogLevel))
	}
	if o.LogFormat != "text" && o.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: want text or json", o.LogFormat))
	}
	if o.Tracing.Endpoint != "" {
		if err := tracing.ParseEndpoint(o.Tracing.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("--otlp-endpoint %q: %v", o.Tracing.Endpoint, err))
		}
	}
	if r := o.Tracing.SampleRatio; r < 0 || r > 1 {
		errs = append(errs, fmt.Errorf("--trace-sample-ratio %v: want 0 to 1", r))
	}
	cfg := o.config(nil, nil)
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// config is the gateway's Config of o.
func (o *GatewayOptions) config(log *slog.Logger, reg *prometheus.Registry) gateway.Config {
	return gateway.Config{Upstreams: o.Upstreams, RecordGrace: o.RecordGrace, CallTimeout: o.CallTimeout, Logger: log, Registry: reg}
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

func gatewayLogger(o GatewayOptions, w io.Writer) *slog.Logger {
	l, _ := parseLevel(o.LogLevel)
	opts := &slog.HandlerOptions{Level: l}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// RunGateway serves the gateway o describes (settled and validated) until
// ctx ends, then lets in-flight calls finish and record within
// o.ShutdownTimeout. ready, if not nil, is told the address once it
// serves.
func RunGateway(ctx context.Context, o GatewayOptions, log *slog.Logger, ready func(addr string)) error {
	tr, err := tracing.Start(ctx, o.Tracing)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tr.Shutdown(sctx)
	}()
	creds := insecure.NewCredentials()
	if o.IntentdCA != "" {
		pem, err := os.ReadFile(o.IntentdCA)
		if err != nil {
			return fmt.Errorf("--intentd-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--intentd-ca %s: no PEM certificate in it", o.IntentdCA)
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: o.IntentdName, MinVersion: tls.VersionTLS12})
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if tr.Enabled() {
		opts = append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tr.Provider()),
			otelgrpc.WithPropagators(propagation.TraceContext{}), otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()))))
	}
	conn, err := grpc.NewClient(o.Intentd, opts...)
	if err != nil {
		return fmt.Errorf("--intentd %s: %w", o.Intentd, err)
	}
	defer conn.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := o.config(log, reg)
	cfg.TracerProvider = tr.Provider()
	g, err := gateway.New(cfg, conn)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", o.Listen, err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() {
		if o.TLSCert != "" {
			served <- srv.ServeTLS(lis, o.TLSCert, o.TLSKey)
			return
		}
		served <- srv.Serve(lis)
	}()
	addr := lis.Addr().String()
	log.Info("intentd gateway serving", "addr", addr, "intentd", o.Intentd, "upstreams", len(o.Upstreams), "tls", o.TLSCert != "")
	if ready != nil {
		ready(addr)
	}
	select {
	case err := <-served:
		return fmt.Errorf("gateway: %w", err)
	case <-ctx.Done():
	}
	log.Info("intentd gateway stopping: in-flight calls finish and record", "within", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("gateway: calls still in flight after %v: %w", o.ShutdownTimeout, err)
	}
	return nil
}
