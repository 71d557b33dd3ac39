package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/run/devcerts"
)

// intentd's flags for TLS, mutual TLS and the tokens file, as the hint
// dev-certs prints uses them.
const (
	flagTLSCert    = "--tls-cert"
	flagTLSKey     = "--tls-key"
	flagClientCA   = "--tls-client-ca"
	flagTokensFile = "--tokens-file"
)

func newDevCertsCommand() *cobra.Command {
	var (
		out              string
		clients, hosts   []string
		testCerts, force bool
	)
	cmd := &cobra.Command{
		Use:   "dev-certs --out DIR [--client NAME ...] [--host H ...]",
		Short: "Write a development CA, server and client certificates",
		Long: `dev-certs writes a development PKI into DIR: ca.pem and ca-key.pem, server.pem
and server-key.pem (for localhost, 127.0.0.1, ::1 and each --host), and for
each --client NAME client-NAME.pem and client-NAME-key.pem, whose subject CN
is NAME and whose URI SAN is intentd://principal/NAME: the identity a tokens
file entry lists in cert_names. Keys are ECDSA P-256, mode 0600.

--test-certs also writes client-expired.pem (already expired) and
client-untrusted.pem (signed by a CA that is written nowhere), both claiming
the first client's identity, for tests that must see them refused.

For development only: every run makes a new CA, so an existing ca.pem is
kept unless --force.`,
		Args: cobra.NoArgs,
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			opts := devcerts.Options{Clients: clients, Hosts: hosts}
			if testCerts {
				if len(clients) == 0 {
					return usagef("--test-certs: needs a --client whose identity the test certificates claim")
				}
				opts.ExpiredClient, opts.UntrustedClient = clients[0], clients[0]
			}
			if _, err := os.Stat(filepath.Join(out, "ca.pem")); err == nil && !force {
				return usagef("%s already holds ca.pem; a new CA would invalidate every certificate it signed (use --force to replace it)", out)
			}
			files, err := devcerts.Generate(out, opts)
			if errors.Is(err, devcerts.ErrInvalid) {
				return &usageError{msg: err.Error()}
			}
			if err != nil {
				return err
			}
			return describeCerts(cmd.OutOrStdout(), files, clients)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory to write into (created 0700 if missing)")
	f.StringSliceVar(&clients, "client", nil, "client certificate for this principal name (repeatable)")
	f.StringSliceVar(&hosts, "host", nil, "extra DNS name or IP address of the server certificate (repeatable)")
	f.BoolVar(&testCerts, "test-certs", false, "also write client-expired.pem and client-untrusted.pem, for tests")
	f.BoolVar(&force, "force", false, "replace an existing CA")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

// describeCerts prints what was written and how to use it.
func describeCerts(w io.Writer, f *devcerts.Files, clients []string) error {
	fmt.Fprintf(w, "Wrote development certificates to %s:\n", f.Dir)
	fmt.Fprintf(w, "  %s  %s\n      the CA (its key signs new certificates: keep it private, or delete it)\n", f.CA.Cert, f.CA.Key)
	fmt.Fprintf(w, "  %s  %s\n      intentd, for %v\n", f.Server.Cert, f.Server.Key, f.ServerNames)
	for _, name := range clients {
		p := f.Clients[name]
		fmt.Fprintf(w, "  %s  %s\n      client %s (%s)\n", p.Cert, p.Key, name, devcerts.PrincipalURI(name))
	}
	if f.Expired.Cert != "" {
		fmt.Fprintf(w, "  %s  %s\n      test: already expired\n", f.Expired.Cert, f.Expired.Key)
	}
	if f.Untrusted.Cert != "" {
		fmt.Fprintf(w, "  %s  %s\n      test: signed by an untrusted CA\n", f.Untrusted.Cert, f.Untrusted.Key)
	}

	if len(clients) == 0 {
		fmt.Fprintf(w, "\nStart intentd with them:\n  go run ./cmd/intentd %s %s %s %s %s tokens.json\n",
			flagTLSCert, f.Server.Cert, flagTLSKey, f.Server.Key, flagTokensFile)
		fmt.Fprintf(w, "\nCall it with a token (intentctl token new):\n  intentctl --cacert %s --token $INTENTD_TOKEN review-queue\n", f.CA.Cert)
		return nil
	}
	fmt.Fprintf(w, "\nStart intentd with them (mutual TLS):\n  go run ./cmd/intentd %s %s %s %s %s %s %s tokens.json\n",
		flagTLSCert, f.Server.Cert, flagTLSKey, f.Server.Key, flagClientCA, f.CA.Cert, flagTokensFile)
	// One principal a line: easy to read, and to paste into a file.
	entries := make([]string, 0, len(clients))
	for _, name := range clients {
		b, err := json.Marshal(access.Entry{
			Name: name, Tenants: []string{intent.DefaultTenant}, Roles: []access.Role{access.RoleReader},
			CertNames: []string{devcerts.PrincipalURI(name)},
		})
		if err != nil {
			return err
		}
		entries = append(entries, string(b))
	}
	fmt.Fprintf(w, "\nA tokens.json mapping the client certificates to principals (set their tenants and roles):\n{\"principals\": [\n  %s\n]}\n", strings.Join(entries, ",\n  "))
	p := f.Clients[clients[0]]
	fmt.Fprintf(w, "\nCall intentd as %s:\n  intentctl --cacert %s --cert %s --key %s review-queue\n", clients[0], f.CA.Cert, p.Cert, p.Key)
	return nil
}
