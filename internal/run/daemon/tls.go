package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/intentd/intentd/internal/core/periodic"
)

// certs holds intentd's serving certificate and client CA, reloaded from
// their files when they change or on SIGHUP, so that certificates rotate
// without a restart. A reload that fails keeps the previous pair in force.
type certs struct {
	certFile, keyFile, caFile string
	requireClientCert         bool
	log                       *slog.Logger

	cert atomic.Pointer[tls.Certificate]
	pool atomic.Pointer[x509.CertPool]

	mu     sync.Mutex
	mtimes [3]time.Time
}

func loadCerts(cfg Config, log *slog.Logger) (*certs, error) {
	c := &certs{certFile: cfg.TLSCert, keyFile: cfg.TLSKey, caFile: cfg.TLSClientCA, requireClientCert: cfg.TLSClientAuth == "require", log: log}
	return c, c.reload()
}

func (c *certs) reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("intentd: --tls-cert/--tls-key: %w", err)
	}
	var pool *x509.CertPool
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return fmt.Errorf("intentd: --tls-client-ca: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return errors.New("intentd: --tls-client-ca: no PEM certificate in the file")
		}
	}
	c.cert.Store(&pair)
	c.pool.Store(pool)
	c.mtimes = c.stat()
	return nil
}

func (c *certs) stat() [3]time.Time {
	var out [3]time.Time
	for i, f := range []string{c.certFile, c.keyFile, c.caFile} {
		if f == "" {
			continue
		}
		if st, err := os.Stat(f); err == nil {
			out[i] = st.ModTime()
		}
	}
	return out
}

// watch reloads when a file's modification time changes, until ctx ends.
func (c *certs) watch(ctx context.Context, every time.Duration) {
	periodic.Every(ctx, every, func() {
		c.mu.Lock()
		changed := c.stat() != c.mtimes
		c.mu.Unlock()
		if !changed {
			return
		}
		if err := c.reload(); err != nil {
			c.log.Error("TLS files changed but do not load; keeping the previous ones", "err", err)
			return
		}
		c.log.Info("TLS certificate reloaded", "cert", c.certFile)
	})
}

// config is the server's TLS configuration: TLS 1.2 at least, the current
// certificate, and, with a client CA, client certificates verified against
// it (required, or verified when given).
func (c *certs) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*c.cert.Load()}, NextProtos: []string{"h2"}}
			if pool := c.pool.Load(); pool != nil {
				cfg.ClientCAs = pool
				cfg.ClientAuth = tls.VerifyClientCertIfGiven
				if c.requireClientCert {
					cfg.ClientAuth = tls.RequireAndVerifyClientCert
				}
			}
			return cfg, nil
		},
	}
}

// etcdTLS is the client TLS configuration toward etcd, nil without one.
func etcdTLS(cfg Config) (*tls.Config, error) {
	if cfg.EtcdCACert == "" && cfg.EtcdCert == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.EtcdCACert != "" {
		pem, err := os.ReadFile(cfg.EtcdCACert)
		if err != nil {
			return nil, fmt.Errorf("intentd: --etcd-cacert: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("intentd: --etcd-cacert: no PEM certificate in the file")
		}
	}
	if cfg.EtcdCert != "" {
		pair, err := tls.LoadX509KeyPair(cfg.EtcdCert, cfg.EtcdKey)
		if err != nil {
			return nil, fmt.Errorf("intentd: --etcd-cert/--etcd-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}
