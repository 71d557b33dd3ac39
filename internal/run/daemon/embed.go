package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/intentd/intentd/internal/run/embedetcd"
	"github.com/intentd/intentd/internal/run/netaddr"
)

// The embedded etcd's defaults, sized in docs/OPERATIONS.md ("Sizing the
// embedded store") from what a retained intent measures.
const (
	// DefaultEmbedQuotaBytes is the largest backend etcd recommends: the
	// bbolt file is memory-mapped, and a start, a snapshot or a
	// defragmentation reads all of it.
	DefaultEmbedQuotaBytes = 8 << 30
	// minEmbedQuotaBytes keeps a quota from refusing the first writes.
	minEmbedQuotaBytes = 1 << 20
	// DefaultEmbedCompactionRetention is the history the embedded etcd
	// keeps, as Kubernetes keeps it (its API server compacts every 5
	// minutes): a Watch resumes from any revision of the last 5 minutes
	// (older ones answer REVISION_COMPACTED: list again, then watch), and
	// a paginated List's pages stay readable for as long.
	DefaultEmbedCompactionRetention = "5m"
	// embedRaftCatchUpEntries is how many applied raft entries the
	// embedded etcd keeps in memory behind its last in-memory snapshot
	// (etcd takes one every 100 entries), for a slow follower to catch up
	// from. The embedded etcd is a single member and has no follower, so
	// they serve nothing; etcd's default keeps 5,000, and with group
	// commit an entry is a whole batch of transitions (up to 128 records),
	// so 5,000 of them held a large part of the heap at high concurrency,
	// and 100 hold little (see docs/PERFORMANCE.md, "What the heap held");
	// it costs nothing else (no snapshot is taken more often).
	embedRaftCatchUpEntries = 100
)

// Compaction is how much history an etcd keeps, in etcd's terms: Mode
// "periodic" keeps Retention (a Go duration, at least 100ms) of
// revisions, compacting every Retention (so between one and two
// Retentions are kept); Mode "revision" keeps the last Retention (a count)
// revisions, compacting every 5 minutes.
type Compaction struct {
	Mode      string
	Retention string
}

func (c Compaction) validate() error {
	switch c.Mode {
	case "periodic":
		d, err := time.ParseDuration(c.Retention)
		if err != nil || d < 100*time.Millisecond {
			return fmt.Errorf("--embed-compaction-retention %q: with --embed-compaction-mode periodic, want a duration of at least 100ms (default %s)", c.Retention, DefaultEmbedCompactionRetention)
		}
	case "revision":
		n, err := strconv.ParseInt(c.Retention, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("--embed-compaction-retention %q: with --embed-compaction-mode revision, want a positive number of revisions", c.Retention)
		}
	default:
		return fmt.Errorf("--embed-compaction-mode %q: want periodic or revision", c.Mode)
	}
	return nil
}

// EmbedSocket is the unix socket the embedded etcd serves clients on, in
// every mode: <data-dir>/etcd.sock, mode 0600 in a 0700 directory, so that
// only intentd's user (and root) can reach it — the same users who can
// read the etcd data files anyway.
func (c Config) EmbedSocket() string {
	dir, err := filepath.Abs(c.DataDir)
	if err != nil {
		dir = c.DataDir
	}
	return filepath.Join(dir, "etcd.sock")
}

// maxSocketPath is what fits in sockaddr_un.sun_path on Linux, with its
// terminating NUL.
const maxSocketPath = 107

// embedTCP reports whether the embedded etcd also listens on
// EmbedClientURL: only when one is given (--embed-client-url) and intentd
// runs without credentials. With TLS or a tokens file, a TCP listener
// without authentication would let any local process read and write every
// record around intentd's checks.
func (c Config) embedTCP() bool {
	return c.EmbedClientURL != "" && !c.TLS() && c.TokensFile == ""
}

// validateEmbedded checks the embedded etcd's flags.
func (c Config) validateEmbedded() []error {
	var errs []error
	for flag, u := range map[string]string{"--embed-client-url": c.EmbedClientURL, "--embed-peer-url": c.EmbedPeerURL} {
		if flag == "--embed-client-url" && u == "" {
			continue // no TCP listener: the unix socket only
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Scheme != "http" || !netaddr.Loopback(pu.Host) || (pu.Path != "" && pu.Path != "/") {
			errs = append(errs, fmt.Errorf("%s %q: want http://host:port with a loopback host (127.0.0.1, [::1] or localhost): the embedded etcd has no authentication of its own", flag, u))
		}
	}
	if c.DataDir != "" && len(c.EmbedSocket()) > maxSocketPath {
		errs = append(errs, fmt.Errorf("--data-dir %s: too long for the embedded etcd's unix socket %s (at most %d bytes)", c.DataDir, c.EmbedSocket(), maxSocketPath))
	}
	if c.EmbedQuotaBytes < minEmbedQuotaBytes || c.EmbedQuotaBytes > DefaultEmbedQuotaBytes {
		errs = append(errs, fmt.Errorf("--embed-quota-bytes %d: want %d (1 MiB) to %d (8 GiB, the most etcd recommends; beyond, use an external cluster)", c.EmbedQuotaBytes, minEmbedQuotaBytes, DefaultEmbedQuotaBytes))
	}
	if err := c.EmbedCompaction.validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// startEmbedded starts the single-member embedded etcd on cfg.DataDir. It
// serves clients on EmbedSocket, and on EmbedClientURL too when embedTCP.
// It opens no peer listener: a single member has no peer to talk to, and
// an unauthenticated raft port would take forged messages. EmbedPeerURL is
// only the URL the member is registered under.
func startEmbedded(cfg Config, log *slog.Logger) (*embed.Etcd, error) {
	if err := privateDir(cfg.DataDir, log); err != nil {
		return nil, err
	}
	pu, _ := url.Parse(cfg.EmbedPeerURL)
	ec := embedetcd.Config("intentd", filepath.Join(cfg.DataDir, "etcd"), *pu)
	sock := url.URL{Scheme: "unix", Path: cfg.EmbedSocket()}
	// etcd removes a socket file before it listens: a second intentd on
	// the same data directory would take the socket from the first one.
	if c, err := net.DialTimeout("unix", sock.Path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("intentd: --data-dir %s is in use: an etcd already answers on %s (another intentd?); stop that one, or give this one another --data-dir", cfg.DataDir, sock.Path)
	}
	ec.ListenClientUrls = []url.URL{sock}
	if cfg.embedTCP() {
		cu, _ := url.Parse(cfg.EmbedClientURL)
		ec.ListenClientUrls = append(ec.ListenClientUrls, *cu)
	}
	ec.AdvertiseClientUrls = []url.URL{sock}
	ec.ListenPeerUrls = nil // a single member: no peer listener (see above)
	ec.QuotaBackendBytes = cfg.EmbedQuotaBytes
	ec.AutoCompactionMode = cfg.EmbedCompaction.Mode
	ec.AutoCompactionRetention = cfg.EmbedCompaction.Retention
	ec.SnapshotCatchUpEntries = embedRaftCatchUpEntries
	e, err := embed.StartEtcd(ec)
	if err != nil {
		// etcd's own words would be a bare "address already in use".
		if cfg.embedTCP() && errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("intentd: --embed-client-url %s: %w (another etcd?); give another port, or leave --embed-client-url empty: the embedded etcd serves %s anyway", cfg.EmbedClientURL, err, sock.Path)
		}
		return nil, fmt.Errorf("intentd: start embedded etcd in %s: %w", ec.Dir, err)
	}
	// The directory is private already; the socket's own mode keeps it so
	// if the directory is opened up later.
	if err := os.Chmod(sock.Path, 0o600); err != nil {
		e.Close()
		return nil, fmt.Errorf("intentd: embedded etcd socket %s: %w", sock.Path, err)
	}
	if err := embedetcd.WaitReady(e, cfg.DialTimeout+30*time.Second); err != nil {
		return nil, fmt.Errorf("intentd: embedded etcd: %w", err)
	}
	attrs := []any{"dir", ec.Dir, "socket", sock.Path, "quota_bytes", cfg.EmbedQuotaBytes,
		"compaction", cfg.EmbedCompaction.Mode + " " + cfg.EmbedCompaction.Retention}
	switch {
	case cfg.embedTCP():
		for _, l := range e.Clients {
			if l.Addr().Network() == "tcp" {
				attrs = append(attrs, "client_url", "http://"+l.Addr().String())
			}
		}
	case cfg.EmbedClientURL == "":
		attrs = append(attrs, "client_url", "none: no --embed-client-url, so its etcd is reachable through the socket only")
	default:
		attrs = append(attrs, "client_url", "none: intentd runs with credentials (TLS or a tokens file), so --embed-client-url is not served and its etcd is reachable through the socket only")
	}
	log.Info("embedded etcd ready", attrs...)
	return e, nil
}

// privateDir creates dir, or narrows it, to mode 0700: it holds the etcd
// data and the socket, which are worth as much as intentd's credentials.
func privateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("intentd: --data-dir %s: %w", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("intentd: --data-dir %s: %w", dir, err)
	}
	if fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("intentd: --data-dir %s is open to other users (%v) and cannot be made private: %w", dir, fi.Mode().Perm(), err)
	}
	log.Warn("made --data-dir private (0700): it holds the embedded etcd's data and socket", "dir", dir, "was", fi.Mode().Perm().String())
	return nil
}
