package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// secured is an intentd serving TLS with optional client certificates and
// a tokens file, set up with intentctl's own dev-certs and token new.
type secured struct {
	addr  string
	pki   string // dev-certs output directory
	token string // a reviewer of tenant acme
}

func startSecured(t *testing.T) *secured {
	t.Helper()
	s := &secured{pki: filepath.Join(t.TempDir(), "pki")}
	mustRun(t, "dev-certs", "--out", s.pki, "--client", "ops-1", "--client", "stranger", "--test-certs")
	lines := strings.Split(strings.TrimSpace(mustRun(t, "token", "new", "--name", "reviewer-1", "--tenant", "acme", "--role", "reviewer")), "\n")
	s.token = lines[0]
	tokens := `{"principals": [
  ` + lines[1] + `,
  {"name": "ops-1", "tenants": ["acme"], "roles": ["reader"], "cert_names": ["intentd://principal/ops-1"]}
]}`
	tokensFile := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(tokensFile, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}

	cfg := intentdtest.Config(t.TempDir())
	cfg.TLSCert = filepath.Join(s.pki, "server.pem")
	cfg.TLSKey = filepath.Join(s.pki, "server-key.pem")
	cfg.TLSClientCA = filepath.Join(s.pki, "ca.pem")
	cfg.TLSClientAuth = "optional" // a token suffices; a certificate, if given, must verify
	cfg.TokensFile = tokensFile
	in, err := intentdtest.Run(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("secured intentd: %v", err)
	}
	s.addr = in.Addr
	t.Cleanup(func() {
		if err := in.Stop(); err != nil {
			t.Errorf("secured intentd exited with %v", err)
		}
	})
	return s
}

func (s *secured) file(name string) string { return filepath.Join(s.pki, name) }

// certFlags are the flags of a client presenting client-<name>.pem.
func (s *secured) certFlags(name string) []string {
	return []string{"--cacert", s.file("ca.pem"), "--cert", s.file("client-" + name + ".pem"), "--key", s.file("client-" + name + "-key.pem")}
}

// Tokens and client certificates reach a secured intentd; wrong, missing,
// expired and untrusted credentials, and plaintext, are refused with exit 1
// and a message that says why.
func TestSecured(t *testing.T) {
	s := startSecured(t)
	tls := []string{"--cacert", s.file("ca.pem")}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string // on stdout for exit 0, on stderr otherwise
	}{
		{"token", append([]string{"review-queue", "--token", s.token}, tls...), nil, exitOK, "(no intents)"},
		{"token from the environment", append([]string{"review-queue"}, tls...), map[string]string{envToken: s.token}, exitOK, "(no intents)"},
		{"token from INTENTCTL_TOKEN", append([]string{"review-queue"}, tls...), map[string]string{envName("token"): s.token}, exitOK, "(no intents)"},
		{"INTENTCTL_TOKEN wins over INTENTD_TOKEN", append([]string{"review-queue"}, tls...), map[string]string{envName("token"): s.token, envToken: "itd_wrong"}, exitOK, "(no intents)"},
		{"CA from INTENTCTL_CACERT", []string{"review-queue", "--token", s.token}, map[string]string{envName("cacert"): s.file("ca.pem")}, exitOK, "(no intents)"},
		{"flag wins over the environment", append([]string{"review-queue", "--token", s.token}, tls...), map[string]string{envToken: "itd_wrong"}, exitOK, "(no intents)"},
		{"token, its own tenant named", append([]string{"review-queue", "--token", s.token, "--tenant", "acme"}, tls...), nil, exitOK, "(no intents)"},
		{"client certificate", append([]string{"get", "nothing-here"}, s.certFlags("ops-1")...), nil, exitFailure, "reason: INTENT_NOT_FOUND"},
		{"--tls with the system roots does not trust a dev CA", []string{"get", "k", "--tls", "--timeout", "1s"}, nil, exitUnreachable, "reach intentd at"},
		{"wrong token", append([]string{"review-queue", "--token", "itd_wrong"}, tls...), nil, exitFailure, "code: UNAUTHENTICATED"},
		{"no credentials", append([]string{"review-queue"}, tls...), nil, exitFailure, "code: UNAUTHENTICATED"},
		{"certificate of no principal", append([]string{"review-queue"}, s.certFlags("stranger")...), nil, exitFailure, "code: UNAUTHENTICATED"},
		{"another tenant", append([]string{"review-queue", "--token", s.token, "--tenant", "globex"}, tls...), nil, exitFailure, "code: PERMISSION_DENIED"},
		{"a reader resolving", append([]string{"resolve", "k", "--decision", "pending", "--actor", "a", "--reason", "r"}, s.certFlags("ops-1")...), nil, exitFailure, "code: PERMISSION_DENIED"},
		// With TLS 1.3 the server refuses a client certificate after the
		// client's side of the handshake: what the last attempt saw varies
		// (the alert, or a broken pipe), so only the outcome is checked.
		{"expired certificate", append([]string{"review-queue", "--timeout", "1s"}, s.certFlags("expired")...), nil, exitUnreachable, "reach intentd at"},
		{"untrusted certificate", append([]string{"review-queue", "--timeout", "1s"}, s.certFlags("untrusted")...), nil, exitUnreachable, "reach intentd at"},
		{"plaintext against TLS", []string{"review-queue", "--timeout", "1s"}, nil, exitUnreachable, "reach intentd at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{envAddr: s.addr}
			for k, v := range tt.env {
				env[k] = v
			}
			r := invocation{args: tt.args, env: env}.run(t)
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tt.code, r.stdout, r.stderr)
			}
			got := r.stderr
			if tt.code == exitOK {
				got = r.stdout
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, got)
			}
			if strings.Contains(r.stdout+r.stderr, s.token) {
				t.Errorf("output shows the token")
			}
		})
	}
}
