package harness

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() { // exits when the listener closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // exits when the connection closes
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func startProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

type echoConn struct {
	net.Conn
	r *bufio.Reader
}

func dialEcho(t *testing.T, p *Proxy) *echoConn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &echoConn{Conn: c, r: bufio.NewReader(c)}
}

// roundTrip sends line and waits up to within for its echo.
func (c *echoConn) roundTrip(line string, within time.Duration) (string, time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(within))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", 0, err
	}
	got, err := c.r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), time.Since(start), err
}

// statsSettle waits up to a second for the proxy's counters to satisfy
// want (a pump counts bytes just after it wrote them), and fails the test
// with what if they never do.
func statsSettle(t *testing.T, p *Proxy, what string, want func(ProxyStats) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		s := p.Stats()
		if want(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("stats %+v: want %s", s, what)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestProxyPass(t *testing.T) {
	p := startProxy(t)
	c := dialEcho(t, p)
	got, _, err := c.roundTrip("hello", time.Second)
	if err != nil || got != "hello" {
		t.Fatalf("round trip: got %q, %v; want hello", got, err)
	}
	statsSettle(t, p, "1 accepted and 6 bytes each way", func(s ProxyStats) bool {
		return s.Accepted == 1 && s.Forwarded[Upstream] == 6 && s.Forwarded[Downstream] == 6
	})
}

func TestProxyDelay(t *testing.T) {
	p := startProxy(t)
	c := dialEcho(t, p)
	p.Set(Upstream, Delay(150*time.Millisecond))
	p.Set(Downstream, Delay(100*time.Millisecond))
	got, took, err := c.roundTrip("slow", 2*time.Second)
	if err != nil || got != "slow" {
		t.Fatalf("round trip: got %q, %v", got, err)
	}
	if took < 250*time.Millisecond {
		t.Errorf("round trip took %v through 150ms + 100ms of delay", took)
	}
	p.Heal()
	if _, took, err := c.roundTrip("fast", time.Second); err != nil || took > 200*time.Millisecond {
		t.Errorf("after Heal: %v, took %v", err, took)
	}
}

func TestProxyBlackholeResetsOnHeal(t *testing.T) {
	p := startProxy(t)
	c := dialEcho(t, p)
	p.Set(Upstream, Blackhole)
	if _, _, err := c.roundTrip("lost", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed round trip: %v, want a timeout", err)
	}
	statsSettle(t, p, "5 bytes discarded upstream", func(s ProxyStats) bool { return s.Discarded[Upstream] == 5 })
	p.Heal()
	// The stream lost bytes: it must not go on as if it had not.
	if got, _, err := c.roundTrip("after", time.Second); err == nil {
		t.Fatalf("the connection that lost bytes still answered %q after Heal", got)
	}
	fresh := dialEcho(t, p)
	if got, _, err := fresh.roundTrip("fresh", time.Second); err != nil || got != "fresh" {
		t.Fatalf("a new connection after Heal: %q, %v", got, err)
	}
}

func TestProxyDropReplies(t *testing.T) {
	p := startProxy(t)
	c := dialEcho(t, p)
	p.DropReplies()
	if _, _, err := c.roundTrip("acted", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("round trip with replies dropped: %v, want a timeout", err)
	}
	statsSettle(t, p, "the request forwarded and the reply discarded", func(s ProxyStats) bool {
		return s.Forwarded[Upstream] == 6 && s.Discarded[Downstream] == 6
	})
}

func TestProxyCut(t *testing.T) {
	p := startProxy(t)
	c := dialEcho(t, p)
	if _, _, err := c.roundTrip("up", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, _, err := c.roundTrip("cut", time.Second); err == nil || isTimeout(err) {
		t.Fatalf("round trip on a cut connection: %v, want it closed", err)
	}
	refused := dialEcho(t, p)
	if _, _, err := refused.roundTrip("refused", time.Second); err == nil || isTimeout(err) {
		t.Fatalf("round trip on a connection made while cut: %v, want it closed", err)
	}
	p.Heal()
	if got, _, err := dialEcho(t, p).roundTrip("back", time.Second); err != nil || got != "back" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
	statsSettle(t, p, "1 reset and 1 refused", func(s ProxyStats) bool { return s.Reset == 1 && s.Refused == 1 })
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// A peer proxy tells etcd members apart by the X-Server-From header of the
// first request on each connection: RefuseFrom refuses the named ones (and
// closes their open connections), and while it refuses anyone, connections
// that name nobody too; everyone else passes.
func TestPeerProxyRefuseFrom(t *testing.T) {
	p, err := NewPeerProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	// The echo server sends the request head back: a reply proves that the
	// connection reached it.
	request := func(from string) string {
		head := "GET /raft/stream/message/1 HTTP/1.1\r\nHost: x\r\n"
		if from != "" {
			head += "X-Server-From: " + from + "\r\n"
		}
		return head + "\r\n"
	}
	open := func(from string) (net.Conn, error) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		req := request(from)
		if _, err := io.WriteString(c, req); err != nil {
			return nil, err
		}
		got := make([]byte, len(req))
		if _, err := io.ReadFull(c, got); err != nil {
			return nil, err
		}
		return c, nil
	}
	a, err := open("a")
	if err != nil {
		t.Fatalf("a before any refusal: %v", err)
	}
	p.RefuseFrom("a")
	if _, err := a.Read(make([]byte, 1)); err == nil {
		t.Error("a's open connection survived RefuseFrom(a)")
	}
	for _, tc := range []struct {
		from string
		pass bool
	}{{"a", false}, {"", false}, {"b", true}} {
		_, err := open(tc.from)
		if (err == nil) != tc.pass {
			t.Errorf("from %q while refusing a: err %v, want pass=%v", tc.from, err, tc.pass)
		}
	}
	p.RefuseFrom()
	for _, from := range []string{"a", "", "b"} {
		if _, err := open(from); err != nil {
			t.Errorf("from %q after the heal: %v", from, err)
		}
	}
}
