package access

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/internal/testing/testlog"
)

// Tokens of the test files and their hashes, as an operator would compute
// them with HashToken (or sha256sum).
var (
	approverToken = "approver-secret-1"
	workerToken   = "worker-secret-1"
	rotatedToken  = "worker-secret-2"
)

// goodFile is a tokens file with every kind of entry: one token, two
// tokens (rotation), certificate names only, all tenants.
func goodFile() string {
	return fmt.Sprintf(`{"principals": [
  {"name": "checkout-approver", "tenants": ["acme"], "roles": ["approver"],
   "token_sha256": [%q]},
  {"name": "fleet-worker", "tenants": ["acme", "globex"], "roles": ["worker", "reader"],
   "token_sha256": [%q, %q]},
  {"name": "ops-1", "tenants": ["*"], "roles": ["reviewer"],
   "cert_names": ["intentd://principal/ops-1", "ops-1.example.com"]}
]}
`, HashToken(approverToken), HashToken(workerToken), HashToken(rotatedToken))
}

func TestParseAcceptsGoodFile(t *testing.T) {
	d, err := Parse([]byte(goodFile()))
	if err != nil {
		t.Fatalf("Parse(good file) = %v, want nil", err)
	}
	if got := d.Len(); got != 3 {
		t.Errorf("Len() = %d, want 3", got)
	}
	tests := []struct {
		token   string
		name    string
		tenants []string
		roles   []Role
	}{
		{approverToken, "checkout-approver", []string{"acme"}, []Role{RoleApprover}},
		{workerToken, "fleet-worker", []string{"acme", "globex"}, []Role{RoleWorker, RoleReader}},
		{rotatedToken, "fleet-worker", []string{"acme", "globex"}, []Role{RoleWorker, RoleReader}},
	}
	for _, tc := range tests {
		p, ok := d.ByToken(tc.token)
		if !ok {
			t.Errorf("ByToken(%q) found nobody, want %s", tc.token, tc.name)
			continue
		}
		if p.Name != tc.name || !slices.Equal(p.Tenants, tc.tenants) || !slices.Equal(p.Roles, tc.roles) {
			t.Errorf("ByToken(%q) = %+v, want {%s %v %v}", tc.token, *p, tc.name, tc.tenants, tc.roles)
		}
	}
	for _, token := range []string{"", "nobody", HashToken(approverToken), strings.ToUpper(approverToken), approverToken + " "} {
		if p, ok := d.ByToken(token); ok {
			t.Errorf("ByToken(%q) = %s, want nobody (only the exact token authenticates, never its hash)", token, p.Name)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	h := HashToken("some-token")
	entry := func(fields string) string { return `{"principals": [` + fields + `]}` }
	tests := []struct {
		name string
		file string
		want string // a substring of the error
	}{
		{"empty input", ``, "EOF"},
		{"not JSON", `principals: []`, "invalid character"},
		{"a plain token instead of its hash",
			entry(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token": "plain-secret"}`), `unknown field "token"`},
		{"unknown top-level field",
			`{"principals": [], "version": 2}`, `unknown field "version"`},
		{"unknown role",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["superuser"], "token_sha256": [%q]}`, h)), `unknown role "superuser"`},
		{"role in the wrong case",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["Admin"], "token_sha256": [%q]}`, h)), `unknown role "Admin"`},
		{"uppercase tenant",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["Acme"], "roles": ["worker"], "token_sha256": [%q]}`, h)), `tenant "Acme"`},
		{"tenant with a space",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme corp"], "roles": ["worker"], "token_sha256": [%q]}`, h)), `tenant "acme corp"`},
		{"empty tenant",
			entry(fmt.Sprintf(`{"name": "w", "tenants": [""], "roles": ["worker"], "token_sha256": [%q]}`, h)), `tenant ""`},
		{"tenant with a slash (would escape the key prefix)",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme/../globex"], "roles": ["worker"], "token_sha256": [%q]}`, h)), `tenant "acme/../globex"`},
		{"no tenants",
			entry(fmt.Sprintf(`{"name": "w", "roles": ["worker"], "token_sha256": [%q]}`, h)), "no tenants"},
		{"no roles",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": [], "token_sha256": [%q]}`, h)), "no roles"},
		{"no name",
			entry(fmt.Sprintf(`{"tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]}`, h)), "name must be"},
		{"name of 129 bytes",
			entry(fmt.Sprintf(`{"name": %q, "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]}`, strings.Repeat("n", 129), h)), "name must be"},
		{"uppercase hash",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]}`, strings.ToUpper(h))), "not 64 lowercase hex digits"},
		{"short hash",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]}`, h[:62])), "not 64 lowercase hex digits"},
		{"long hash",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]}`, h+"00")), "not 64 lowercase hex digits"},
		{"hash that is not hex",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]}`, "zz"+h[2:])), "not 64 lowercase hex digits"},
		{"the token where its hash belongs",
			entry(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": ["plain-secret"]}`), "not 64 lowercase hex digits"},
		{"duplicate names",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]},
			                   {"name": "w", "tenants": ["acme"], "roles": ["reader"], "cert_names": ["w"]}`, h)), "name used twice"},
		{"one token hash for two principals",
			entry(fmt.Sprintf(`{"name": "w1", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q]},
			                   {"name": "w2", "tenants": ["globex"], "roles": ["admin"], "token_sha256": [%q]}`, h, h)), "two principals"},
		{"one token hash twice in one principal",
			entry(fmt.Sprintf(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [%q, %q]}`, h, h)), "two principals"},
		{"one cert name for two principals",
			entry(`{"name": "a", "tenants": ["acme"], "roles": ["reader"], "cert_names": ["intentd://principal/x"]},
			       {"name": "b", "tenants": ["acme"], "roles": ["admin"], "cert_names": ["intentd://principal/x"]}`), "belongs to two principals"},
		{"empty cert name",
			entry(`{"name": "a", "tenants": ["acme"], "roles": ["reader"], "cert_names": [""]}`), "empty cert name"},
		{"no credentials",
			entry(`{"name": "w", "tenants": ["acme"], "roles": ["worker"]}`), "neither token_sha256 nor cert_names"},
		{"empty credential lists",
			entry(`{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token_sha256": [], "cert_names": []}`), "neither token_sha256 nor cert_names"},
		{"trailing object",
			`{"principals": []} {"principals": []}`, "data after the JSON object"},
		{"trailing word",
			`{"principals": []} garbage`, "data after the JSON object"},
		{"trailing closing brace",
			`{"principals": []}}`, "data after the JSON object"},
		{"trailing bracket hiding a plain token",
			`{"principals": []}]{"name": "w", "token": "plain-secret"}`, "data after the JSON object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse([]byte(tc.file))
			if err == nil {
				t.Fatalf("Parse(%s) accepted %d principals, want an error containing %q", tc.file, d.Len(), tc.want)
			}
			if !errors.Is(err, ErrBadFile) {
				t.Errorf("Parse error %v does not wrap ErrBadFile", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error %q, want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "plain-secret") {
				t.Errorf("Parse error %q repeats the plain token", err)
			}
		})
	}
}

// HashToken matches the published SHA-256 test vectors and the example of
// the tokens file's documentation, so that an operator can compute hashes
// with any tool.
func TestHashToken(t *testing.T) {
	tests := []struct{ token, want string }{
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"test", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
	}
	for _, tc := range tests {
		if got := HashToken(tc.token); got != tc.want {
			t.Errorf("HashToken(%q) = %s, want %s", tc.token, got, tc.want)
		}
	}
	d, err := Parse([]byte(`{"principals": [{"name": "checkout-approver", "tenants": ["acme"], "roles": ["approver"],
		"token_sha256": ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]}]}`))
	if err != nil {
		t.Fatalf("Parse(documented example) = %v", err)
	}
	if p, ok := d.ByToken("test"); !ok || p.Name != "checkout-approver" {
		t.Errorf("ByToken(%q) = %v %v, want checkout-approver", "test", p, ok)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("url.Parse(%q): %v", s, err)
	}
	return u
}

func TestByCert(t *testing.T) {
	d, err := Parse([]byte(`{"principals": [
	  {"name": "by-uri", "tenants": ["acme"], "roles": ["worker"], "cert_names": ["intentd://principal/by-uri"]},
	  {"name": "by-dns", "tenants": ["acme"], "roles": ["reader"], "cert_names": ["worker-7.acme.internal"]},
	  {"name": "by-email", "tenants": ["acme"], "roles": ["reviewer"], "cert_names": ["ops@acme.example"]},
	  {"name": "by-cn", "tenants": ["acme"], "roles": ["approver"], "cert_names": ["legacy-client"]}
	]}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	tests := []struct {
		name string
		cert *x509.Certificate
		want string // principal; empty: nobody
	}{
		{"URI SAN", &x509.Certificate{URIs: []*url.URL{mustURL(t, "intentd://principal/by-uri")}}, "by-uri"},
		{"DNS SAN", &x509.Certificate{DNSNames: []string{"worker-7.acme.internal"}}, "by-dns"},
		{"email SAN", &x509.Certificate{EmailAddresses: []string{"ops@acme.example"}}, "by-email"},
		{"subject CN", &x509.Certificate{Subject: pkix.Name{CommonName: "legacy-client"}}, "by-cn"},
		{"URI SAN before CN",
			&x509.Certificate{Subject: pkix.Name{CommonName: "legacy-client"}, URIs: []*url.URL{mustURL(t, "intentd://principal/by-uri")}}, "by-uri"},
		{"DNS SAN before CN",
			&x509.Certificate{Subject: pkix.Name{CommonName: "legacy-client"}, DNSNames: []string{"worker-7.acme.internal"}}, "by-dns"},
		{"unmapped names among mapped ones",
			&x509.Certificate{DNSNames: []string{"other.example", "worker-7.acme.internal"}}, "by-dns"},
		{"nothing mapped",
			&x509.Certificate{Subject: pkix.Name{CommonName: "stranger"}, URIs: []*url.URL{mustURL(t, "intentd://principal/stranger")}, DNSNames: []string{"stranger.example"}}, ""},
		{"a longer URI does not match by prefix",
			&x509.Certificate{URIs: []*url.URL{mustURL(t, "intentd://principal/by-uri/extra")}}, ""},
		{"subject organization is no identity",
			&x509.Certificate{Subject: pkix.Name{Organization: []string{"legacy-client"}}}, ""},
		{"no names at all", &x509.Certificate{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := d.ByCert(tc.cert)
			switch {
			case tc.want == "" && ok:
				t.Errorf("ByCert = %s, want nobody", p.Name)
			case tc.want != "" && !ok:
				t.Errorf("ByCert found nobody, want %s", tc.want)
			case tc.want != "" && p.Name != tc.want:
				t.Errorf("ByCert = %s, want %s", p.Name, tc.want)
			}
		})
	}
}

func TestPrincipalRolesAndTenants(t *testing.T) {
	admin := &Principal{Name: "a", Tenants: []string{"acme"}, Roles: []Role{RoleAdmin}}
	for _, r := range Roles {
		if !admin.Has(r) {
			t.Errorf("admin.Has(%s) = false, want true", r)
		}
	}
	worker := &Principal{Name: "w", Tenants: []string{"acme", "globex"}, Roles: []Role{RoleWorker}}
	for _, r := range Roles {
		if got, want := worker.Has(r), r == RoleWorker; got != want {
			t.Errorf("worker.Has(%s) = %v, want %v", r, got, want)
		}
	}
	for tenant, want := range map[string]bool{"acme": true, "globex": true, "initech": false, "*": false, "": false} {
		if got := worker.InTenant(tenant); got != want {
			t.Errorf("worker.InTenant(%q) = %v, want %v", tenant, got, want)
		}
	}
	ops := &Principal{Name: "ops", Tenants: []string{AllTenants}, Roles: []Role{RoleReviewer}}
	for _, tenant := range []string{"acme", "globex", "default"} {
		if !ops.InTenant(tenant) {
			t.Errorf("ops (tenants [*]).InTenant(%q) = false, want true", tenant)
		}
	}
}

// writeFile replaces path and moves its modification time on, so that a
// watcher comparing times notices even on a coarse clock.
func writeFile(t *testing.T, path, content string, at time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

func fileWith(principals ...string) string {
	var entries []string
	for _, p := range principals {
		entries = append(entries, fmt.Sprintf(`{"name": %q, "tenants": ["acme"], "roles": ["reader"], "token_sha256": [%q]}`, p, HashToken(p+"-token")))
	}
	return `{"principals": [` + strings.Join(entries, ",") + `]}`
}

func TestSourceReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	if _, err := Open(path, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("Open(missing file) succeeded, want an error")
	}
	writeFile(t, path, `{"principals": [{"name": "x", "token": "plain"}]}`, time.Now())
	if _, err := Open(path, slog.New(slog.DiscardHandler)); !errors.Is(err, ErrBadFile) {
		t.Fatalf("Open(bad file) = %v, want ErrBadFile", err)
	}

	base := time.Now().Add(-time.Hour)
	writeFile(t, path, fileWith("alice"), base)
	s, err := Open(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	first := s.Directory()
	if _, ok := first.ByToken("alice-token"); !ok {
		t.Fatal("alice's token not recognized after Open")
	}

	for i, broken := range []string{``, `{"principals": [`, fileWith("alice", "alice"), `{"principals": [{"name": "bob", "token": "bob-token"}]}`} {
		writeFile(t, path, broken, base.Add(time.Duration(i+1)*time.Minute))
		if err := s.Reload(); !errors.Is(err, ErrBadFile) {
			t.Errorf("Reload(broken file %q) = %v, want ErrBadFile", broken, err)
		}
		if s.Directory() != first {
			t.Fatalf("a broken file (%q) replaced the directory in force", broken)
		}
		if _, ok := s.Directory().ByToken("alice-token"); !ok {
			t.Fatalf("alice's token stopped working after a broken file (%q)", broken)
		}
	}

	writeFile(t, path, fileWith("bob"), base.Add(time.Hour))
	if err := s.Reload(); err != nil {
		t.Fatalf("Reload(good file) = %v", err)
	}
	if _, ok := s.Directory().ByToken("bob-token"); !ok {
		t.Error("bob's token not recognized after Reload")
	}
	if _, ok := s.Directory().ByToken("alice-token"); ok {
		t.Error("alice's token still recognized after the file dropped her")
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil {
		t.Error("Reload of a removed file succeeded, want an error")
	}
	if _, ok := s.Directory().ByToken("bob-token"); !ok {
		t.Error("bob's token stopped working when the file went away")
	}
}

func TestSourceWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	base := time.Now().Add(-time.Hour)
	writeFile(t, path, fileWith("alice"), base)
	var logs testlog.Buffer
	s, err := Open(path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(ctx, 5*time.Millisecond) }()
	defer func() { cancel(); <-done }()

	eventually := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("after 5s: %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	writeFile(t, path, fileWith("alice", "bob"), base.Add(time.Minute))
	eventually("bob's token not recognized", func() bool { _, ok := s.Directory().ByToken("bob-token"); return ok })

	writeFile(t, path, `{"principals": [{"name": "carol", "token": "carol-token"}]}`, base.Add(2*time.Minute))
	eventually("no log of the broken file", func() bool { return strings.Contains(logs.String(), "does not load") })
	for _, who := range []string{"alice", "bob"} {
		if _, ok := s.Directory().ByToken(who + "-token"); !ok {
			t.Errorf("%s's token stopped working after a broken file", who)
		}
	}
	if strings.Contains(logs.String(), "carol-token") {
		t.Errorf("the log repeats a plain token from the broken file:\n%s", logs.String())
	}

	writeFile(t, path, fileWith("carol"), base.Add(3*time.Minute))
	eventually("carol's token not recognized after the file was fixed", func() bool { _, ok := s.Directory().ByToken("carol-token"); return ok })
}
