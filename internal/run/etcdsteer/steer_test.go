package etcdsteer_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/intentd/intentd/internal/run/etcdsteer"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

func TestChoose(t *testing.T) {
	eps := []string{"a", "b", "c"}
	const (
		S = etcdsteer.Silent
		L = etcdsteer.Leaderless
		G = etcdsteer.Lagging
		R = etcdsteer.Ready
	)
	tests := []struct {
		name   string
		health []etcdsteer.Health
		want   []string
	}{
		{"all ready", []etcdsteer.Health{R, R, R}, eps},
		{"one stalled", []etcdsteer.Health{R, S, R}, []string{"a", "c"}},
		{"one cut off from its peers", []etcdsteer.Health{L, R, R}, []string{"b", "c"}},
		{"the leader stalled, election under way", []etcdsteer.Health{S, L, L}, []string{"b", "c"}},
		{"only one ready", []etcdsteer.Health{S, L, R}, []string{"c"}},
		{"one catching up after a stall", []etcdsteer.Health{R, G, R}, []string{"a", "c"}},
		{"lagging before leaderless", []etcdsteer.Health{G, L, S}, []string{"a"}},
		{"none answers: keep them all", []etcdsteer.Health{S, S, S}, eps},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := etcdsteer.Choose(eps, tc.health); !slices.Equal(got, tc.want) {
				t.Errorf("Choose(%v) = %v, want %v", tc.health, got, tc.want)
			}
		})
	}
}

// A member that stalls (its bytes held, its connection open, as a
// SIGSTOPped process's) gets no new calls once Steer has run, and gets them
// again once it answers.
func TestSteerKeepsCallsOffAStalledMember(t *testing.T) {
	srv := etcdtest.Start(t)
	target := strings.TrimPrefix(srv.Endpoints[0], "http://")
	// Two routes to one member stand for two members.
	healthy, stalling := newGate(t, target), newGate(t, target)
	eps := []string{"http://" + healthy.addr(), "http://" + stalling.addr()}
	dial := func(eps ...string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	}
	cli, err := dial(eps...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s, err := etcdsteer.New(cli, etcdsteer.Config{
		Endpoints: eps, Interval: time.Hour, Timeout: 300 * time.Millisecond,
		Dial:   func(ep string) (*clientv3.Client, error) { return dial(ep) },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if got := s.Steer(ctx); !slices.Equal(got, eps) {
		t.Fatalf("Steer with both answering = %v, want %v", got, eps)
	}

	stalling.stall()
	if got, want := s.Steer(ctx), eps[:1]; !slices.Equal(got, want) || !slices.Equal(cli.Endpoints(), want) {
		t.Fatalf("Steer with %s stalled = %v (client: %v), want %v", eps[1], got, cli.Endpoints(), want)
	}
	// Round robin over both would send every other call to the stalled
	// route, to wait out its timeout.
	for i := range 20 {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Put(cctx, "k", "v")
		cancel()
		if d := time.Since(start); err != nil || d > 500*time.Millisecond {
			t.Fatalf("call %d with %s stalled and steered off: %v after %v, want an answer within 500ms", i, eps[1], err, d)
		}
	}

	stalling.resume()
	if got := s.Steer(ctx); !slices.Equal(got, eps) {
		t.Fatalf("Steer once %s answers again = %v, want %v", eps[1], got, eps)
	}
}

// gate forwards TCP connections to a target; while stalled it holds every
// byte, both ways, without closing anything.
type gate struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   chan struct{} // closed while bytes pass
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target, open: make(chan struct{})}
	close(g.open)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		g.resume()
		conns.Wait()
	})
	go func() { // exits when ln closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { g.serve(c) })
		}
	}()
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }

func (g *gate) stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = make(chan struct{})
}

func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gate) passing() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

func (g *gate) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", g.target)
	if err != nil {
		return
	}
	defer up.Close()
	var pumps sync.WaitGroup
	pump := func(dst, src net.Conn) {
		defer func() { _ = dst.Close(); _ = src.Close() }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				<-g.passing()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	pumps.Go(func() { pump(up, c) })
	pumps.Go(func() { pump(c, up) })
	pumps.Wait()
}
