package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/intent"
)

// tokenPrefix marks intentd bearer tokens, so that a leaked one is
// recognizable (by a secret scanner, say) for what it is.
const tokenPrefix = "itd_"

// maxTokenLen bounds what token hash reads from stdin.
const maxTokenLen = 4096

func newTokenCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Issue bearer tokens and hash them for the tokens file",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newTokenNewCommand(), newTokenHashCommand())
	return cmd
}

// newToken returns "itd_" and 32 random bytes in unpadded base64url.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

func newTokenNewCommand() *cobra.Command {
	var (
		name           string
		tenants, roles []string
	)
	cmd := &cobra.Command{
		Use:   "new --name NAME --tenant T --role R [--role R2]",
		Short: "Print a fresh bearer token, once, and its tokens-file entry",
		Long: `token new prints two lines on stdout: a fresh bearer token (32 random bytes,
base64url, prefixed "itd_"), and the JSON entry for the "principals" list
of intentd's tokens file, which holds only the token's SHA-256, never the
token. The token is shown this once: hand it to its holder (who passes it
as --token or INTENTD_TOKEN) and keep no copy.

Roles: approver (Register, Cancel), worker (sessions, Acquire, reports,
Escalate), reviewer (Resolve, Escalate, Get, List, Watch), reader (Get,
List, Watch, DeriveKey), admin (everything). Tenant "*" means every tenant.`,
		Args: cobra.NoArgs,
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			entry, err := tokenEntry(name, tenants, roles)
			if err != nil {
				return err
			}
			token, err := newToken()
			if err != nil {
				return fmt.Errorf("random token: %w", err)
			}
			entry.TokenSHA256 = []string{access.HashToken(token)}
			line, err := json.Marshal(entry)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n%s\n", token, line)
			fmt.Fprintf(cmd.ErrOrStderr(), "The first line is %s's bearer token, shown only now.\nThe second goes into the \"principals\" list of intentd's tokens file; it holds only the token's hash.\n", name)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "principal name, recorded in every history entry it writes")
	f.StringSliceVar(&tenants, "tenant", nil, `tenant the principal may act in (repeatable); "*" for all`)
	f.StringSliceVar(&roles, "role", nil, "role: approver, worker, reviewer, reader or admin (repeatable)")
	for _, n := range []string{"name", "tenant", "role"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

// tokenEntry checks what access.Parse will check when intentd loads the
// file, so that a mistake shows now rather than at intentd's next reload.
func tokenEntry(name string, tenants, roles []string) (*access.Entry, error) {
	if name == "" || len(name) > 128 {
		return nil, usagef("--name %q: want 1 to 128 bytes", name)
	}
	e := &access.Entry{Name: name}
	for _, t := range tenants {
		if t != access.AllTenants {
			if err := intent.ValidateTenant(t); err != nil {
				return nil, usagef("--tenant %q: %v", t, err)
			}
		}
		if !slices.Contains(e.Tenants, t) {
			e.Tenants = append(e.Tenants, t)
		}
	}
	for _, r := range roles {
		role := access.Role(strings.ToLower(strings.TrimSpace(r)))
		if !slices.Contains(access.Roles, role) {
			return nil, usagef("--role %q: want approver, worker, reviewer, reader or admin", r)
		}
		if !slices.Contains(e.Roles, role) {
			e.Roles = append(e.Roles, role)
		}
	}
	if len(e.Tenants) == 0 || len(e.Roles) == 0 {
		return nil, usagef("--tenant and --role: at least one each")
	}
	return e, nil
}

func newTokenHashCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "hash < TOKEN",
		Short: "Print the SHA-256 of a token read on stdin, as the tokens file stores it",
		Long: `token hash reads one token on stdin (surrounding whitespace and the final
newline are ignored) and prints its lowercase hex SHA-256: the value of a
tokens file entry's token_sha256. Reading stdin keeps the token out of the
shell history and the process list.`,
		Args: cobra.NoArgs,
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxTokenLen+1))
			if err != nil {
				return fmt.Errorf("stdin: %w", err)
			}
			if len(b) > maxTokenLen {
				return fmt.Errorf("stdin: more than %d bytes; want one token", maxTokenLen)
			}
			token := strings.TrimSpace(string(b))
			if token == "" {
				return fmt.Errorf("stdin: no token")
			}
			if strings.ContainsAny(token, " \t\r\n") {
				return fmt.Errorf("stdin: whitespace inside the token; want one token")
			}
			fmt.Fprintln(cmd.OutOrStdout(), access.HashToken(token))
			return nil
		}),
	}
}
