package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
)

// intentdServer is an intentd under test: its API, the etcd beneath it (to
// count the revisions it writes), and its process (to read its CPU time
// and memory). Against a running intentd the etcd and the process may be
// unknown (nil, zero).
type intentdServer struct {
	name  string
	child *child
	conn  *grpc.ClientConn
	rpc   intentv1.IntentServiceClient
	etcd  *clientv3.Client
	proc  proc
	// metrics is its Prometheus endpoint ("" unknown), for the Go heap
	// its RSS holds; pprof its profiles' ("" off).
	metrics, pprof string
}

// heap is the Go heap intentd's objects occupy (live and not yet swept),
// from its /metrics; zero when unknown.
func (s *intentdServer) heap() int64 { return int64(s.metric("go_memstats_heap_alloc_bytes")) }

// cacheBytes is the heap intentd's store estimates its caches hold.
func (s *intentdServer) cacheBytes() int64 { return int64(s.metric("intentd_store_cache_bytes")) }

// cacheUsage is what intentd's record cache holds, by its metrics.
type cacheUsage struct{ records, recordBytes float64 }

// cache reads intentd's record cache from its /metrics; zero when unknown.
func (s *intentdServer) cache() cacheUsage {
	return cacheUsage{
		records:     s.metricWith("intentd_store_cache_entries", `cache="records"`),
		recordBytes: s.metricWith("intentd_store_cache_bytes", `cache="records"`),
	}
}

// metric is the sum of the samples of the named metric in intentd's
// /metrics, whatever their labels; zero when unknown.
func (s *intentdServer) metric(name string) float64 { return s.metricWith(name, "") }

// metricWith is metric over the samples whose labels contain label
// (`cache="records"`; "": all of them).
func (s *intentdServer) metricWith(name, label string) float64 {
	if s.metrics == "" {
		return 0
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(s.metrics)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (!strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{")) {
			continue
		}
		if label != "" && !strings.Contains(rest, label) {
			continue
		}
		if i := strings.LastIndexByte(rest, ' '); i >= 0 {
			f, _ := strconv.ParseFloat(rest[i+1:], 64)
			sum += f
		}
	}
	return sum
}

// startIntentd runs intentd's own command in a child process with its
// defaults (embedded etcd, fsync on, default logging) on a fresh data
// directory under the bench's, with ports of its own and the rate limits
// off (the benchmark is one principal); with --heap-profiles, its pprof
// endpoint on too. Given an etcd (not nil), intentd uses it instead of an
// embedded one.
func (b *bench) startIntentd(ctx context.Context, name string, etcd *etcdServer) (*intentdServer, error) {
	return b.startIntentdBin(ctx, name, "", etcd)
}

// startIntentdBin is startIntentd with the intentd binary at bin instead
// of this one's (empty: this one's), and extra flags; a data directory
// that exists already (a restart) is kept.
func (b *bench) startIntentdBin(ctx context.Context, name, bin string, etcd *etcdServer, extra ...string) (*intentdServer, error) {
	addr, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	data, err := filepath.Abs(filepath.Join(b.dir, name))
	if err != nil {
		return nil, err
	}
	metrics, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	args := []string{"--data-dir", data, "--listen", addr, "--metrics-listen", metrics,
		"--rate-per-principal", "0", "--rate-per-tenant", "0"}
	endpoints := []string{"unix://" + filepath.Join(data, "etcd.sock")}
	if etcd != nil {
		endpoints = []string{etcd.endpoint}
		args = append(args, "--etcd-endpoints", etcd.endpoint)
	} else {
		args = append(args, "--embed-peer-url", "http://127.0.0.1:0")
	}
	pprof := ""
	if b.cfg.heapProfiles != "" {
		if pprof, err = freeport.Loopback(); err != nil {
			return nil, err
		}
		args = append(args, "--pprof-listen", pprof)
		pprof = "http://" + pprof + "/debug/pprof/"
	}
	args = append(args, extra...)
	var c *child
	if bin == "" {
		c, err = startChild(b.dir, name, "intentd", args...)
	} else {
		c, err = startProgram(b.dir, name, bin, args...)
	}
	if err != nil {
		return nil, err
	}
	s := &intentdServer{name: name, child: c, proc: proc{pid: c.pid()}, metrics: "http://" + metrics + "/metrics", pprof: pprof}
	if err := s.connect(ctx, addr, endpoints); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return s, nil
}

// externalIntentd is a running intentd at addr, its etcd at etcdEndpoints
// (none: revisions are not counted).
func externalIntentd(ctx context.Context, addr string, etcdEndpoints []string) (*intentdServer, error) {
	s := &intentdServer{name: "intentd"}
	if err := s.connect(ctx, addr, etcdEndpoints); err != nil {
		s.close()
		return nil, fmt.Errorf("--intentd-addr %s: %w", addr, err)
	}
	return s, nil
}

// saveHeap writes s's heap profile, taken after a GC, to
// --heap-profiles/<name>.heap, if that flag is set.
func (b *bench) saveHeap(s *intentdServer) error {
	if s.pprof == "" {
		return nil
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(s.pprof + "heap?gc=1")
	if err != nil {
		return fmt.Errorf("%s: heap profile: %w", s.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: heap profile: %s", s.name, resp.Status)
	}
	path := filepath.Join(b.cfg.heapProfiles, s.name+".heap")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	b.progress("%s: heap profile in %s", s.name, path)
	return f.Close()
}

func (s *intentdServer) connect(ctx context.Context, addr string, etcdEndpoints []string) error {
	conn, err := dial(addr)
	if err != nil {
		return err
	}
	s.conn = conn
	s.rpc = intentv1.NewIntentServiceClient(conn)
	if err := waitServing(ctx, s.child, conn); err != nil {
		return err
	}
	if len(etcdEndpoints) > 0 {
		if s.etcd, err = etcdClient(etcdEndpoints); err != nil {
			return err
		}
	}
	return nil
}

func (s *intentdServer) close() {
	if s.conn != nil {
		s.conn.Close()
	}
	if s.etcd != nil {
		s.etcd.Close()
	}
	if s.child != nil {
		s.child.stop()
	}
}

// etcdServer is the raw peer: an etcd the benchmark's clients write to
// directly, in a process of its own.
type etcdServer struct {
	child    *child
	etcd     *clientv3.Client
	proc     proc
	endpoint string // its client URL, when the benchmark started it
}

// startEtcd runs an embedded etcd with its defaults in a child process
// named name, its data in a directory of that name under dir.
func startEtcd(ctx context.Context, dir, name string) (*etcdServer, error) {
	addr, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	c, err := startChild(dir, name, "etcd", filepath.Join(dir, name), "http://"+addr)
	if err != nil {
		return nil, err
	}
	s := &etcdServer{child: c, proc: proc{pid: c.pid()}, endpoint: "http://" + addr}
	if s.etcd, err = etcdClient([]string{addr}); err != nil {
		s.close()
		return nil, err
	}
	if err := waitEtcd(ctx, c, s.etcd); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return s, nil
}

// externalEtcd is a running etcd cluster as the raw peer.
func externalEtcd(ctx context.Context, endpoints []string) (*etcdServer, error) {
	cli, err := etcdClient(endpoints)
	if err != nil {
		return nil, fmt.Errorf("--etcd-endpoints: %w", err)
	}
	s := &etcdServer{etcd: cli}
	if err := waitEtcd(ctx, nil, cli); err != nil {
		s.close()
		return nil, fmt.Errorf("--etcd-endpoints: %w", err)
	}
	return s, nil
}

// waitEtcd waits until a linearizable read answers.
func waitEtcd(ctx context.Context, c *child, cli *clientv3.Client) error {
	return poll(ctx, c, "answering", func(ctx context.Context) error {
		_, err := cli.Get(ctx, "intentbench-probe")
		return err
	})
}

func (s *etcdServer) close() {
	if s.etcd != nil {
		s.etcd.Close()
	}
	if s.child != nil {
		s.child.stop()
	}
}

// grpcChild is a gRPC server the benchmark started in a process of its
// own: the echo, or the front.
type grpcChild struct {
	child *child
	conn  *grpc.ClientConn
	proc  proc
}

// startEcho starts the echo, the floor of any gRPC answer: a server
// answering the health check.
func startEcho(ctx context.Context, dir string) (*grpcChild, error) {
	return startGRPCChild(ctx, dir, "echo")
}

// startGRPCChild starts this binary as the server kind, its listen
// address and then args as its arguments, and waits until its health
// service answers SERVING.
func startGRPCChild(ctx context.Context, dir, kind string, args ...string) (*grpcChild, error) {
	addr, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	c, err := startChild(dir, kind, kind, append([]string{addr}, args...)...)
	if err != nil {
		return nil, err
	}
	s := &grpcChild{child: c, proc: proc{pid: c.pid()}}
	if s.conn, err = dial(addr); err != nil {
		s.close()
		return nil, err
	}
	if err := waitServing(ctx, c, s.conn); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	return s, nil
}

func (s *grpcChild) close() {
	if s.conn != nil {
		s.conn.Close()
	}
	if s.child != nil {
		s.child.stop()
	}
}

// revision is etcd's current revision: every transaction that writes adds
// one, however many keys it writes. -1 when unknown.
func revision(ctx context.Context, cli *clientv3.Client) int64 {
	if cli == nil {
		return -1
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(cctx, "intentbench-probe", clientv3.WithCountOnly())
	if err != nil {
		return -1
	}
	return resp.Header.Revision
}

// op is one operation of a workload by worker w. It returns the latency
// to record, or zero for the whole call's.
type op func(ctx context.Context, w int) (time.Duration, error)

// opTimeout bounds each operation: every etcd and gRPC call gets a
// deadline, so a stuck server fails the run instead of hanging it.
const opTimeout = 30 * time.Second

// load runs f from conc workers for d and returns the round; the first
// error stops every worker and is returned.
func load(ctx context.Context, conc int, d time.Duration, f op) (round, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lats := make([][]time.Duration, conc)
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for w := range conc {
		wg.Go(func() { // returns at the end of the round or on the first error
			for time.Now().Before(end) && ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, opTimeout)
				t := time.Now()
				lat, err := f(cctx, w)
				el := time.Since(t)
				ccancel()
				if err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				if lat == 0 {
					lat = el
				}
				lats[w] = append(lats[w], lat)
			}
		})
	}
	wg.Wait()
	r := round{elapsed: time.Since(start), cpu: -1, revs: -1}
	if first != nil {
		return r, first
	}
	for _, l := range lats {
		r.lat = append(r.lat, l...)
	}
	sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
	r.ops = len(r.lat)
	return r, nil
}

// peer is one side of a comparison: a server and the operation run on it.
type peer struct {
	name string
	proc proc
	etcd *clientv3.Client // counts the peer's revisions; nil: not counted
	op   op
}

// interleave runs the peers in alternating rounds at conc, A, B, A, B …,
// after a short warm-up of each, so that a machine that gets busier or
// quieter during the run affects both alike. It returns each peer's
// rounds, with the CPU time its server spent and the revisions it wrote
// during each.
func (b *bench) interleave(ctx context.Context, what string, peers []peer, conc int) ([][]round, error) {
	warm := min(b.cfg.duration/3, time.Second)
	for _, p := range peers {
		if _, err := load(ctx, conc, warm, p.op); err != nil {
			return nil, fmt.Errorf("%s, %s, C=%d (warm-up): %w", what, p.name, conc, err)
		}
	}
	out := make([][]round, len(peers))
	for r := range b.cfg.rounds {
		for i, p := range peers {
			b.progress("%s C=%d round %d/%d: %s", what, conc, r+1, b.cfg.rounds, p.name)
			cpu0, rev0 := p.proc.cpu(), revision(ctx, p.etcd)
			rd, err := load(ctx, conc, b.cfg.duration, p.op)
			if err != nil {
				return nil, fmt.Errorf("%s, %s, C=%d: %w", what, p.name, conc, err)
			}
			rd.cpu = p.proc.cpuSince(cpu0)
			if rev1 := revision(ctx, p.etcd); rev0 >= 0 && rev1 >= 0 {
				rd.revs = rev1 - rev0
			}
			out[i] = append(out[i], rd)
		}
	}
	return out, nil
}

// pairRatio is the median over rounds of a's rate ÷ b's in the same round:
// adjacent in time, so less exposed to the machine's other load than a
// ratio of medians.
func pairRatio(a, b []round) spread {
	xs := make([]float64, min(len(a), len(b)))
	for i := range xs {
		xs[i] = ratio(a[i].rate(), b[i].rate())
	}
	return spreadOf(xs)
}
