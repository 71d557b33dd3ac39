// Command intentd serves the intent.v1.IntentService API.
//
// With no flags it runs an embedded single-member etcd with its data under
// $XDG_DATA_HOME/intentd (else ~/.local/share/intentd) and serves gRPC on
// 127.0.0.1:7650. --etcd-endpoints points it at an external etcd cluster
// instead. Every flag can also be set as an INTENTD_* environment variable:
// --etcd-endpoints is INTENTD_ETCD_ENDPOINTS. A flag given on the command
// line wins over the environment.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/intentd/intentd/internal/daemon"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	cfg := daemon.DefaultConfig()
	cmd := &cobra.Command{
		Use:           "intentd",
		Short:         "Durable, fenced records of approved business intents, on etcd",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fromEnv(cmd.Flags()); err != nil {
				return report(err)
			}
			if err := cfg.Validate(); err != nil {
				return report(err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return report(daemon.Run(ctx, cfg, cfg.Logger(), nil))
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen address")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "external etcd endpoints (comma-separated); empty runs an embedded etcd")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory: the revision floor file (also with --etcd-endpoints; one per replica) and the embedded etcd's data")
	f.StringVar(&cfg.EmbedClientURL, "embed-client-url", cfg.EmbedClientURL, "client URL of the embedded etcd")
	f.StringVar(&cfg.EmbedPeerURL, "embed-peer-url", cfg.EmbedPeerURL, "peer URL of the embedded etcd")
	f.StringVar(&cfg.Prefix, "prefix", cfg.Prefix, "etcd key prefix of this installation")
	f.DurationVar(&cfg.DialTimeout, "dial-timeout", cfg.DialTimeout, "time allowed to reach etcd at start")
	f.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "deadline of each etcd call")
	f.DurationVar(&cfg.OperationTimeout, "operation-timeout", cfg.OperationTimeout, "deadline of one store operation with its retries")
	f.DurationVar(&cfg.HealthInterval, "health-interval", cfg.HealthInterval, "how often etcd is probed for the health service")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "time in-flight calls get to finish on SIGTERM")
	f.DurationVar(&cfg.JanitorInterval, "janitor-interval", cfg.JanitorInterval, "how often the elected replica sweeps lapsed leases and expired records")
	f.DurationVar(&cfg.DefaultRetention, "retention", cfg.DefaultRetention, "how long a final record is kept unless its registration says otherwise")
	f.DurationVar(&cfg.MaxRetention, "max-retention", cfg.MaxRetention, "the longest retention a registration may ask for")
	f.DurationVar(&cfg.TombstoneRetention, "tombstone-retention", cfg.TombstoneRetention, "how long the tombstone of a removed record is kept")
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
	f.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "address of the Prometheus /metrics endpoint (empty: off)")
	f.IntVar(&cfg.MaxRecvMsgSize, "max-recv-msg-size", cfg.MaxRecvMsgSize, "largest request accepted, in bytes")
	f.DurationVar(&cfg.ReloadInterval, "reload-interval", cfg.ReloadInterval, "how often the tokens and TLS files are checked for changes")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
	f.StringVar(&cfg.ClockOffsetFile, "fault-clock-offset-file", "", "testing only (fault injection): file holding a Go duration (5m, -5m) added to intentd's wall clock, re-read every 100ms")
	_ = f.MarkHidden("fault-clock-offset-file") // not for production use
	return cmd
}

// fromEnv sets every flag not given on the command line from its INTENTD_*
// variable.
func fromEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		name := "INTENTD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(name)
		if !ok || f.Changed || err != nil {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s=%q: %w", name, v, serr)
		}
	})
	return err
}

func report(err error) error {
	if err != nil {
		// Errors from the daemon name intentd already.
		fmt.Fprintln(os.Stderr, "intentd: "+strings.TrimPrefix(err.Error(), "intentd: "))
	}
	return err
}
