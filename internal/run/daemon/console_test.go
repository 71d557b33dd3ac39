package daemon_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/devcerts"
)

// TestConsoleUnderMutualTLS runs intentd as a careful operator would: TLS
// that requires client certificates, and a tokens file. The review console
// on the HTTP listener still signs a reviewer in with a bearer token and
// reads the tenant's queue: its calls go to the in-process server, which
// the certificate requirement of the network listener does not cover, and
// the guard still applies to them (another tenant is not found).
func TestConsoleUnderMutualTLS(t *testing.T) {
	dir := t.TempDir()
	pki := generate(t, filepath.Join(dir, "pki"), devcerts.Options{Clients: []string{"ops"}})
	const reviewerToken, approverToken = "console-reviewer-token-81", "console-approver-token-81"
	tokens := filepath.Join(dir, "tokens.json")
	writeTokensFile(t, tokens, tokenEntry("rev-1", "reviewer", reviewerToken), tokenEntry("appr-1", "approver", approverToken))
	cfg := testConfig(filepath.Join(dir, "data"))
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, cfg.TLSClientAuth = pki.Server.Cert, pki.Server.Key, pki.CA.Cert, "require"
	cfg.TokensFile = tokens
	cfg.MetricsListen = freeport.Addr(t)
	addr, logs := runLogged(t, cfg)
	conn := dialWith(t, addr, tlsTo(t, pki, "ops"))
	if _, err := intentv1.NewIntentServiceClient(conn).Register(bearerCall(t, approverToken), &intentv1.RegisterRequest{Key: "lamp-1", Params: params(t, 1)}); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if !strings.Contains(logs.String(), "review console serving") || !strings.Contains(logs.String(), "http://"+cfg.MetricsListen+"/console/") {
		t.Errorf("intentd's log does not give the console's URL:\n%s", logs.String())
	}

	jar, _ := cookiejar.New(nil)
	web := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	base := "http://" + cfg.MetricsListen
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := web.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, form := get("/console")
	if code != http.StatusOK || !strings.Contains(form, "Sign in") {
		t.Fatalf("GET /console: %d, want the sign-in page:\n%s", code, form)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(form)
	if csrf == nil {
		t.Fatalf("no CSRF token in the sign-in form:\n%s", form)
	}
	resp, err := web.PostForm(base+"/console/signin", url.Values{"csrf": {csrf[1]}, "token": {reviewerToken}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "Signed in as <strong>rev-1</strong>") || !strings.Contains(string(b), "Nothing waits for a reviewer") {
		t.Fatalf("after signing in: %d, want acme's (empty) queue:\n%s", resp.StatusCode, b)
	}
	if code, body := get("/console/t/acme/overview"); code != http.StatusOK || !strings.Contains(body, `<span class="n">1</span> <span class="badge state-pending">PENDING</span>`) {
		t.Errorf("overview: %d, want one PENDING intent counted:\n%s", code, body)
	}
	if code, _ := get("/console/t/globex/queue"); code != http.StatusNotFound {
		t.Errorf("another tenant's queue: %d, want 404", code)
	}
}

// TestReadmeConsoleSeed runs docs/CONSOLE.md's one command (once the
// README's) that leaves an
// UNKNOWN intent, against intentd as `go run ./cmd/intentd` starts it (no
// tokens file), and finds that intent in the console's review queue.
func TestReadmeConsoleSeed(t *testing.T) {
	root := repoRoot(t)
	needGrpcurl(t, root)
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = freeport.Addr(t)
	in := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", docBlocks(t, root, "console-seed", "docs/CONSOLE.md"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "ADDR="+in.addr)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"state": "STATE_UNKNOWN"`) {
		t.Fatalf("docs/CONSOLE.md's seed command: %v, want STATE_UNKNOWN:\n%s", err, out)
	}
	key := regexp.MustCompile(`"key": "(refund-[^"]+)"`).FindStringSubmatch(string(out))
	if key == nil {
		t.Fatalf("no key in the seed command's output:\n%s", out)
	}
	jar, _ := cookiejar.New(nil)
	resp, err := (&http.Client{Jar: jar, Timeout: 10 * time.Second}).Get("http://" + cfg.MetricsListen + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{">" + key[1] + "<", "Authentication is off", "payment provider timed out", "89.00 EUR"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the console's queue lacks %q:\n%s", want, b)
		}
	}
}
