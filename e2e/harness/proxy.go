package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/textproto"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is one way through a Proxy.
type Direction int

const (
	// Upstream is client → server: requests.
	Upstream Direction = iota
	// Downstream is server → client: replies.
	Downstream
)

func (d Direction) String() string {
	if d == Upstream {
		return "upstream"
	}
	return "downstream"
}

type faultKind int

const (
	passKind faultKind = iota
	delayKind
	blackholeKind
)

// Fault is what a Proxy does to the bytes of one direction.
type Fault struct {
	kind  faultKind
	delay time.Duration
}

// Pass forwards bytes as they come.
var Pass = Fault{}

// Blackhole accepts bytes and forwards none of them. A connection that lost
// bytes this way is reset when its direction passes again, as TCP would give
// up on it, so that no peer ever reads a stream with a hole in it.
var Blackhole = Fault{kind: blackholeKind}

// Delay forwards every byte d after it arrived, in order.
func Delay(d time.Duration) Fault { return Fault{kind: delayKind, delay: d} }

func (f Fault) String() string {
	switch f.kind {
	case delayKind:
		return "delay " + f.delay.String()
	case blackholeKind:
		return "blackhole"
	}
	return "pass"
}

// ProxyStats counts what a Proxy did, as proof that a fault touched traffic.
type ProxyStats struct {
	// Accepted is the number of connections accepted and forwarded.
	Accepted int64
	// Refused is the number of connections closed at once while cut.
	Refused int64
	// Reset is the number of live connections closed by Cut or by a heal
	// after a blackhole.
	Reset int64
	// Forwarded, Discarded and Delayed are bytes per direction.
	Forwarded, Discarded, Delayed [2]int64
}

// Proxy is a TCP proxy on loopback in front of one target address, with a
// fault per direction and a switch that cuts every connection. It is safe
// for concurrent use. Close stops it and waits for every goroutine it
// started.
type Proxy struct {
	target string
	ln     net.Listener

	// peer: the proxy sits on an etcd peer link and tells senders apart
	// (RefuseFrom).
	peer bool

	mu      sync.Mutex
	faults  [2]Fault
	cut     bool
	closed  bool
	refused []string // senders RefuseFrom refuses
	links   map[*link]struct{}

	wg    sync.WaitGroup
	stats struct {
		accepted, refused, reset          atomic.Int64
		forwarded, discarded, delayedByte [2]atomic.Int64
	}
}

// NewProxy listens on a free loopback port and forwards every connection to
// target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("reliability: proxy listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept() // exits when Close closes the listener
	return p, nil
}

// NewPeerProxy is NewProxy for an etcd member's peer port: it reads which
// member each connection comes from, so that RefuseFrom can partition
// members from each other through their proxies alone.
func NewPeerProxy(target string) (*Proxy, error) {
	p, err := NewProxy(target)
	if err == nil {
		p.mu.Lock()
		p.peer = true
		p.mu.Unlock()
	}
	return p, err
}

// RefuseFrom refuses, from now on, the connections of the named etcd
// members (member ids in hex, as etcd's peers name themselves in the
// X-Server-From header of every raft request) and closes theirs that are
// open; with no names it refuses nobody. While it refuses anyone it also
// refuses connections that do not name their sender: a member's HTTP
// client reuses a connection opened for another request (GET /members)
// for raft messages. Only for a NewPeerProxy.
func (p *Proxy) RefuseFrom(senders ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused = slices.Clone(senders)
	for l := range p.links {
		if p.refuses(l.sender) {
			l.close(&p.stats.reset)
		}
	}
}

// refuses reports whether a peer connection from sender is refused. The
// caller holds p.mu.
func (p *Proxy) refuses(sender string) bool {
	return len(p.refused) > 0 && (sender == "" || slices.Contains(p.refused, sender))
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set makes direction d suffer f from now on. Bytes already delayed keep
// their delay. Leaving Blackhole resets the connections that lost bytes.
func (p *Proxy) Set(d Direction, f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[d] = f
	if f.kind != blackholeKind {
		for l := range p.links {
			if l.tainted[d].Load() {
				l.close(&p.stats.reset)
			}
		}
	}
}

// Fault returns the fault of direction d.
func (p *Proxy) Fault(d Direction) Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults[d]
}

// DropReplies forwards requests and discards every reply: the half-open
// link on which the server acts and the client never hears of it.
func (p *Proxy) DropReplies() {
	p.Set(Upstream, Pass)
	p.Set(Downstream, Blackhole)
}

// Cut closes every connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for l := range p.links {
		l.close(&p.stats.reset)
	}
}

// Heal lets everything pass again.
func (p *Proxy) Heal() {
	p.Set(Upstream, Pass)
	p.Set(Downstream, Pass)
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Stats returns the counters so far.
func (p *Proxy) Stats() ProxyStats {
	s := ProxyStats{Accepted: p.stats.accepted.Load(), Refused: p.stats.refused.Load(), Reset: p.stats.reset.Load()}
	for d := range 2 {
		s.Forwarded[d] = p.stats.forwarded[d].Load()
		s.Discarded[d] = p.stats.discarded[d].Load()
		s.Delayed[d] = p.stats.delayedByte[d].Load()
	}
	return s
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for l := range p.links {
		l.close(nil)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			p.stats.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c) // exits when both pumps of the link end
	}
}

// link is one proxied connection: the client's and the one to the target.
type link struct {
	client, server net.Conn
	sender         string // the etcd member it comes from (peer proxies)
	once           sync.Once
	tainted        [2]atomic.Bool // the direction discarded bytes
}

// close closes both ends once, counting it in n if not nil.
func (l *link) close(n *atomic.Int64) {
	l.once.Do(func() {
		if n != nil {
			n.Add(1)
		}
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	peer := p.peer
	p.mu.Unlock()
	var sender string
	if peer {
		c, sender = readSender(c)
	}
	s, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		p.stats.refused.Add(1)
		_ = c.Close()
		return
	}
	l := &link{client: c, server: s, sender: sender}
	p.mu.Lock()
	if p.cut || p.closed || (peer && p.refuses(sender)) {
		p.mu.Unlock()
		p.stats.refused.Add(1)
		l.close(nil)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.stats.accepted.Add(1)

	var pumps sync.WaitGroup
	pumps.Go(func() { p.pump(l, Upstream, c, s) })
	pumps.Go(func() { p.pump(l, Downstream, s, c) })
	pumps.Wait()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// chunk is bytes read from one side, due to be written at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst through the direction's fault. Reading and writing
// are split so that a delay holds bytes without holding up the reading of
// later ones; the writer keeps their order. It returns when either side
// fails or the link is closed.
func (p *Proxy) pump(l *link, d Direction, src, dst net.Conn) {
	queue := make(chan chunk, 1024)
	writerDone := make(chan struct{})
	go func() { // exits when queue is closed or a write fails
		defer close(writerDone)
		for ch := range queue {
			if wait := time.Until(ch.due); wait > 0 {
				time.Sleep(wait)
			}
			if _, err := dst.Write(ch.b); err != nil {
				l.close(nil)
				for range queue { // let the reader finish
				}
				return
			}
			p.stats.forwarded[d].Add(int64(len(ch.b)))
		}
	}()
	defer func() {
		close(queue)
		<-writerDone
		l.close(nil)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f := p.Fault(d)
			switch f.kind {
			case blackholeKind:
				l.tainted[d].Store(true)
				p.stats.discarded[d].Add(int64(n))
			default:
				if l.tainted[d].Load() {
					return // the stream has a hole: reset, as Set would have
				}
				ch := chunk{b: append([]byte(nil), buf[:n]...), due: time.Now()}
				if f.kind == delayKind {
					ch.due = ch.due.Add(f.delay)
					p.stats.delayedByte[d].Add(int64(n))
				}
				queue <- ch
			}
		}
		if err != nil {
			return // EOF, a reset by either side, or the link closed
		}
	}
}

// readSender reads the head of the first HTTP request on c (without
// consuming it) and returns c, still holding those bytes, and the request's
// X-Server-From header: the etcd member that opened the connection. A
// connection that says nothing within a second, or is not a peer's, has no
// sender.
func readSender(c net.Conn) (net.Conn, string) {
	br := bufio.NewReaderSize(c, 16<<10)
	pc := &peekedConn{Conn: c, r: br}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for want := 1; want <= br.Size(); {
		head, err := br.Peek(want)
		if err != nil {
			return pc, ""
		}
		if end := bytes.Index(head, []byte("\r\n\r\n")); end >= 0 {
			tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head[:end+4])))
			if _, err := tp.ReadLine(); err != nil { // the request line
				return pc, ""
			}
			h, _ := tp.ReadMIMEHeader()
			return pc, h.Get("X-Server-From")
		}
		// Look at whatever else has arrived, or wait for one more byte.
		want = max(len(head)+1, br.Buffered())
	}
	return pc, ""
}

// peekedConn is a connection whose first bytes were read ahead into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
