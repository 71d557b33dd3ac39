package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/run/devcerts"
	"github.com/intentd/intentd/internal/testing/intentdtest"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// runLogged runs intentd in-process with cfg until the test ends and
// returns its gRPC address and its log.
func runLogged(t *testing.T, cfg daemon.Config) (string, *testlog.Buffer) {
	t.Helper()
	logs := &testlog.Buffer{}
	return intentdtest.Start(t, cfg, slog.New(slog.NewTextHandler(logs, nil))).Addr, logs
}

// writeTokensFile writes a tokens file of entries to path.
func writeTokensFile(t *testing.T, path string, entries ...access.Entry) {
	t.Helper()
	b, err := json.MarshalIndent(access.File{Principals: entries}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func tokenEntry(name, role, token string) access.Entry {
	return access.Entry{Name: name, Tenants: []string{"acme"}, Roles: []access.Role{access.Role(role)}, TokenSHA256: []string{access.HashToken(token)}}
}

// dialWith connects to addr with creds; the connection closes when the
// test ends.
func dialWith(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// tlsTo returns TLS credentials from devcerts for client ("" presents no
// certificate).
func tlsTo(t *testing.T, f *devcerts.Files, client string) credentials.TransportCredentials {
	t.Helper()
	cfg, err := devcerts.ClientTLSConfig(f, client)
	if err != nil {
		t.Fatalf("devcerts.ClientTLSConfig(%q): %v", client, err)
	}
	return credentials.NewTLS(cfg)
}

// bearerCall is a call context carrying token ("" carries none).
func bearerCall(t *testing.T, token string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// reasonOf returns the ErrorInfo reason of a status error.
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// expect insists on a status code and, when not empty, an ErrorInfo
// reason.
func expect(t *testing.T, what string, err error, code codes.Code, reason string) {
	t.Helper()
	if status.Code(err) != code || (reason != "" && reasonOf(err) != reason) {
		t.Errorf("%s: %v (reason %q), want %v %s", what, err, reasonOf(err), code, reason)
	}
}

// getKey calls Get for a key nobody registered: NOT_FOUND means the call
// got past transport and guard.
func getKey(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
	_, err := intentv1.NewIntentServiceClient(conn).Get(ctx, &intentv1.GetRequest{Key: "no-such-intent"}, opts...)
	return err
}

func serialOf(t *testing.T, certFile string) *big.Int {
	t.Helper()
	b, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM block", certFile)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber
}

// replaceServerPair copies the server certificate and key of from over
// those of to, the key first: a watcher may see a mismatched pair for a
// moment, which it must refuse and retry.
func replaceServerPair(t *testing.T, from, to *devcerts.Files) {
	t.Helper()
	for _, p := range [][2]string{{from.Server.Key, to.Server.Key}, {from.Server.Cert, to.Server.Cert}} {
		b, err := os.ReadFile(p[0])
		if err != nil {
			t.Fatal(err)
		}
		tmp := p[1] + ".new"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p[1]); err != nil {
			t.Fatal(err)
		}
	}
}

// poolOf trusts the CAs of every PKI given.
func poolOf(t *testing.T, pkis ...*devcerts.Files) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	for _, f := range pkis {
		b, err := os.ReadFile(f.CA.Cert)
		if err != nil {
			t.Fatal(err)
		}
		if !pool.AppendCertsFromPEM(b) {
			t.Fatalf("%s: no certificate", f.CA.Cert)
		}
	}
	return pool
}

// servedSerial makes a new gRPC connection over TLS (trusting pool,
// presenting client when given) and returns the serial number of the
// certificate the server showed, and the call's error.
func servedSerial(t *testing.T, addr string, pool *x509.CertPool, client *tls.Certificate, token string) (*big.Int, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var p peer.Peer
	err = getKey(bearerCall(t, token), conn, grpc.Peer(&p))
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil, fmt.Errorf("no TLS peer: %v", err)
	}
	return ti.State.PeerCertificates[0].SerialNumber, err
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func generate(t *testing.T, dir string, opts devcerts.Options) *devcerts.Files {
	t.Helper()
	f, err := devcerts.Generate(dir, opts)
	if err != nil {
		t.Fatalf("devcerts.Generate: %v", err)
	}
	return f
}

// TestTLSListener runs intentd with TLS and bearer tokens (no client CA):
// a plaintext client or one that does not trust the CA is refused, a
// client trusting the CA works, health and reflection need no credentials,
// and the tokens file and the certificate reload without a restart.
func TestTLSListener(t *testing.T) {
	dir := t.TempDir()
	pki := generate(t, filepath.Join(dir, "pki"), devcerts.Options{})
	const adminToken, readerToken, lateToken = "tls-admin-token-6b1f", "tls-reader-token-02ce", "tls-late-token-9d4a"
	tokens := filepath.Join(dir, "tokens.json")
	admin, reader := tokenEntry("admin-1", "admin", adminToken), tokenEntry("reader-1", "reader", readerToken)
	writeTokensFile(t, tokens, admin, reader)
	cfg := testConfig(filepath.Join(dir, "data"))
	cfg.TLSCert, cfg.TLSKey = pki.Server.Cert, pki.Server.Key
	cfg.TokensFile = tokens
	cfg.ReloadInterval = 100 * time.Millisecond
	addr, logs := runLogged(t, cfg)
	conn := dialWith(t, addr, tlsTo(t, pki, ""))

	t.Run("plaintext client", func(t *testing.T) {
		plain := dialWith(t, addr, insecure.NewCredentials())
		expect(t, "Get over plaintext", getKey(bearerCall(t, adminToken), plain), codes.Unavailable, "")
		_, err := healthpb.NewHealthClient(plain).Check(bearerCall(t, ""), &healthpb.HealthCheckRequest{})
		expect(t, "health over plaintext", err, codes.Unavailable, "")
	})

	t.Run("client that does not trust the CA", func(t *testing.T) {
		other := generate(t, filepath.Join(dir, "other"), devcerts.Options{})
		expect(t, "Get trusting another CA", getKey(bearerCall(t, adminToken), dialWith(t, addr, tlsTo(t, other, ""))), codes.Unavailable, "")
	})

	t.Run("client trusting the CA", func(t *testing.T) {
		expect(t, "admin Get", getKey(bearerCall(t, adminToken), conn), codes.NotFound, "INTENT_NOT_FOUND")
		_, err := intentv1.NewIntentServiceClient(conn).Register(bearerCall(t, readerToken), &intentv1.RegisterRequest{Key: "k", Params: params(t, 1)})
		expect(t, "reader Register", err, codes.PermissionDenied, "PERMISSION_DENIED")
		expect(t, "Get without credentials", getKey(bearerCall(t, ""), conn), codes.Unauthenticated, "UNAUTHENTICATED")
		expect(t, "Get with a wrong token", getKey(bearerCall(t, "tls-wrong-token"), conn), codes.Unauthenticated, "UNAUTHENTICATED")
		_, err = intentv1.NewIntentServiceClient(conn).Get(bearerCall(t, ""), &intentv1.GetRequest{Key: strings.Repeat("k", 300)})
		expect(t, "an invalid Get without credentials", err, codes.Unauthenticated, "UNAUTHENTICATED")
	})

	t.Run("health and reflection without credentials", func(t *testing.T) {
		h := healthpb.NewHealthClient(conn)
		waitFor(t, "health is not SERVING", func() bool {
			resp, err := h.Check(bearerCall(t, ""), &healthpb.HealthCheckRequest{Service: intentv1.IntentService_ServiceDesc.ServiceName})
			return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(bearerCall(t, ""))
		if err != nil {
			t.Fatalf("reflection: %v", err)
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatalf("reflection Send: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection without credentials: %v", err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		if !slices.Contains(names, intentv1.IntentService_ServiceDesc.ServiceName) {
			t.Errorf("reflection lists %v, want %s among them", names, intentv1.IntentService_ServiceDesc.ServiceName)
		}
	})

	t.Run("tokens file reload", func(t *testing.T) {
		expect(t, "late's token before it is in the file", getKey(bearerCall(t, lateToken), conn), codes.Unauthenticated, "UNAUTHENTICATED")
		writeTokensFile(t, tokens, admin, reader, tokenEntry("late-1", "reader", lateToken))
		waitFor(t, "late's token still refused", func() bool {
			return status.Code(getKey(bearerCall(t, lateToken), conn)) == codes.NotFound
		})

		// A broken file (a plain token where its hash belongs) keeps the
		// principals in force.
		if err := os.WriteFile(tokens, []byte(`{"principals": [{"name": "x", "tenants": ["acme"], "roles": ["admin"], "token": "tls-plain-token-c3"}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "no log of the broken tokens file", func() bool { return strings.Contains(logs.String(), "does not load") })
		for name, token := range map[string]string{"admin": adminToken, "late": lateToken} {
			expect(t, name+" after a broken tokens file", getKey(bearerCall(t, token), conn), codes.NotFound, "INTENT_NOT_FOUND")
		}
		expect(t, "the broken file's plain token", getKey(bearerCall(t, "tls-plain-token-c3"), conn), codes.Unauthenticated, "UNAUTHENTICATED")
		writeTokensFile(t, tokens, admin, reader, tokenEntry("late-1", "reader", lateToken))
	})

	t.Run("certificate reload", func(t *testing.T) {
		next := generate(t, filepath.Join(dir, "next"), devcerts.Options{})
		old, want := serialOf(t, pki.Server.Cert), serialOf(t, next.Server.Cert)
		both := poolOf(t, pki, next)
		if got, err := servedSerial(t, addr, both, nil, adminToken); got == nil || got.Cmp(old) != 0 {
			t.Fatalf("before the reload the server shows serial %v (%v), want %v", got, err, old)
		}
		replaceServerPair(t, next, pki)
		waitFor(t, "a new connection still sees the old certificate", func() bool {
			got, _ := servedSerial(t, addr, both, nil, adminToken)
			return got != nil && got.Cmp(want) == 0
		})
		got, err := servedSerial(t, addr, poolOf(t, next), nil, adminToken)
		if got == nil || got.Cmp(want) != 0 || status.Code(err) != codes.NotFound {
			t.Errorf("trusting only the new CA: serial %v, %v; want %v and NOT_FOUND", got, err, want)
		}
		expect(t, "the connection made before the reload", getKey(bearerCall(t, adminToken), conn), codes.NotFound, "INTENT_NOT_FOUND")
	})

	out := logs.String()
	for _, secret := range []string{adminToken, readerToken, lateToken, "tls-wrong-token", "tls-plain-token-c3"} {
		if strings.Contains(out, secret) {
			t.Errorf("intentd's log contains the secret %q", secret)
		}
	}
}

// TestMutualTLS runs intentd with a client CA it requires: a client without
// a certificate, with an expired one, or with one from another CA fails
// at the handshake; a valid certificate mapped in the tokens file is that
// principal, with its role enforced; a valid one mapped to nobody is
// UNAUTHENTICATED. SIGHUP reloads the server certificate.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	pki := generate(t, filepath.Join(dir, "pki"), devcerts.Options{
		Clients: []string{"ops", "stranger"}, ExpiredClient: "ops", UntrustedClient: "ops",
	})
	const adminToken = "mtls-admin-token-5e0a"
	tokens := filepath.Join(dir, "tokens.json")
	writeTokensFile(t, tokens,
		tokenEntry("admin-1", "admin", adminToken),
		access.Entry{Name: "ops", Tenants: []string{"acme"}, Roles: []access.Role{access.RoleReader}, CertNames: []string{devcerts.PrincipalURI("ops")}},
	)
	cfg := testConfig(filepath.Join(dir, "data"))
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, cfg.TLSClientAuth = pki.Server.Cert, pki.Server.Key, pki.CA.Cert, "require"
	cfg.TokensFile = tokens
	cfg.ReloadInterval = time.Hour // only SIGHUP reloads
	addr, _ := runLogged(t, cfg)

	refused := []struct{ name, client string }{
		{"no client certificate", ""},
		{"expired client certificate", devcerts.Expired},
		{"client certificate from an untrusted CA", devcerts.Untrusted},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			conn := dialWith(t, addr, tlsTo(t, pki, tc.client))
			// Even a valid bearer token does not replace the certificate
			// the handshake requires.
			expect(t, "Get", getKey(bearerCall(t, adminToken), conn), codes.Unavailable, "")
			_, err := healthpb.NewHealthClient(conn).Check(bearerCall(t, ""), &healthpb.HealthCheckRequest{})
			expect(t, "health", err, codes.Unavailable, "")
		})
	}

	ops := dialWith(t, addr, tlsTo(t, pki, "ops"))
	t.Run("mapped certificate is its principal", func(t *testing.T) {
		c := intentv1.NewIntentServiceClient(ops)
		expect(t, "ops (reader) Get", getKey(bearerCall(t, ""), ops), codes.NotFound, "INTENT_NOT_FOUND")
		_, err := c.Register(bearerCall(t, ""), &intentv1.RegisterRequest{Key: "by-ops", Params: params(t, 1)})
		expect(t, "ops (reader) Register", err, codes.PermissionDenied, "PERMISSION_DENIED")
		_, err = c.List(bearerCall(t, ""), &intentv1.ListRequest{Tenant: "globex"})
		expect(t, "ops List in globex", err, codes.PermissionDenied, "PERMISSION_DENIED")

		// A bearer token on the same connection speaks for its own
		// principal: admin registers, and history names admin.
		reg, err := c.Register(bearerCall(t, adminToken), &intentv1.RegisterRequest{Key: "by-admin", Params: params(t, 1)})
		if err != nil {
			t.Fatalf("admin Register over ops's connection: %v", err)
		}
		got, err := c.Get(bearerCall(t, ""), &intentv1.GetRequest{Key: "by-admin"})
		if err != nil || got.GetIntent().GetRevision() != reg.GetIntent().GetRevision() {
			t.Fatalf("ops Get(by-admin) = %v, %v", got.GetIntent(), err)
		}
		if h := got.GetIntent().GetHistory(); len(h) == 0 || h[0].GetPrincipal() != "admin-1" {
			t.Errorf("history of by-admin: %v, want the registration by admin-1", h)
		}
	})

	t.Run("unmapped certificate", func(t *testing.T) {
		conn := dialWith(t, addr, tlsTo(t, pki, "stranger"))
		expect(t, "stranger Get", getKey(bearerCall(t, ""), conn), codes.Unauthenticated, "UNAUTHENTICATED")
		_, err := healthpb.NewHealthClient(conn).Check(bearerCall(t, ""), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Errorf("stranger health check: %v, want it open", err)
		}
	})

	t.Run("SIGHUP reloads the certificate", func(t *testing.T) {
		// Catch SIGHUP here too, so that a signal arriving before intentd
		// listens for it cannot end the test binary. This stays registered.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		next := generate(t, filepath.Join(dir, "next"), devcerts.Options{})
		want := serialOf(t, next.Server.Cert)
		pair, err := tls.LoadX509KeyPair(pki.Clients["ops"].Cert, pki.Clients["ops"].Key)
		if err != nil {
			t.Fatal(err)
		}
		both := poolOf(t, pki, next)
		replaceServerPair(t, next, pki)
		time.Sleep(300 * time.Millisecond)
		if got, _ := servedSerial(t, addr, both, &pair, ""); got == nil || got.Cmp(want) == 0 {
			t.Fatalf("serial %v before SIGHUP, want the old certificate still (reload interval 1h)", got)
		}
		waitFor(t, "a new connection still sees the old certificate after SIGHUP", func() bool {
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			got, _ := servedSerial(t, addr, both, &pair, "")
			return got != nil && got.Cmp(want) == 0
		})
		got, err := servedSerial(t, addr, poolOf(t, next), &pair, "")
		if got == nil || got.Cmp(want) != 0 || status.Code(err) != codes.NotFound {
			t.Errorf("after SIGHUP, trusting only the new CA: serial %v, %v; want %v and NOT_FOUND as ops", got, err, want)
		}
	})
}

// TestOptionalClientCertificates runs intentd with --tls-client-auth
// optional: a client without a certificate authenticates by bearer token,
// a valid mapped certificate needs no token, and a certificate that does not
// verify still fails the handshake.
func TestOptionalClientCertificates(t *testing.T) {
	dir := t.TempDir()
	pki := generate(t, filepath.Join(dir, "pki"), devcerts.Options{Clients: []string{"ops"}, ExpiredClient: "ops", UntrustedClient: "ops"})
	const token = "optional-reader-token-71aa"
	tokens := filepath.Join(dir, "tokens.json")
	writeTokensFile(t, tokens,
		tokenEntry("reader-1", "reader", token),
		access.Entry{Name: "ops", Tenants: []string{"acme"}, Roles: []access.Role{access.RoleReader}, CertNames: []string{devcerts.PrincipalURI("ops")}},
	)
	cfg := testConfig(filepath.Join(dir, "data"))
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, cfg.TLSClientAuth = pki.Server.Cert, pki.Server.Key, pki.CA.Cert, "optional"
	cfg.TokensFile = tokens
	addr, _ := runLogged(t, cfg)

	noCert := dialWith(t, addr, tlsTo(t, pki, ""))
	expect(t, "no certificate, bearer token", getKey(bearerCall(t, token), noCert), codes.NotFound, "INTENT_NOT_FOUND")
	expect(t, "no certificate, no token", getKey(bearerCall(t, ""), noCert), codes.Unauthenticated, "UNAUTHENTICATED")
	expect(t, "ops certificate", getKey(bearerCall(t, ""), dialWith(t, addr, tlsTo(t, pki, "ops"))), codes.NotFound, "INTENT_NOT_FOUND")
	for _, client := range []string{devcerts.Expired, devcerts.Untrusted} {
		expect(t, client+" certificate with a valid token", getKey(bearerCall(t, token), dialWith(t, addr, tlsTo(t, pki, client))), codes.Unavailable, "")
	}
}

// TestListenRequiresTLSOrInsecure: plaintext on an address others can
// reach needs --insecure; the refusal names --listen, and Run refuses
// before it starts anything.
func TestListenRequiresTLSOrInsecure(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*daemon.Config)
		wantErr string // empty: valid
	}{
		{"all interfaces, plaintext", func(c *daemon.Config) { c.Listen = "0.0.0.0:7650" }, "--listen 0.0.0.0:7650"},
		{"all IPv6 interfaces, plaintext", func(c *daemon.Config) { c.Listen = "[::]:7650" }, "--listen [::]:7650"},
		{"no host, plaintext", func(c *daemon.Config) { c.Listen = ":7650" }, "--listen :7650"},
		{"a LAN address, plaintext", func(c *daemon.Config) { c.Listen = "10.1.2.3:7650" }, "--listen 10.1.2.3:7650"},
		{"a host name, plaintext", func(c *daemon.Config) { c.Listen = "intentd.internal:7650" }, "--listen intentd.internal:7650"},
		{"all interfaces with --insecure", func(c *daemon.Config) { c.Listen = "0.0.0.0:7650"; c.Insecure = true }, ""},
		{"all interfaces with TLS and tokens", func(c *daemon.Config) {
			c.Listen, c.TLSCert, c.TLSKey, c.TokensFile = "0.0.0.0:7650", "s.pem", "s-key.pem", "tokens.json"
		}, ""},
		{"all interfaces with TLS but no tokens file", func(c *daemon.Config) {
			c.Listen, c.TLSCert, c.TLSKey = "0.0.0.0:7650", "s.pem", "s-key.pem"
		}, "--tokens-file"},
		{"loopback IPv4", func(c *daemon.Config) { c.Listen = "127.0.0.1:7650" }, ""},
		{"loopback IPv6", func(c *daemon.Config) { c.Listen = "[::1]:7650" }, ""},
		{"localhost", func(c *daemon.Config) { c.Listen = "localhost:7650" }, ""},
		{"certificate without key", func(c *daemon.Config) { c.TLSCert = "s.pem" }, "--tls-cert and --tls-key"},
		{"client CA without TLS", func(c *daemon.Config) { c.TLSClientCA = "ca.pem" }, "--tls-client-ca"},
		{"client auth neither require nor optional", func(c *daemon.Config) { c.TLSClientAuth = "maybe" }, "--tls-client-auth"},
		{"etcd certificate without key", func(c *daemon.Config) { c.EtcdCert = "e.pem" }, "--etcd-cert and --etcd-key"},
		{"negative rate", func(c *daemon.Config) { c.RatePerTenant = -1 }, "--rate-"},
		{"message size below 64 KiB", func(c *daemon.Config) { c.MaxRecvMsgSize = 1000 }, "--max-recv-msg-size"},
		{"zero reload interval", func(c *daemon.Config) { c.ReloadInterval = 0 }, "--reload-interval"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := daemon.DefaultConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}

	t.Run("Run serves plaintext on all interfaces with --insecure", func(t *testing.T) {
		cfg := testConfig(t.TempDir())
		cfg.Listen, cfg.Insecure = "0.0.0.0:0", true
		addr, logs := runLogged(t, cfg)
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		conn := dialWith(t, net.JoinHostPort("127.0.0.1", port), insecure.NewCredentials())
		if _, err := healthpb.NewHealthClient(conn).Check(bearerCall(t, ""), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health over plaintext with --insecure: %v", err)
		}
		if out := logs.String(); !strings.Contains(out, "serving plaintext gRPC") || !strings.Contains(out, "loopback_only=false") {
			t.Errorf("intentd did not say it serves plaintext beyond loopback:\n%s", out)
		}
	})

	t.Run("Run refuses at once", func(t *testing.T) {
		cfg := testConfig(t.TempDir())
		cfg.Listen = "0.0.0.0:0"
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := daemon.Run(ctx, cfg, slog.New(slog.DiscardHandler), func(string) { t.Error("intentd served plaintext on 0.0.0.0") })
		if err == nil || !strings.Contains(err.Error(), "--listen 0.0.0.0:0") {
			t.Fatalf("Run = %v, want a refusal naming --listen", err)
		}
	})
}
