package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/internal/run/cliflag"
	"github.com/intentd/intentd/internal/run/netaddr"
	"github.com/intentd/intentd/internal/run/version"
)

// DefaultAddr is where intentd listens when started without flags.
const DefaultAddr = "127.0.0.1:7650"

// envPrefix names the environment variable of each global flag not given
// on the command line: --addr is INTENTCTL_ADDR, --cacert INTENTCTL_CACERT.
const envPrefix = "INTENTCTL_"

// Older names of INTENTCTL_ADDR and INTENTCTL_TOKEN, still read when the
// new ones are unset: scripts written against them keep working.
const (
	envAddr  = "INTENTD_ADDR"
	envToken = "INTENTD_TOKEN"
)

// envName is the environment variable of global flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// globals are the flags every command shares: where intentd is and how to
// prove who is calling.
type globals struct {
	addr    string
	tenant  string
	token   string
	tls     bool
	caCert  string
	cert    string
	key     string
	timeout time.Duration
	out     output

	// lastErr is the error of the latest failed attempt: the client
	// retries while intentd does not answer, and when the deadline ends
	// the retries this is what tells a stopped intentd from a TLS mismatch.
	lastErr atomic.Pointer[error]
}

func newRootCommand(env lookupEnv) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:     "intentctl",
		Version: version.String(),
		Short:   "Operate intentd: read intents, work the review queue, issue tokens and dev certificates",
		Long: `intentctl is the operator's command line for intentd.

It talks to intentd through the Go client, as any caller does: it sees and
changes only what its token (--token, $INTENTCTL_TOKEN) or client
certificate (--cert/--key) is allowed to. Every global flag can be set by
the environment variable named after it (--addr is INTENTCTL_ADDR; the
older INTENTD_ADDR and INTENTD_TOKEN are still read); a flag on the
command line wins.

Output is for people by default: get prints a summary and the history as a
timeline, list one line per intent. -o json prints the response as
protojson, -o yaml the same as YAML, -o wide the people's form with more
columns. Errors print intentd's code, reason, field and statement on stderr.

Exit status, for scripts:
  0  done (a resolve that finds its own decision already recorded is done)
  1  intentd refused the call (code and reason on stderr), or it failed
  2  usage: a bad command, flag, argument or environment variable
  3  unreachable: nothing answered at --addr, TLS did not match, no answer
     within --timeout, or intentd could not reach etcd (UNAVAILABLE). A
     change may or may not have been made; every command is safe to rerun`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.fromEnv(cmd, env)
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: cliflag.Explain(err).Error()} })
	root.SetVersionTemplate("intentctl {{.Version}}\n")
	f := root.PersistentFlags()
	f.StringVar(&g.addr, "addr", DefaultAddr, "intentd's gRPC address")
	f.StringVar(&g.tenant, "tenant", "", `tenant of the request; empty means intentd's "default"`)
	f.StringVar(&g.token, "token", "", "bearer token sent as authorization metadata on every call")
	f.BoolVar(&g.tls, "tls", false, "connect with TLS (implied by --cacert, --cert and --key)")
	f.StringVar(&g.caCert, "cacert", "", "PEM file of the CA that signed intentd's certificate (default: the system's roots)")
	f.StringVar(&g.cert, "cert", "", "PEM client certificate for mutual TLS (with --key)")
	f.StringVar(&g.key, "key", "", "PEM key of the client certificate (with --cert)")
	f.DurationVar(&g.timeout, "timeout", 10*time.Second, "deadline of the whole command, retries included (watch has none)")
	f.StringVarP(&g.out.format, "output", "o", formatText, "output format: text, wide, json or yaml")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
	f.VisitAll(func(fl *pflag.Flag) { fl.Usage += " (env " + envName(fl.Name) + ")" })

	root.AddCommand(
		newGetCommand(g),
		newListCommand(g),
		newReviewQueueCommand(g),
		newResolveCommand(g),
		newCancelCommand(g),
		newEscalateCommand(g),
		newWatchCommand(g),
		newDeriveKeyCommand(g),
		newHistoryCommand(g),
		newRegisterCommand(g),
		newHealthCommand(g),
		newSessionsCommand(g),
		newTokenCommand(),
		newDevCertsCommand(),
		newProbeCommand(g),
		newFormatsCommand(g),
	)
	return root
}

// fromEnv sets every global flag not given on the command line from its
// INTENTCTL_* variable (--addr and --token also from their older names),
// then checks -o.
func (g *globals) fromEnv(cmd *cobra.Command, env lookupEnv) error {
	old := map[string]string{"addr": envAddr, "token": envToken}
	var err error
	cmd.Root().PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil {
			return
		}
		for _, name := range []string{envName(f.Name), old[f.Name]} {
			v, ok := env(name)
			if name == "" || !ok || v == "" {
				continue
			}
			if f.Value.Set(v) != nil {
				err = &usageError{msg: cliflag.BadValue(fmt.Sprintf("%s (--%s)", name, f.Name), v, f).Error()}
			}
			return
		}
	})
	if err != nil {
		return err
	}
	return g.out.check()
}

// useTLS reports whether the connection is TLS: asked for, or implied by a
// CA or client certificate (a CA given for a plaintext connection would
// otherwise be silently ignored).
func (g *globals) useTLS() bool { return g.tls || g.caCert != "" || g.cert != "" || g.key != "" }

// check validates the connection flags together.
func (g *globals) check() error {
	if g.addr == "" {
		return usagef("--addr: must not be empty")
	}
	if g.timeout <= 0 {
		return usagef("--timeout %v: must be positive", g.timeout)
	}
	if (g.cert == "") != (g.key == "") {
		return usagef("--cert and --key go together")
	}
	for _, c := range g.token {
		if c <= ' ' || c > '~' {
			return usagef("--token: must be printable ASCII without spaces")
		}
	}
	if g.token != "" && !g.useTLS() && !netaddr.Loopback(g.addr) {
		return usagef("--token: refusing to send a bearer token in plain text to %s; use --tls (plaintext is for loopback only)", g.addr)
	}
	return nil
}

func (g *globals) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if g.caCert != "" {
		b, err := os.ReadFile(g.caCert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--cacert %s: no PEM certificate in it", g.caCert)
		}
		cfg.RootCAs = pool
	}
	if g.cert != "" {
		pair, err := tls.LoadX509KeyPair(g.cert, g.key)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		// Present the certificate even when the server names other CAs as
		// acceptable: a refusal that says why beats an anonymous call
		// refused for want of credentials.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return cfg, nil
}

// connect returns a client of intentd and a function that closes its
// connection. grpc.NewClient does not dial: an unreachable intentd shows up
// as the first call's error.
func (g *globals) connect() (*client.Client, func(), error) {
	conn, err := g.dial()
	if err != nil {
		return nil, nil, err
	}
	c := client.New(conn, client.WithTenant(g.tenant), client.WithCallTimeout(g.timeout))
	return c, func() { _ = conn.Close() }, nil
}

// callOnce connects, makes one call within --timeout, and closes the
// connection: what most commands do.
func callOnce[T any](ctx context.Context, g *globals, call func(context.Context, *client.Client) (T, error)) (T, error) {
	c, done, err := g.connect()
	if err != nil {
		var zero T
		return zero, err
	}
	defer done()
	ctx, cancel := g.deadline(ctx)
	defer cancel()
	return call(ctx, c)
}

// dial returns a connection to intentd that has answered once: with the
// credentials of the flags, checked together first.
func (g *globals) dial() (*grpc.ClientConn, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if g.useTLS() {
		cfg, err := g.tlsConfig()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return g.note(invoker(ctx, method, req, reply, cc, opts...))
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			return s, g.note(err)
		}),
	}
	if g.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: g.token, requireTLS: g.useTLS()}))
	}
	conn, err := grpc.NewClient(g.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("--addr %s: %w", g.addr, err)
	}
	if err := g.reach(conn); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// reach fails at once when intentd cannot be reached at all — nothing
// listens at --addr, or TLS does not match — rather than let the client
// retry UNAVAILABLE until --timeout runs out: a command line should say so
// now. It asks the health service, which is open to every caller; a call
// that fails for want of a connection fails at once (no wait-for-ready).
// Once connected, the client still retries an intentd whose etcd does not
// answer, within --timeout.
func (g *globals) reach(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		return nil
	}
	return &unreachable{err: fmt.Errorf("cannot reach intentd at %s: %s; is intentd running there, and do --tls, --cacert, --cert and --key match how it serves?",
		g.addr, status.Convert(err).Message())}
}

// note remembers a failed attempt's error and returns it.
func (g *globals) note(err error) error {
	if err != nil {
		g.lastErr.Store(&err)
	}
	return err
}

// action is the package's action for commands that call intentd: a
// command that ran out of time says what its last attempt met.
func (g *globals) action(body func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return action(func(cmd *cobra.Command, args []string) error {
		err := body(cmd, args)
		var refusal *client.Error
		if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &refusal) {
			return err
		}
		last := "none"
		if p := g.lastErr.Load(); p != nil {
			last = (*p).Error()
		}
		return &unreachable{err: fmt.Errorf("could not reach intentd at %s within --timeout %v: %w; last attempt: %s; is intentd running there, and do --tls, --cacert, --cert and --key match how it serves?",
			g.addr, g.timeout, err, last)}
	})
}

// deadline bounds a command by --timeout.
func (g *globals) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.timeout)
}

// bearer sends "authorization: Bearer <token>" with every call. Over TLS it
// requires the connection to stay TLS; in plain text it is only ever used
// toward loopback (globals.check).
type bearer struct {
	token      string
	requireTLS bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.requireTLS }
