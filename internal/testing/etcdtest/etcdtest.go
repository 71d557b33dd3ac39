// Package etcdtest starts real etcd servers for tests: an embedded single
// member with its data in a temporary directory. Tests of intentd run against
// a real etcd, never a mock of the store.
package etcdtest

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/intentd/intentd/internal/run/embedetcd"
)

// Server is a running embedded etcd member.
type Server struct {
	Etcd      *embed.Etcd
	Endpoints []string
	stop      sync.Once
}

// Start starts an embedded etcd member on loopback ports chosen by the
// kernel, data in t.TempDir(), and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartDir(t, t.TempDir())
}

// StartDir is Start with the data directory given, so that a test can stop
// a member and start it again on the same data.
func StartDir(t testing.TB, dir string) *Server {
	t.Helper()
	return StartWith(t, dir, nil)
}

// StartWith is StartDir with a chance to change the member's configuration
// (a small backend quota, say) before it starts.
func StartWith(t testing.TB, dir string, configure func(*embed.Config)) *Server {
	t.Helper()
	loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg := embedetcd.Config("etcdtest", dir, loopback)
	cfg.ListenClientUrls = []url.URL{loopback}
	cfg.AdvertiseClientUrls = []url.URL{loopback}
	cfg.ListenPeerUrls = []url.URL{loopback}
	if configure != nil {
		configure(cfg)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcdtest: start: %v", err)
	}
	if err := embedetcd.WaitReady(e, 30*time.Second); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	s := &Server{Etcd: e, Endpoints: []string{"http://" + e.Clients[0].Addr().String()}}
	t.Cleanup(s.Stop)
	return s
}

// Stop stops the member; it is safe to call more than once.
func (s *Server) Stop() { s.stop.Do(s.Etcd.Close) }

// Client returns a client of the member, closed when the test ends.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   s.Endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Get(ctx, "etcdtest-ping"); err != nil {
		t.Fatalf("etcdtest: first read: %v", err)
	}
	return c
}
