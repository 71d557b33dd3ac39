package devcerts_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/intentd/intentd/internal/run/devcerts"
)

func generate(t *testing.T, opts devcerts.Options) *devcerts.Files {
	t.Helper()
	f, err := devcerts.Generate(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return f
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, rest := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" || len(rest) != 0 {
		t.Fatalf("%s: want exactly one CERTIFICATE block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func readKey(t *testing.T, path string) *ecdsa.PrivateKey {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		t.Fatalf("%s: want a PRIVATE KEY block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		t.Fatalf("%s: key is %T, want an ECDSA P-256 key", path, k)
	}
	return ec
}

func roots(t *testing.T, f *devcerts.Files) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(readCert(t, f.CA.Cert))
	return pool
}

var fullOptions = devcerts.Options{
	Hosts:           []string{"intentd.internal", "10.0.0.7", "localhost", "::1"},
	Clients:         []string{"ops-1", "checkout.approver"},
	ExpiredClient:   "ops-1",
	UntrustedClient: "ops-1",
}

func TestChainVerifies(t *testing.T) {
	f := generate(t, fullOptions)
	ca := readCert(t, f.CA.Cert)
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("ca.pem: IsCA %v, BasicConstraintsValid %v, KeyUsage %v; want a CA that signs certificates", ca.IsCA, ca.BasicConstraintsValid, ca.KeyUsage)
	}
	tests := []struct {
		name  string
		pair  devcerts.KeyPair
		usage x509.ExtKeyUsage
		dns   string
	}{
		{"server as localhost", f.Server, x509.ExtKeyUsageServerAuth, "localhost"},
		{"server as 127.0.0.1", f.Server, x509.ExtKeyUsageServerAuth, "127.0.0.1"},
		{"server as ::1", f.Server, x509.ExtKeyUsageServerAuth, "::1"},
		{"server as extra DNS host", f.Server, x509.ExtKeyUsageServerAuth, "intentd.internal"},
		{"server as extra IP host", f.Server, x509.ExtKeyUsageServerAuth, "10.0.0.7"},
		{"client ops-1", f.Clients["ops-1"], x509.ExtKeyUsageClientAuth, ""},
		{"client checkout.approver", f.Clients["checkout.approver"], x509.ExtKeyUsageClientAuth, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := readCert(t, tt.pair.Cert)
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots(t, f), DNSName: tt.dns, KeyUsages: []x509.ExtKeyUsage{tt.usage}}); err != nil {
				t.Errorf("Verify(%s, %v) = %v, want a chain to ca.pem", tt.dns, tt.usage, err)
			}
			key := readKey(t, tt.pair.Key)
			if !key.PublicKey.Equal(c.PublicKey) {
				t.Errorf("%s does not hold the key of %s", tt.pair.Key, tt.pair.Cert)
			}
		})
	}
}

func TestNames(t *testing.T) {
	f := generate(t, fullOptions)
	server := readCert(t, f.Server.Cert)
	if got, want := server.DNSNames, []string{"localhost", "intentd.internal"}; !slices.Equal(got, want) {
		t.Errorf("server DNS SANs = %q, want %q", got, want)
	}
	var ips []string
	for _, ip := range server.IPAddresses {
		ips = append(ips, ip.String())
	}
	if want := []string{"127.0.0.1", "::1", "10.0.0.7"}; !slices.Equal(ips, want) {
		t.Errorf("server IP SANs = %q, want %q", ips, want)
	}
	if want := []string{"localhost", "intentd.internal", "127.0.0.1", "::1", "10.0.0.7"}; !slices.Equal(f.ServerNames, want) {
		t.Errorf("Files.ServerNames = %q, want %q", f.ServerNames, want)
	}

	for _, name := range fullOptions.Clients {
		t.Run(name, func(t *testing.T) {
			pair := f.Clients[name]
			if got, want := filepath.Base(pair.Cert), "client-"+name+".pem"; got != want {
				t.Errorf("cert file = %s, want %s", got, want)
			}
			if got, want := filepath.Base(pair.Key), "client-"+name+"-key.pem"; got != want {
				t.Errorf("key file = %s, want %s", got, want)
			}
			c := readCert(t, pair.Cert)
			if c.Subject.CommonName != name {
				t.Errorf("CN = %q, want %q", c.Subject.CommonName, name)
			}
			var uris []string
			for _, u := range c.URIs {
				uris = append(uris, u.String())
			}
			if want := []string{"intentd://principal/" + name}; !slices.Equal(uris, want) {
				t.Errorf("URI SANs = %q, want %q", uris, want)
			}
			if devcerts.PrincipalURI(name) != uris[0] {
				t.Errorf("PrincipalURI(%q) = %q, want %q", name, devcerts.PrincipalURI(name), uris[0])
			}
		})
	}
}

func TestExpiredIsExpired(t *testing.T) {
	f := generate(t, fullOptions)
	if got, want := filepath.Base(f.Expired.Cert), "client-expired.pem"; got != want {
		t.Fatalf("expired cert file = %s, want %s", got, want)
	}
	c := readCert(t, f.Expired.Cert)
	if !c.NotAfter.Before(time.Now()) {
		t.Fatalf("NotAfter = %v, want in the past", c.NotAfter)
	}
	if c.Subject.CommonName != "ops-1" {
		t.Errorf("CN = %q, want ops-1 (a known principal, refused for its expiry alone)", c.Subject.CommonName)
	}
	opts := x509.VerifyOptions{Roots: roots(t, f), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	_, err := c.Verify(opts)
	var invalid x509.CertificateInvalidError
	if !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
		t.Errorf("Verify now = %v, want an Expired CertificateInvalidError", err)
	}
	opts.CurrentTime = c.NotBefore.Add(time.Hour)
	if _, err := c.Verify(opts); err != nil {
		t.Errorf("Verify within its validity = %v, want it to verify (only its dates are wrong)", err)
	}
}

func TestUntrustedDoesNotVerify(t *testing.T) {
	f := generate(t, fullOptions)
	if got, want := filepath.Base(f.Untrusted.Cert), "client-untrusted.pem"; got != want {
		t.Fatalf("untrusted cert file = %s, want %s", got, want)
	}
	c := readCert(t, f.Untrusted.Cert)
	if c.Subject.CommonName != "ops-1" {
		t.Errorf("CN = %q, want ops-1 (a real principal's name, claimed by a stranger)", c.Subject.CommonName)
	}
	_, err := c.Verify(x509.VerifyOptions{Roots: roots(t, f), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("Verify against ca.pem = %v, want an UnknownAuthorityError", err)
	}
	entries, err := os.ReadDir(f.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "ca.pem" && readsAsCA(t, filepath.Join(f.Dir, e.Name())) {
			t.Errorf("%s is a CA certificate; only ca.pem should be (the untrusted CA is written nowhere)", e.Name())
		}
	}
}

func readsAsCA(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return false
	}
	c, err := x509.ParseCertificate(block.Bytes)
	return err == nil && c.IsCA
}

func TestFileModes(t *testing.T) {
	dir := t.TempDir()
	// A key file left by someone else with a loose mode is replaced, not
	// written through.
	if err := os.WriteFile(filepath.Join(dir, "ca-key.pem"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := devcerts.Generate(dir, fullOptions)
	if err != nil {
		t.Fatal(err)
	}
	pairs := []devcerts.KeyPair{f.CA, f.Server, f.Expired, f.Untrusted}
	for _, p := range f.Clients {
		pairs = append(pairs, p)
	}
	for _, p := range pairs {
		for path, want := range map[string]os.FileMode{p.Key: 0o600, p.Cert: 0o644} {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Mode().Perm(); got != want {
				t.Errorf("%s mode = %v, want %v", filepath.Base(path), got, want)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(entries), 2*len(pairs); got != want {
		t.Errorf("%d files in %s, want %d (no temporary files left)", got, dir, want)
	}
}

func TestOptionalCertificatesOnlyWhenAsked(t *testing.T) {
	f := generate(t, devcerts.Options{})
	if f.Expired != (devcerts.KeyPair{}) || f.Untrusted != (devcerts.KeyPair{}) || len(f.Clients) != 0 {
		t.Errorf("Files = %+v, want only the CA and the server", f)
	}
	entries, err := os.ReadDir(f.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"ca-key.pem", "ca.pem", "server-key.pem", "server.pem"}; !slices.Equal(names, want) {
		t.Errorf("files = %q, want %q", names, want)
	}
}

func TestValidity(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	f := generate(t, devcerts.Options{Clients: []string{"a"}, Validity: 48 * time.Hour, Now: func() time.Time { return now }})
	server := readCert(t, f.Server.Cert)
	for _, path := range []string{f.Server.Cert, f.Clients["a"].Cert} {
		c := readCert(t, path)
		if c.NotBefore.After(now) || now.Sub(c.NotBefore) > time.Hour || c.NotAfter.Sub(c.NotBefore) != 48*time.Hour {
			t.Errorf("%s valid %v to %v, want from shortly before %v for 48h", filepath.Base(path), c.NotBefore, c.NotAfter, now)
		}
	}
	ca := readCert(t, f.CA.Cert)
	if ca.NotBefore.After(server.NotBefore) || !ca.NotAfter.Equal(server.NotAfter) {
		t.Errorf("ca.pem valid %v to %v, want to cover the server's %v to %v", ca.NotBefore, ca.NotAfter, server.NotBefore, server.NotAfter)
	}
}

func TestGenerateRefuses(t *testing.T) {
	tests := []struct {
		name string
		opts devcerts.Options
	}{
		{"reserved client expired", devcerts.Options{Clients: []string{"expired"}}},
		{"reserved client untrusted", devcerts.Options{Clients: []string{"untrusted"}}},
		{"client twice", devcerts.Options{Clients: []string{"a", "a"}}},
		{"empty client", devcerts.Options{Clients: []string{""}}},
		{"path in client", devcerts.Options{Clients: []string{"../a"}}},
		{"slash in client", devcerts.Options{Clients: []string{"a/b"}}},
		{"leading dot", devcerts.Options{Clients: []string{".a"}}},
		{"too long client", devcerts.Options{Clients: []string{string(make([]byte, 65))}}},
		{"bad expired identity", devcerts.Options{ExpiredClient: "a b"}},
		{"bad untrusted identity", devcerts.Options{UntrustedClient: "a?b"}},
		{"empty host", devcerts.Options{Hosts: []string{""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pki")
			f, err := devcerts.Generate(dir, tt.opts)
			if !errors.Is(err, devcerts.ErrInvalid) {
				t.Errorf("Generate = %+v, %v; want ErrInvalid", f, err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("stat %s = %v, want nothing written", dir, err)
			}
		})
	}
}

// handshake runs a TLS handshake over a real loopback connection and
// returns the server's error and the identity it saw.
func handshake(t *testing.T, server, client *tls.Config) (string, error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type result struct {
		cn  string
		err error
	}
	done := make(chan result, 1)
	go func() { // exits after one handshake
		conn, err := lis.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer conn.Close()
		tc := tls.Server(conn, server)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		var cn string
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			cn = certs[0].Subject.CommonName
		}
		_, err = tc.Write([]byte{1})
		done <- result{cn: cn, err: err}
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), client)
	if err == nil {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = conn.Read(make([]byte, 1))
		conn.Close()
	}
	r := <-done
	return r.cn, r.err
}

func TestTLSConfigs(t *testing.T) {
	f := generate(t, fullOptions)
	server, err := devcerts.ServerTLSConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		client string
		wantCN string
		ok     bool
	}{
		{client: "", wantCN: "", ok: true},
		{client: "ops-1", wantCN: "ops-1", ok: true},
		{client: "checkout.approver", wantCN: "checkout.approver", ok: true},
		{client: devcerts.Expired, ok: false},
		{client: devcerts.Untrusted, ok: false},
	}
	for _, tt := range tests {
		t.Run("client "+tt.client, func(t *testing.T) {
			cfg, err := devcerts.ClientTLSConfig(f, tt.client)
			if err != nil {
				t.Fatal(err)
			}
			cn, err := handshake(t, server, cfg)
			if tt.ok && (err != nil || cn != tt.wantCN) {
				t.Errorf("handshake: CN %q, %v; want CN %q, no error", cn, err, tt.wantCN)
			}
			if !tt.ok && err == nil {
				t.Errorf("handshake: CN %q, no error; want the server to refuse the certificate", cn)
			}
		})
	}
	if _, err := devcerts.ClientTLSConfig(f, "nobody"); err == nil {
		t.Error("ClientTLSConfig(nobody) = nil error, want one")
	}
	if _, err := devcerts.ClientTLSConfig(generate(t, devcerts.Options{}), devcerts.Expired); err == nil {
		t.Error("ClientTLSConfig(expired) without an expired certificate = nil error, want one")
	}
}
