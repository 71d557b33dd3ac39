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

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/cliflag"
	"github.com/intentd/intentd/internal/run/netaddr"
	"github.com/intentd/intentd/mcpguard"
)

// MCPGuardOptions are `intentd mcp-guard`'s settings: its flags, and the
// downstream and tools of its config file (docs/MCP.md).
type MCPGuardOptions struct {
	Listen          string
	TLSCert         string
	TLSKey          string
	Insecure        bool
	Intentd         string
	IntentdCA       string
	IntentdName     string
	TokenFile       string
	Tenant          string
	Name            string
	Worker          string
	SessionTTL      time.Duration
	ShutdownTimeout time.Duration
	LogLevel        string
	LogFormat       string
	Downstream      *mcpguard.Downstream
	Tools           map[string]*mcpguard.Tool
}

// mcpGuardEnvName is the environment variable of an mcp-guard flag:
// --listen is INTENTD_MCP_GUARD_LISTEN.
func mcpGuardEnvName(flag string) string {
	return "INTENTD_MCP_GUARD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func newMCPGuardCommand(stderr io.Writer) *cobra.Command {
	o := MCPGuardOptions{Intentd: "127.0.0.1:7650", Name: "mcp-guard", Worker: "mcp-guard", SessionTTL: 15 * time.Second,
		ShutdownTimeout: 30 * time.Second, LogLevel: "info", LogFormat: "text"}
	cmd := &cobra.Command{
		Use:   "mcp-guard",
		Short: "Run the MCP guard: chosen tools of a downstream MCP server carried out once per approved intent",
		Long: `intentd mcp-guard is an MCP server that stands in front of one downstream
MCP server (docs/MCP.md). Calls of the tools its config file names are
carried out once per approved intent: the intent's key is derived from the
tool's action and identity (arguments, plus the host's _meta or the
guard's own values), the call is forwarded once with the operation key, its
answer is recorded in intentd and replayed to every repeat; a lost answer
is never sent again (the lookup tool settles it, else a person does).
Every other tool, prompt and resource passes through. It adds two
read-only tools, intent_status and list_completed.

It serves MCP on stdio (the default: an MCP host starts it as a server
command) or, with --listen, streamable HTTP at /mcp. The downstream and
the tools are the "downstream" and "tools" keys of the YAML file of
--config; its other keys are the flags' names. Every flag can also be set
by the environment variable named after it (--listen is
INTENTD_MCP_GUARD_LISTEN). A flag on the command line wins over the
environment, which wins over the file, which wins over the default; an
unknown key in the file is an error naming it. Logs go to stderr.

Exit status: 0 after a clean stop, 1 when the guard fails while starting
(the downstream does not start) or serving, 2 for a bad flag, environment
variable or config file key (a tool the downstream lacks included).`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{err: fmt.Errorf("unexpected argument %q: intentd mcp-guard takes flags only", args[0])}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := settleMCPGuard(cmd.Flags(), &o); err != nil {
				return &usageError{err: err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err := RunMCPGuard(ctx, o, gatewayLogger(GatewayOptions{LogLevel: o.LogLevel, LogFormat: o.LogFormat}, stderr), nil)
			var bad *mcpguard.ConfigError
			if errors.As(err, &bad) { // a tool the downstream lacks: the file is wrong
				return &usageError{err: fmt.Errorf("--%s %s: %w", configFlag, cmd.Flags().Lookup(configFlag).Value, err)}
			}
			return err
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: cliflag.Explain(err)} })
	f := cmd.Flags()
	f.String(configFlag, "", "YAML file: the downstream server (key downstream), the guarded tools (key tools; see docs/MCP.md) and flag settings, keys named as the flags")
	f.StringVar(&o.Listen, "listen", "", "serve streamable HTTP at /mcp (and /healthz, /readyz) on this address; empty: serve MCP on stdin and stdout")
	f.StringVar(&o.TLSCert, "tls-cert", "", "PEM certificate of the HTTP listener (turns HTTPS on)")
	f.StringVar(&o.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	f.BoolVar(&o.Insecure, "insecure", false, "allow plaintext HTTP on a non-loopback address")
	f.StringVar(&o.Intentd, "intentd", o.Intentd, "intentd's gRPC address")
	f.StringVar(&o.IntentdCA, "intentd-ca", "", "PEM CA of intentd's TLS certificate (turns TLS toward intentd on)")
	f.StringVar(&o.IntentdName, "intentd-server-name", "", "the name intentd's certificate is checked against (default: the host of --intentd)")
	f.StringVar(&o.TokenFile, "token-file", "", "file holding the guard's intentd bearer token: roles worker and reader, and approver for tools with approval: call; empty: no credentials")
	f.StringVar(&o.Tenant, "tenant", "", "the intents' tenant (empty: the credentials' own)")
	f.StringVar(&o.Name, "name", o.Name, "the guard's name: its intents carry the label mcp.guard=<name>, which intent_status and list_completed read")
	f.StringVar(&o.Worker, "worker", o.Worker, "the worker name of the guard's intentd session")
	f.DurationVar(&o.SessionTTL, "session-ttl", o.SessionTTL, "the guard's intentd session TTL: a guard that dies mid-call holds its intents this long")
	f.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "time in-flight calls get to finish (and record) on SIGTERM")
	f.StringVar(&o.LogLevel, "log-level", o.LogLevel, "debug, info, warn or error")
	f.StringVar(&o.LogFormat, "log-format", o.LogFormat, "text or json")
	f.VisitAll(func(fl *pflag.Flag) { fl.Usage += " (env " + mcpGuardEnvName(fl.Name) + ")" })
	return cmd
}

// settleMCPGuard sets the flags the command line left unset from the
// environment, then from the config file, reads its downstream and tools,
// and checks the whole: every error names the flag, variable or key.
func settleMCPGuard(fs *pflag.FlagSet, o *MCPGuardOptions) error {
	if err := fromEnvNamed(fs, mcpGuardEnvName); err != nil {
		return err
	}
	path := fs.Lookup(configFlag).Value.String()
	if path == "" {
		return fmt.Errorf("--%s is required: its downstream key names the MCP server to guard, its tools key the tools (docs/MCP.md)", configFlag)
	}
	err := fromFileWith(fs, path, "the guard's flag names, e.g. listen, downstream and tools", map[string]func(json.RawMessage) error{
		"downstream": func(raw json.RawMessage) error {
			d, err := mcpguard.ParseDownstream(raw)
			o.Downstream = d
			return err
		},
		"tools": func(raw json.RawMessage) error {
			t, err := mcpguard.ParseTools(raw)
			o.Tools = t
			return err
		},
	})
	if err != nil {
		return err
	}
	switch {
	case o.Downstream == nil:
		return fmt.Errorf("--%s %s: key \"downstream\" is missing: it names the MCP server to guard", configFlag, path)
	case o.Tools == nil:
		return fmt.Errorf("--%s %s: key \"tools\" is missing: it names the tools to guard", configFlag, path)
	}
	return o.validate()
}

func (o *MCPGuardOptions) validate() error {
	var errs []error
	if o.Listen != "" {
		if _, _, err := net.SplitHostPort(o.Listen); err != nil {
			errs = append(errs, fmt.Errorf("--listen %q: %v", o.Listen, err))
		} else if o.TLSCert == "" && !o.Insecure && !netaddr.Loopback(o.Listen) {
			errs = append(errs, fmt.Errorf("--listen %s is not a loopback address: serve HTTPS (--tls-cert, --tls-key), or pass --insecure", o.Listen))
		}
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if o.TLSCert != "" && o.Listen == "" {
		errs = append(errs, errors.New("--tls-cert: goes with --listen (stdio has no TLS)"))
	}
	if _, _, err := net.SplitHostPort(o.Intentd); err != nil {
		errs = append(errs, fmt.Errorf("--intentd %q: want host:port: %v", o.Intentd, err))
	} else if o.TokenFile != "" && o.IntentdCA == "" && !netaddr.Loopback(o.Intentd) {
		errs = append(errs, fmt.Errorf("--token-file: the token would cross the network to %s in plaintext: give --intentd-ca (TLS toward intentd)", o.Intentd))
	}
	if o.SessionTTL < time.Second || o.SessionTTL > 10*time.Minute {
		errs = append(errs, fmt.Errorf("--session-ttl %v: want 1s to 10m", o.SessionTTL))
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
	cfg := o.config(nil)
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (o *MCPGuardOptions) config(log *slog.Logger) mcpguard.Config {
	return mcpguard.Config{Name: o.Name, Downstream: o.Downstream, Tools: o.Tools, Tenant: o.Tenant, Worker: o.Worker, SessionTTL: o.SessionTTL, Logger: log}
}

// guardBearer sends the guard's intentd token with every call.
type guardBearer struct {
	token     string
	secureOne bool
}

func (b guardBearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b guardBearer) RequireTransportSecurity() bool { return b.secureOne }

// RunMCPGuard serves the guard o describes (settled and validated) until
// ctx ends or, on stdio, the host closes stdin. ready, if not nil, is told
// the HTTP address once it serves ("" on stdio).
func RunMCPGuard(ctx context.Context, o MCPGuardOptions, log *slog.Logger, ready func(addr string)) error {
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
	// Wait at most 5s between attempts to reach intentd again (gRPC's
	// default grows to 2m): once intentd is back after an outage, calls are
	// through in seconds, not answered unavailable for minutes.
	bo := backoff.DefaultConfig
	bo.MaxDelay = 5 * time.Second
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 20 * time.Second})}
	if o.TokenFile != "" {
		b, err := os.ReadFile(o.TokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(guardBearer{token: strings.TrimSpace(string(b)), secureOne: o.IntentdCA != "" || !netaddr.Loopback(o.Intentd)}))
	}
	conn, err := grpc.NewClient(o.Intentd, opts...)
	if err != nil {
		return fmt.Errorf("--intentd %s: %w", o.Intentd, err)
	}
	defer conn.Close()
	g, err := mcpguard.New(ctx, o.config(log), conn)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = g.Close(cctx)
	}()
	if o.Listen == "" {
		log.Info("intentd mcp-guard serving on stdio", "intentd", o.Intentd, "downstream", downstreamName(o.Downstream), "tools", len(o.Tools))
		if ready != nil {
			ready("")
		}
		err := g.Server().Run(ctx, &mcp.StdioTransport{})
		if err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) && !errors.Is(err, mcp.ErrConnectionClosed) {
			return fmt.Errorf("mcp-guard: %w", err)
		}
		return nil
	}
	mux := http.NewServeMux()
	// A host's standalone stream (its GET of /mcp) lasts as long as its
	// session: it ends when the guard stops, or Shutdown would wait for it
	// until --shutdown-timeout. A call's answer (a POST) is waited for.
	streams, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server() }, &mcp.StreamableHTTPOptions{Logger: log})
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			defer context.AfterFunc(streams, cancel)()
			r = r.WithContext(ctx)
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "ok") })
	health := healthpb.NewHealthClient(conn)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: intentv1.IntentService_ServiceDesc.ServiceName})
		switch {
		case err != nil:
			http.Error(w, "not ready: intentd does not answer: "+status.Convert(err).Message(), http.StatusServiceUnavailable)
		case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING:
			http.Error(w, "not ready: intentd is "+resp.GetStatus().String(), http.StatusServiceUnavailable)
		default:
			_, _ = fmt.Fprintln(w, "ready")
		}
	})
	lis, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", o.Listen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	srv.RegisterOnShutdown(endStreams)
	served := make(chan error, 1)
	go func() {
		if o.TLSCert != "" {
			served <- srv.ServeTLS(lis, o.TLSCert, o.TLSKey)
			return
		}
		served <- srv.Serve(lis)
	}()
	addr := lis.Addr().String()
	log.Info("intentd mcp-guard serving", "addr", addr, "path", "/mcp", "intentd", o.Intentd, "downstream", downstreamName(o.Downstream), "tools", len(o.Tools))
	if ready != nil {
		ready(addr)
	}
	select {
	case err := <-served:
		return fmt.Errorf("mcp-guard: %w", err)
	case <-ctx.Done():
	}
	log.Info("intentd mcp-guard stopping: in-flight calls finish and record", "within", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("mcp-guard: calls still in flight after %v: %w", o.ShutdownTimeout, err)
	}
	return nil
}

func downstreamName(d *mcpguard.Downstream) string {
	if d.URL != "" {
		return d.URL
	}
	return strings.Join(d.Command, " ")
}
