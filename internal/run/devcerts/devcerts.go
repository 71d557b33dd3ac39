// Package devcerts writes a development PKI for intentd: a CA, a server
// certificate for loopback, and client certificates whose identity the
// tokens file maps to principals (the subject CN and the URI SAN
// intentd://principal/<name>). For tests it can also write a client
// certificate that has already expired and one signed by a CA nobody
// trusts.
//
// What it does not guarantee: these certificates are for development and
// tests. The CA key is written next to the certificates, nothing is ever
// revoked, and every run makes a new CA, so certificates of an earlier run
// stop verifying against the new ca.pem. Production certificates come from
// a real PKI.
package devcerts

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Reserved client names: they name the test certificates' files
// (client-expired.pem, client-untrusted.pem), so no ordinary client may
// take them.
const (
	Expired   = "expired"
	Untrusted = "untrusted"
)

// DefaultValidity is how long certificates are valid unless Options say
// otherwise.
const DefaultValidity = 365 * 24 * time.Hour

// PrincipalURI returns the URI SAN a client certificate for name carries,
// "intentd://principal/<name>": the identity a tokens file entry lists in
// cert_names.
func PrincipalURI(name string) string {
	return principalURL(name).String()
}

func principalURL(name string) *url.URL {
	return &url.URL{Scheme: "intentd", Host: "principal", Path: "/" + name}
}

// Options say what Generate writes besides the CA and the server
// certificate.
type Options struct {
	// Hosts are extra server names: DNS names or IP addresses, added to
	// localhost, 127.0.0.1 and ::1.
	Hosts []string
	// Clients are principal names, one client certificate each:
	// client-<name>.pem. A name is 1 to 64 ASCII letters, digits, '.', '_'
	// or '-', and neither "expired" nor "untrusted".
	Clients []string
	// ExpiredClient, when set, is the identity of client-expired.pem, a
	// client certificate signed by the CA whose NotAfter is in the past.
	ExpiredClient string
	// UntrustedClient, when set, is the identity of client-untrusted.pem,
	// a client certificate signed by a second CA that is written nowhere:
	// it claims a real principal's name, and must not be believed.
	UntrustedClient string
	// Validity is how long the server and client certificates are valid,
	// from a few minutes before now; zero means DefaultValidity. The CA's
	// validity starts three days earlier and ends with theirs.
	Validity time.Duration
	// Now is the clock certificates are dated by; nil means time.Now.
	Now func() time.Time
}

// KeyPair names a certificate file and its key file.
type KeyPair struct {
	Cert string
	Key  string
}

// Files are the paths Generate wrote.
type Files struct {
	// Dir is the directory everything was written to.
	Dir string
	// CA is ca.pem and ca-key.pem.
	CA KeyPair
	// Server is server.pem and server-key.pem.
	Server KeyPair
	// Clients maps each client name to client-<name>.pem and
	// client-<name>-key.pem.
	Clients map[string]KeyPair
	// Expired and Untrusted are the test certificates; zero when not
	// asked for.
	Expired   KeyPair
	Untrusted KeyPair
	// ServerNames are the server certificate's SANs.
	ServerNames []string
}

// ErrInvalid marks options Generate refuses.
var ErrInvalid = errors.New("devcerts: invalid options")

// Generate writes a development PKI into dir (created 0700 if missing),
// replacing files of an earlier run: certificates mode 0644, keys mode 0600.
// Keys are ECDSA P-256.
func Generate(dir string, opts Options) (*Files, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	validity := opts.Validity
	if validity <= 0 {
		validity = DefaultValidity
	}
	// Backdate a little: a peer whose clock is slightly behind still
	// accepts a certificate made a moment ago.
	notBefore := now().Add(-5 * time.Minute).Truncate(time.Second)
	notAfter := notBefore.Add(validity)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devcerts: %w", err)
	}
	f := &Files{Dir: dir, Clients: map[string]KeyPair{}}
	w := writer{dir: dir}

	// The CA predates the expired certificate, which it signed while both
	// were valid: that certificate is refused for its dates alone.
	caNotBefore := notBefore.Add(-72 * time.Hour)
	ca, err := newCA("intentd development CA", caNotBefore, notAfter)
	if err != nil {
		return nil, err
	}
	if f.CA, err = w.pair("ca", ca.der, ca.key); err != nil {
		return nil, err
	}

	dns, ips := serverNames(opts.Hosts)
	f.ServerNames = append(f.ServerNames, dns...)
	for _, ip := range ips {
		f.ServerNames = append(f.ServerNames, ip.String())
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "intentd"},
		DNSNames:    dns,
		IPAddresses: ips,
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if f.Server, err = w.leaf("server", server, ca); err != nil {
		return nil, err
	}

	for _, name := range opts.Clients {
		if f.Clients[name], err = w.leaf("client-"+name, clientTemplate(name, notBefore, notAfter), ca); err != nil {
			return nil, err
		}
	}
	if opts.ExpiredClient != "" {
		past := notBefore.Add(-48 * time.Hour)
		if f.Expired, err = w.leaf("client-"+Expired, clientTemplate(opts.ExpiredClient, past, past.Add(24*time.Hour)), ca); err != nil {
			return nil, err
		}
	}
	if opts.UntrustedClient != "" {
		other, err := newCA("intentd untrusted CA", caNotBefore, notAfter)
		if err != nil {
			return nil, err
		}
		if f.Untrusted, err = w.leaf("client-"+Untrusted, clientTemplate(opts.UntrustedClient, notBefore, notAfter), other); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (o Options) validate() error {
	var errs []error
	seen := map[string]bool{}
	for _, name := range o.Clients {
		if err := checkName("client", name); err != nil {
			errs = append(errs, err)
		}
		if name == Expired || name == Untrusted {
			errs = append(errs, fmt.Errorf("%w: client %q is reserved for a test certificate's file name", ErrInvalid, name))
		}
		if seen[name] {
			errs = append(errs, fmt.Errorf("%w: client %q given twice", ErrInvalid, name))
		}
		seen[name] = true
	}
	for field, name := range map[string]string{"expired client": o.ExpiredClient, "untrusted client": o.UntrustedClient} {
		if name != "" {
			errs = append(errs, checkName(field, name))
		}
	}
	for _, h := range o.Hosts {
		if h == "" || len(h) > 253 {
			errs = append(errs, fmt.Errorf("%w: host %q: want a DNS name or an IP address", ErrInvalid, h))
		}
	}
	return errors.Join(errs...)
}

// checkName keeps names safe in a file name and a URI path.
func checkName(field, name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("%w: %s %q: want 1 to 64 characters", ErrInvalid, field, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || c == '-' || c == '_' || c == '.'
		if !ok || (i == 0 && c == '.') {
			return fmt.Errorf("%w: %s %q: use ASCII letters, digits, '.', '_' and '-' (not a leading '.')", ErrInvalid, field, name)
		}
	}
	return nil
}

// serverNames splits the server's names into DNS names and IP addresses,
// loopback first, without duplicates.
func serverNames(hosts []string) ([]string, []net.IP) {
	dns := []string{"localhost"}
	ips := []net.IP{net.IPv4(127, 0, 0, 1).To4(), net.IPv6loopback}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if v4 := ip.To4(); v4 != nil {
				ip = v4
			}
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
			continue
		}
		if !slices.Contains(dns, h) {
			dns = append(dns, h)
		}
	}
	return dns, ips
}

func clientTemplate(name string, notBefore, notAfter time.Time) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		URIs:        []*url.URL{principalURL(name)},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// authority is a CA that signs leaves.
type authority struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func newCA(name string, notBefore, notAfter time.Time) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devcerts: key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("devcerts: %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("devcerts: %s: %w", name, err)
	}
	return &authority{cert: cert, der: der, key: key}, nil
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("devcerts: serial number: %w", err)
	}
	return n, nil
}

// writer writes PEM files into one directory.
type writer struct{ dir string }

// leaf makes a key, has ca sign tmpl for it, and writes both as
// <base>.pem and <base>-key.pem.
func (w writer) leaf(base string, tmpl *x509.Certificate, ca *authority) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("devcerts: key: %w", err)
	}
	if tmpl.SerialNumber, err = serialNumber(); err != nil {
		return KeyPair{}, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("devcerts: %s: %w", base, err)
	}
	return w.pair(base, der, key)
}

func (w writer) pair(base string, der []byte, key crypto.Signer) (KeyPair, error) {
	p := KeyPair{Cert: filepath.Join(w.dir, base+".pem"), Key: filepath.Join(w.dir, base+"-key.pem")}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("devcerts: %s key: %w", base, err)
	}
	if err := writeFile(p.Key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return KeyPair{}, err
	}
	if err := writeFile(p.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return KeyPair{}, err
	}
	return p, nil
}

// writeFile replaces path with data at mode. It writes a temporary file
// created with mode 0600 and renames it into place, so a key is never
// readable by others, not even for a moment and not when an earlier file
// with a looser mode was there.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("devcerts: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("devcerts: write %s: %w", path, err)
	}
	return nil
}

// ServerTLSConfig returns a TLS configuration for an intentd in tests:
// the server certificate, and client certificates verified against the CA
// when a client presents one (a client may authenticate by bearer token
// instead). TLS 1.3 only.
func ServerTLSConfig(f *Files) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.Server.Cert, f.Server.Key)
	if err != nil {
		return nil, fmt.Errorf("devcerts: server key pair: %w", err)
	}
	pool, err := caPool(f)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// ClientTLSConfig returns a TLS configuration that trusts the CA and, when
// client is not empty, presents that client's certificate, even to a
// server that lists other CAs as acceptable. client is a name from
// Options.Clients, or Expired or Untrusted for the test certificates.
func ClientTLSConfig(f *Files, client string) (*tls.Config, error) {
	pool, err := caPool(f)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	if client == "" {
		return cfg, nil
	}
	p, ok := f.Clients[client]
	switch {
	case ok:
	case client == Expired && f.Expired.Cert != "":
		p = f.Expired
	case client == Untrusted && f.Untrusted.Cert != "":
		p = f.Untrusted
	default:
		return nil, fmt.Errorf("devcerts: no client certificate %q in %s", client, f.Dir)
	}
	cert, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		return nil, fmt.Errorf("devcerts: client %q key pair: %w", client, err)
	}
	// Present the certificate whatever CAs the server says it accepts: a
	// test of an untrusted certificate must reach the server's check.
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return cfg, nil
}

func caPool(f *Files) (*x509.CertPool, error) {
	b, err := os.ReadFile(f.CA.Cert)
	if err != nil {
		return nil, fmt.Errorf("devcerts: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("devcerts: %s holds no certificate", f.CA.Cert)
	}
	return pool, nil
}
