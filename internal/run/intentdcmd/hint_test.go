package intentdcmd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/run/devcerts"
)

// The startup hint used to suggest `intentctl --addr [::]:7650` in secure
// mode: an address the development certificate is not valid for (it names
// 127.0.0.1 and ::1, not ::), no token although a tokens file was given,
// the README's plaintext tour, which cannot reach a TLS listener, and
// intentctl by a name a `go run` user has not built. Each case here shows
// what the hint says now.
func TestNextStepsSayWhatWorks(t *testing.T) {
	pki, err := devcerts.Generate(filepath.Join(t.TempDir(), "certs"), devcerts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	onlyDNS := selfSigned(t, "intentd.example.com")
	base := daemon.DefaultConfig()
	tls := func(c *daemon.Config) { c.TLSCert, c.TLSKey = pki.Server.Cert, pki.Server.Key }
	tokens := func(c *daemon.Config) { c.TokensFile = "tokens.json" }
	for _, tc := range []struct {
		name    string
		addr    string
		mutate  func(*daemon.Config)
		want    []string // substrings of the first line
		notWant []string
	}{
		{"plaintext", "127.0.0.1:7650", func(*daemon.Config) {},
			[]string{"serving on 127.0.0.1:7650.", "grpcurl tour in README.md", "`CTL --addr 127.0.0.1:7650 review-queue`", "http://127.0.0.1:7651/console/"},
			[]string{"TOKEN", "cacert"}},
		{"plaintext, all IPv4 interfaces", "0.0.0.0:7650", func(c *daemon.Config) { c.Insecure = true },
			[]string{"serving on 0.0.0.0:7650.", "`CTL --addr 127.0.0.1:7650 review-queue`"},
			[]string{"0.0.0.0:7650 review-queue"}},
		{"plaintext, all IPv6 interfaces", "[::]:7650", func(c *daemon.Config) { c.Insecure = true },
			[]string{"serving on [::]:7650.", "`CTL --addr [::1]:7650 review-queue`"},
			[]string{"[::]:7650 review-queue"}},
		{"console on every interface", "127.0.0.1:7650", func(c *daemon.Config) { c.MetricsListen = "[::]:7651" },
			[]string{"http://[::1]:7651/console/"}, nil},
		{"no console", "127.0.0.1:7650", func(c *daemon.Config) { c.MetricsListen = "" },
			nil, []string{"console"}},
		{"tokens, plaintext", "127.0.0.1:7650", tokens,
			[]string{"with a tokens file.", "`CTL --addr 127.0.0.1:7650 --token \"$TOKEN\" review-queue`",
				"`grpcurl -plaintext -H \"authorization: Bearer $TOKEN\" -d '{}' 127.0.0.1:7650 intent.v1.IntentService/List`", "docs/SECURITY.md (\"Running securely\")"},
			[]string{"grpcurl tour", "cacert"}},
		{"TLS", "127.0.0.1:7650", tls,
			[]string{"with TLS.", "`CTL --addr 127.0.0.1:7650 --cacert " + pki.CA.Cert + " review-queue`",
				"`grpcurl -cacert " + pki.CA.Cert + " -d '{}' 127.0.0.1:7650 intent.v1.IntentService/List`"},
			[]string{"grpcurl tour", "-plaintext", "TOKEN"}},
		{"TLS and tokens on all IPv4 interfaces", "0.0.0.0:7650", func(c *daemon.Config) { tls(c); tokens(c) },
			[]string{"serving on 0.0.0.0:7650 with TLS and a tokens file.",
				"`CTL --addr 127.0.0.1:7650 --cacert " + pki.CA.Cert + " --token \"$TOKEN\" review-queue`",
				"`grpcurl -cacert " + pki.CA.Cert + " -H \"authorization: Bearer $TOKEN\" -d '{}' 127.0.0.1:7650 intent.v1.IntentService/List`"},
			[]string{"0.0.0.0:7650 --cacert", "grpcurl tour"}},
		{"TLS and tokens on all IPv6 interfaces", "[::]:7650", func(c *daemon.Config) { tls(c); tokens(c) },
			[]string{"`CTL --addr [::1]:7650 --cacert ", "[::1]:7650 intent.v1.IntentService/List"},
			[]string{"[::]:7650 --cacert", "[::]:7650 intent.v1"}},
		{"client certificates required", "127.0.0.1:7650", func(c *daemon.Config) {
			tls(c)
			c.TLSClientCA, c.TLSClientAuth = pki.CA.Cert, "require"
		}, []string{"--cert <client.pem> --key <client-key.pem>", "-cert <client.pem> -key <client-key.pem>"}, nil},
		{"client certificates optional", "127.0.0.1:7650", func(c *daemon.Config) {
			tls(c)
			tokens(c)
			c.TLSClientCA, c.TLSClientAuth = pki.CA.Cert, "optional"
		}, nil, []string{"client.pem"}},
		{"a certificate for a name only, on all interfaces", "0.0.0.0:7650", func(c *daemon.Config) { c.TLSCert, c.TLSKey = onlyDNS, onlyDNS },
			[]string{"--addr intentd.example.com:7650 --cacert <CA of --tls-cert>"}, []string{"127.0.0.1:7650"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mutate(&cfg)
			got := steps(tc.addr, cfg, "CTL", false)
			lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "intentd: ") {
				t.Fatalf("steps = %q, want one line starting intentd: (not under go run)", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(lines[0], w) {
					t.Errorf("hint %q lacks %q", lines[0], w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(lines[0], w) {
					t.Errorf("hint %q says %q", lines[0], w)
				}
			}
		})
	}
	if got := steps("127.0.0.1:7650", base, "go run ./cmd/intentctl", true); !strings.Contains(got, "`go run ./cmd/intentctl --addr 127.0.0.1:7650 review-queue`") ||
		!strings.Contains(got, "\nintentd: started by `go run`") {
		t.Errorf("under go run: %q, want go run's intentctl and the SIGTERM note", got)
	}
}

// selfSigned writes a certificate and its key, valid for dnsName only, to
// one PEM file and returns its path.
func selfSigned(t *testing.T, dnsName string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "server.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// intentctl is named as the reader can run it: the binary built beside
// intentd, else go run's when intentd is go run's, else the PATH's, else
// go run's from a checkout.
func TestIntentctlCommand(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"intentd", "intentctl"} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	onPath := func(string) (string, error) { return "/usr/local/bin/intentctl", nil }
	notOnPath := func(string) (string, error) { return "", exec.ErrNotFound }
	for _, tc := range []struct {
		name, exe, cwd string
		lookPath       func(string) (string, error)
		want           string
	}{
		{"built into ./bin", filepath.Join(bin, "intentd"), dir, notOnPath, "./bin/intentctl"},
		{"built into ./bin, run from elsewhere", filepath.Join(bin, "intentd"), t.TempDir(), notOnPath, filepath.Join(bin, "intentctl")},
		{"go run", "/tmp/go-build3921/b001/exe/intentd", dir, onPath, "go run ./cmd/intentctl"},
		{"installed alone, intentctl on the PATH", "/opt/x/intentd", dir, onPath, "intentctl"},
		{"installed alone, no intentctl", "/opt/x/intentd", dir, notOnPath, "go run ./cmd/intentctl"},
		{"executable unknown", "", dir, onPath, "go run ./cmd/intentctl"},
	} {
		if got := intentctlCommand(tc.exe, tc.cwd, tc.lookPath); got != tc.want {
			t.Errorf("%s: intentctlCommand(%q, %q) = %q, want %q", tc.name, tc.exe, tc.cwd, got, tc.want)
		}
	}
}

// The hint is followed as a reader follows it: intentd with TLS, the
// development certificates and a tokens file, listening on every interface
// of each family; the intentctl command the hint prints, run as printed
// with $TOKEN set, reads the review queue.
func TestSecureHintWorksAsPrinted(t *testing.T) {
	dir := filepath.Dir(intentdBin)
	ctl := filepath.Join(dir, "intentctl")
	if _, err := os.Stat(ctl); err != nil {
		if out, err := exec.Command("go", "build", "-o", ctl, "../../../cmd/intentctl").CombinedOutput(); err != nil {
			t.Fatalf("go build intentctl: %v\n%s", err, out)
		}
	}
	work := t.TempDir()
	if _, err := devcerts.Generate(filepath.Join(work, "certs"), devcerts.Options{}); err != nil {
		t.Fatal(err)
	}
	const token = "hint-reviewer-token-5d1f"
	b, err := json.Marshal(access.File{Principals: []access.Entry{{Name: "rev", Tenants: []string{"acme"},
		Roles: []access.Role{access.RoleReviewer}, TokenSHA256: []string{access.HashToken(token)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "tokens.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, listen := range []string{"0.0.0.0:0", "[::]:0"} {
		t.Run(listen, func(t *testing.T) {
			if listen == "[::]:0" {
				if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
					t.Skipf("no IPv6 loopback here: %v", err)
				} else {
					l.Close()
				}
			}
			hint := startForHint(t, work, "--listen", listen, "--tls-cert", "certs/server.pem", "--tls-key", "certs/server-key.pem",
				"--tokens-file", "tokens.json")
			m := regexp.MustCompile("`([^`]*intentctl[^`]* review-queue)`").FindStringSubmatch(hint)
			if m == nil {
				t.Fatalf("hint %q shows no intentctl command", hint)
			}
			cmd := exec.Command("bash", "-c", m[1])
			cmd.Dir = work
			cmd.Env = append(os.Environ(), "TOKEN="+token)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "(no intents)") {
				t.Errorf("the hint's command %s: %v\n%s", m[1], err, out)
			}
		})
	}
}

// startForHint runs intentd with args in dir until it prints its hint,
// and returns the hint; intentd is stopped when the test ends.
func startForHint(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(intentdBin, append([]string{"--data-dir", filepath.Join(t.TempDir(), "data"), "--metrics-listen", ""}, args...)...)
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := linesOf(stderr)
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		for range lines {
		}
		_ = cmd.Wait()
	})
	timeout := time.After(60 * time.Second)
	var seen []string
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("intentd exited before its hint: %v\n%s", cmd.Wait(), strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			if strings.HasPrefix(l, "intentd: serving on ") {
				return l
			}
		case <-timeout:
			t.Fatalf("no hint within 60s:\n%s", strings.Join(seen, "\n"))
		}
	}
}

// etcd's well-known port is often taken on the machines of people who try
// intentd: an etcd of their own runs there. intentd used to listen on
// 127.0.0.1:2379 by default and failed to start with a bare "address
// already in use". Now it starts with the port held by another process,
// and the embedded etcd listens on TCP only when --embed-client-url asks;
// a port taken there names the flag.
func TestEtcdPortTakenByAnother(t *testing.T) {
	if l, err := net.Listen("tcp", "127.0.0.1:2379"); err != nil {
		// Something else holds it already: intentd must start anyway.
		t.Logf("127.0.0.1:2379 is taken by another process already (%v): starting beside it", err)
	} else {
		t.Cleanup(func() { l.Close() })
	}
	t.Run("default", func(t *testing.T) {
		hint := startForHint(t, t.TempDir(), "--listen", "127.0.0.1:0")
		if !strings.Contains(hint, "serving on 127.0.0.1:") {
			t.Errorf("hint %q", hint)
		}
	})
	t.Run("--embed-client-url on the taken port", func(t *testing.T) {
		stderr, code := runIntentd(t, nil, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(),
			"--embed-client-url", "http://127.0.0.1:2379")
		var line string // the one that says what failed
		for _, l := range strings.Split(stderr, "\n") {
			if strings.Contains(l, "address already in use") {
				line = l
			}
		}
		if code != exitFailure || !strings.HasPrefix(line, "intentd: --embed-client-url http://127.0.0.1:2379: ") {
			t.Errorf("exit %d, stderr:\n%s\nwant exit 1 and a first line naming --embed-client-url and the taken address", code, stderr)
		}
	})
}
