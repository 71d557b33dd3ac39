package intentdcmd

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gatewayConfig writes a gateway config file of yaml and returns its path.
func gatewayConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const goodUpstreams = `
upstreams:
  courier:
    url: http://127.0.0.1:9
    timeout: 5s
    lookup:
      path: /pickups?reference={operation_key}
`

// A bad config stops `intentd gateway` at start with exit status 2 and one
// line naming the key, flag or variable, then the usage hint.
func TestGatewayBadConfigNamesTheKey(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		yaml      string // "" : no --config
		args      []string
		wantFirst string
	}{
		{"no config", nil, "", nil, "intentd: --config is required: its upstreams key names the upstreams"},
		{"no upstreams", nil, "listen: 127.0.0.1:0\n", nil, `key "upstreams" is missing`},
		{"an unknown top-level key", nil, "lisen: 127.0.0.1:0\n" + goodUpstreams, nil, `key "lisen": unknown key; the keys are the gateway's flag names, e.g. listen, and upstreams`},
		{"a bad upstream key", nil, "upstreams:\n  courier:\n    url: http://127.0.0.1:9\n    timeout: 99m\n", nil, "upstreams.courier.timeout: 1h39m0s is outside (0, 10m0s]"},
		{"an upstream without url", nil, "upstreams:\n  courier: {timeout: 1s}\n", nil, "upstreams.courier.url: required"},
		{"a bad flag value in the file", nil, "record-grace: soon\n" + goodUpstreams, nil, `key "record-grace"`},
		{"a bad environment variable", []string{"INTENTD_GATEWAY_CALL_TIMEOUT=soon"}, goodUpstreams, nil, `INTENTD_GATEWAY_CALL_TIMEOUT (--call-timeout) "soon"`},
		{"plaintext off loopback", nil, goodUpstreams, []string{"--listen", "10.0.0.1:7660"}, "--listen 10.0.0.1:7660 is not a loopback address"},
		{"a stray argument", nil, goodUpstreams, []string{"now"}, `unexpected argument "now"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"gateway"}, tc.args...)
			if tc.yaml != "" {
				args = append(args, "--config", gatewayConfig(t, tc.yaml))
			}
			stderr, code := runIntentd(t, tc.env, args...)
			if code != exitUsage {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitUsage, stderr)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if !strings.Contains(lines[0], tc.wantFirst) {
				t.Errorf("first line %q, want it to say %q", lines[0], tc.wantFirst)
			}
			if len(lines) != 2 || lines[1] != "Run 'intentd gateway --help' for usage." {
				t.Errorf("stderr %q, want the error and the gateway's usage hint", lines)
			}
		})
	}
}

// `intentd gateway` serves: health, readiness (not ready while intentd
// does not answer), metrics; SIGTERM stops it cleanly.
func TestGatewayServesAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, intentdBin, "gateway", "--config", gatewayConfig(t, goodUpstreams), "--listen", "127.0.0.1:0", "--intentd", "127.0.0.1:1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	addr := ""
	for addr == "" && lines.Scan() {
		if m := regexp.MustCompile(`intentd gateway serving"? addr=(\S+)`).FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatal("the gateway never said where it serves")
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "intentd") {
		t.Errorf("/readyz %d %q, want 503 naming intentd", code, body)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `intentd_gateway_submissions_total{outcome="forwarded",upstream="courier"} 0`) {
		t.Errorf("/metrics %d lacks the submissions series", code)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v, want exit 0", err)
	}
}
