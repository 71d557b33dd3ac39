package reliability

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/testlog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ClusterConfig shapes an etcd cluster for a test.
type ClusterConfig struct {
	// Members is the cluster size (default 3).
	Members int
	// Heartbeat and Election are etcd's raft timings, short so that a
	// lost leader is replaced within a second (default 50ms and 500ms).
	Heartbeat, Election time.Duration
	// PeerProxies puts a peer proxy in front of every member's peer port
	// too, so that members can be partitioned from each other
	// (Cluster.Partition). Off, peers talk directly.
	PeerProxies bool
}

// Cluster is an etcd cluster of bin/etcd processes on loopback. Clients
// reach each member through its Proxy; peers talk directly, or with
// ClusterConfig.PeerProxies through each member's PeerProxy.
type Cluster struct {
	t       testing.TB
	bin     string
	cfg     ClusterConfig
	Members []*Member
}

// Member is one etcd process of a Cluster: its name, data directory (kept
// across restarts), its real client URL and the proxy in front of it.
type Member struct {
	Name      string
	DataDir   string
	ClientURL string // the member's own client URL (tests and Status only)
	// PeerURL is the peer URL the member advertises (its PeerProxy's when
	// there is one); peerListen is where it listens.
	PeerURL    string
	peerListen string
	// Proxy is what clients of the cluster connect to instead of ClientURL.
	Proxy *harness.Proxy
	// PeerProxy, with ClusterConfig.PeerProxies, is what the other members
	// connect to instead of the member's peer port.
	PeerProxy *harness.Proxy

	c    *Cluster
	args []string
	logs *testlog.Lines

	mu      sync.Mutex
	proc    *harness.Process
	stopped bool // SIGSTOPped
	id      uint64
}

// StartCluster starts a cluster of etcd processes from bin, each with its
// data in a fresh t.TempDir() and its client port behind a Proxy, and waits
// until it has a leader. Everything stops when the test ends.
func StartCluster(t testing.TB, bin string, cfg ClusterConfig) *Cluster {
	t.Helper()
	if cfg.Members == 0 {
		cfg.Members = 3
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 50 * time.Millisecond
	}
	if cfg.Election == 0 {
		cfg.Election = 500 * time.Millisecond
	}
	c := &Cluster{t: t, bin: bin, cfg: cfg}
	var initial []string
	for i := range cfg.Members {
		cport, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		pport, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		m := &Member{
			Name:       fmt.Sprintf("m%d", i),
			DataDir:    t.TempDir(),
			ClientURL:  fmt.Sprintf("http://127.0.0.1:%d", cport),
			peerListen: fmt.Sprintf("http://127.0.0.1:%d", pport),
			c:          c,
			logs:       &testlog.Lines{},
		}
		m.PeerURL = m.peerListen
		m.Proxy, err = harness.NewProxy(strings.TrimPrefix(m.ClientURL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Proxy.Close() })
		if cfg.PeerProxies {
			if m.PeerProxy, err = harness.NewPeerProxy(strings.TrimPrefix(m.peerListen, "http://")); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.PeerProxy.Close() })
			m.PeerURL = "http://" + m.PeerProxy.Addr()
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		m.args = []string{
			"--name", m.Name,
			"--data-dir", m.DataDir,
			"--listen-client-urls", m.ClientURL,
			// Clients that ask the cluster for its members learn the
			// proxies, never a way around them.
			"--advertise-client-urls", "http://" + m.Proxy.Addr(),
			"--listen-peer-urls", m.peerListen,
			"--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", "reliability",
			"--heartbeat-interval", fmt.Sprint(cfg.Heartbeat.Milliseconds()),
			"--election-timeout", fmt.Sprint(cfg.Election.Milliseconds()),
			// A killed process loses nothing the kernel holds; only a
			// machine crash would need the fsync.
			"--unsafe-no-fsync",
			"--log-level", "warn",
		}
		if err := m.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, m := range c.Members {
			m.mu.Lock()
			if m.proc != nil {
				m.proc.Kill()
			}
			m.mu.Unlock()
			if t.Failed() {
				t.Logf("etcd %s log (last lines):\n%s", m.Name, m.logs.Tail(15))
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatalf("etcd cluster: %v", err)
	}
	return c
}

// Endpoints are the proxies' URLs: what intentd is given.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, "http://"+m.Proxy.Addr())
	}
	return out
}

func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil && m.proc.Running() {
		return fmt.Errorf("reliability: etcd %s is already running", m.Name)
	}
	p, err := harness.StartProcess(exec.Command(m.c.bin, m.args...), harness.ProcessConfig{Name: "etcd " + m.Name, Logs: m.logs})
	if err != nil {
		return err
	}
	m.proc, m.stopped = p, false
	return nil
}

// Kill sends SIGKILL (kill -9) and waits until the process is gone.
func (m *Member) Kill() {
	m.mu.Lock()
	p := m.proc
	m.stopped = false
	m.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Restart starts the member again on its data directory and ports.
func (m *Member) Restart() error { return m.start() }

// Running reports whether the member's process is alive (stopped or not).
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc != nil && m.proc.Running()
}

// Stop sends SIGSTOP: the process keeps its sockets and answers nothing.
func (m *Member) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return errors.New("reliability: member not started")
	}
	if err := m.proc.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	m.stopped = true
	return nil
}

// Cont sends SIGCONT to a stopped member.
func (m *Member) Cont() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return errors.New("reliability: member not started")
	}
	if err := m.proc.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	m.stopped = false
	return nil
}

// Stopped reports whether the member is SIGSTOPped.
func (m *Member) Stopped() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopped
}

// status asks the member itself, on its own client URL (not through its
// proxy), for its raft status.
func (m *Member) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{m.ClientURL},
		DialTimeout: time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := cli.Status(sctx, m.ClientURL)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.id = resp.Header.GetMemberId()
	m.mu.Unlock()
	return resp, nil
}

// Leader returns the member the running, unstopped members agree is the
// leader (asked with the etcd client's Status), or an error when they do
// not agree or have none.
func (c *Cluster) Leader(ctx context.Context) (*Member, error) {
	var leader uint64
	byID := map[uint64]*Member{}
	asked := 0
	for _, m := range c.Members {
		if !m.Running() || m.Stopped() {
			continue
		}
		resp, err := m.status(ctx)
		if err != nil {
			continue
		}
		asked++
		byID[resp.Header.GetMemberId()] = m
		switch {
		case resp.Leader == 0:
			return nil, fmt.Errorf("reliability: %s knows no leader", m.Name)
		case leader != 0 && resp.Leader != leader:
			return nil, fmt.Errorf("reliability: members disagree on the leader (%x, %x)", leader, resp.Leader)
		}
		leader = resp.Leader
	}
	if asked == 0 {
		return nil, errors.New("reliability: no member answered Status")
	}
	m, ok := byID[leader]
	if !ok {
		return nil, fmt.Errorf("reliability: leader %x is not among the members that answered", leader)
	}
	return m, nil
}

// WaitLeader polls Leader until one is agreed on or ctx ends.
func (c *Cluster) WaitLeader(ctx context.Context) (*Member, error) {
	var last error
	for {
		m, err := c.Leader(ctx)
		if err == nil {
			return m, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Partition cuts m off from the other members (both ways, on their peer
// links only: clients still reach every member) until HealPartition. It
// needs ClusterConfig.PeerProxies and every member's id (known once the
// cluster had a leader).
func (c *Cluster) Partition(m *Member) error {
	var others []string
	for _, o := range c.Members {
		if o.PeerProxy == nil {
			return errors.New("reliability: Partition needs ClusterConfig.PeerProxies")
		}
		if o.memberID() == "" {
			return fmt.Errorf("reliability: the id of etcd %s is not known yet", o.Name)
		}
		if o != m {
			others = append(others, o.memberID())
		}
	}
	m.PeerProxy.RefuseFrom(others...)
	for _, o := range c.Members {
		if o != m {
			o.PeerProxy.RefuseFrom(m.memberID())
		}
	}
	return nil
}

// HealPartition lets every member reach every other again.
func (c *Cluster) HealPartition() {
	for _, m := range c.Members {
		if m.PeerProxy != nil {
			m.PeerProxy.RefuseFrom()
		}
	}
}

// memberID is the member's id as its peers name it (hex), once known.
func (m *Member) memberID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.id == 0 {
		return ""
	}
	return strconv.FormatUint(m.id, 16)
}

// Followers returns the members other than leader.
func (c *Cluster) Followers(leader *Member) []*Member {
	var out []*Member
	for _, m := range c.Members {
		if m != leader {
			out = append(out, m)
		}
	}
	return out
}

// RestartWithFlags restarts the members one at a time with flags appended
// to their command lines (e.g. "--quota-backend-bytes", "16777216"), each
// on its data directory and ports, waiting until each serves again and the
// cluster agrees on a leader before the next: a rolling restart, as an
// operator changes a member's configuration. Call it before the load
// starts.
func (c *Cluster) RestartWithFlags(ctx context.Context, flags ...string) error {
	for _, m := range c.Members {
		m.Kill()
		m.mu.Lock()
		m.args = append(m.args, flags...)
		m.mu.Unlock()
		if err := m.start(); err != nil {
			return err
		}
		for {
			if _, err := m.status(ctx); err == nil {
				if _, err := c.Leader(ctx); err == nil {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("etcd %s restarted with %s: %w", m.Name, strings.Join(flags, " "), ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// Admin is an etcd client on the members' own client URLs (around the
// proxies), for what an operator does: compact, defragment, disarm alarms.
// It is closed when the test ends.
func (c *Cluster) Admin() (*clientv3.Client, error) {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.ClientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli, nil
}
