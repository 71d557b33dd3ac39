package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/intentd/intentd/internal/core/freeport"
)

// The gateway workload (only when named): a worker's cycle whose side
// effect goes through the fencing gateway (intentd gateway, a process of
// its own, this binary as intentd's command) to a trivial upstream, against
// intentd's cycle, in interleaved rounds at each --levels concurrency. A
// gateway cycle is Acquire with register (EXECUTE), one call through the
// gateway (BeginSubmission, the upstream, RecordSubmission), Complete: its
// latency is the call's alone, its rate that of whole cycles. Its figures
// go on a line of their own (GATEWAY ...), not into RESULT:
//
//	gateway_call_vs_cycle_c1   a call's p50 ÷ the cycle's p50 at C=1 (target ≤ 2)
//	gateway_rate_vs_cycle      gateway cycles/s ÷ cycles/s at the highest level (target ≥ 0.5)

// trivialUpstream answers every request 201 with a small JSON body, in this
// process (its CPU is the client's, not the servers').
func trivialUpstream() (*http.Server, string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"PU-1","status":"booked"}`)
	})}
	go func() { _ = srv.Serve(lis) }()
	return srv, "http://" + lis.Addr().String(), nil
}

// startGateway starts `intentd gateway` (this binary as intentd's command)
// in front of in, with the upstream at url as "courier", and waits until it
// is ready.
func (b *bench) startGateway(ctx context.Context, in *intentdServer, url string) (*child, string, error) {
	addr, err := freeport.Loopback()
	if err != nil {
		return nil, "", err
	}
	conf := filepath.Join(b.dir, "gateway.yaml")
	if err := os.WriteFile(conf, []byte("upstreams:\n  courier:\n    url: "+url+"\n    timeout: 10s\n"), 0o600); err != nil {
		return nil, "", err
	}
	c, err := startChild(b.dir, "gateway", "intentd", "gateway", "--config", conf, "--listen", addr, "--intentd", in.conn.Target(), "--log-level", "warn")
	if err != nil {
		return nil, "", err
	}
	base := "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err := c.exited(); err != nil {
			return nil, "", err
		}
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c, base, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.stop()
			return nil, "", fmt.Errorf("gateway not ready within 30s: %s", c.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runGateway compares a worker's cycle through the gateway with intentd's
// cycle.
func (b *bench) runGateway(ctx context.Context, in *intentdServer) error {
	up, url, err := trivialUpstream()
	if err != nil {
		return err
	}
	defer up.Close()
	gw, base, err := b.startGateway(ctx, in, url)
	if err != nil {
		return err
	}
	defer gw.stop()
	ids, err := b.sessions(ctx, in, slices.Max(b.cfg.levels), cycleTTL)
	if err != nil {
		return err
	}
	defer b.closeSessions(in, ids)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	gwProc := proc{pid: gw.pid()}
	const body = `{"parcel":"P-1","address":"Main St 1"}`
	figures := map[string]float64{}
	gatewayOp := func(ctx context.Context, w int) (time.Duration, error) {
		key := b.key("g")
		token, err := b.acquireNew(ctx, in, ids[w], key)
		if err != nil {
			return 0, err
		}
		req, err := http.NewRequestWithContext(ctx, "POST", base+"/u/courier/pickups", strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Intentd-Key", key)
		req.Header.Set("Intentd-Operation", "create-pickup")
		req.Header.Set("Intentd-Fencing-Token", fmt.Sprint(token))
		t := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, fmt.Errorf("gateway call %s: %w", key, err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lat := time.Since(t)
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Intentd-Outcome") != "forwarded" {
			return 0, fmt.Errorf("gateway call %s: %d %s %s", key, resp.StatusCode, resp.Header.Get("Intentd-Outcome"), answer)
		}
		return lat, b.complete(ctx, in, key, token)
	}
	cycleOp := func(ctx context.Context, w int) (time.Duration, error) {
		return 0, b.cycle(ctx, in, ids[w], b.key("c"))
	}
	peers := []peer{{"through the gateway", in.proc, in.etcd, gatewayOp}, {"cycle", in.proc, in.etcd, cycleOp}}
	rows := [][]string{{"gateway", "gateway cycles/s", "cycles/s", "gateway ÷ cycle", "gateway call p50 / p99 ms", "cycle p50 / p99 ms", "call p50 ÷ cycle p50",
		"intentd CPU µs/gateway cycle", "intentd CPU µs/cycle", "gateway CPU µs/call", "intentd revisions/gateway cycle"}}
	for _, c := range b.cfg.levels {
		cpu0 := gwProc.cpu()
		rs, err := b.interleave(ctx, "gateway", peers, c)
		if err != nil {
			return err
		}
		gcpu := gwProc.cpuSince(cpu0)
		gr, cr := rs[0], rs[1]
		calls := 0
		for _, r := range gr {
			calls += r.ops
		}
		gwPerCall := "n/a"
		if gcpu >= 0 && calls > 0 {
			gwPerCall = num(float64(gcpu.Microseconds())/float64(calls), 0) // warm-up calls included: an upper bound
		}
		rate := pairRatio(gr, cr)
		p50 := pairLatency(gr, cr, 0.5)
		rows = append(rows, []string{
			fmt.Sprintf("C=%d", c),
			over(gr, round.rate).format(0), over(cr, round.rate).format(0), rate.format(2),
			latencies(gr), latencies(cr), p50.format(2),
			over(gr, round.cpuPerOp).format(0), over(cr, round.cpuPerOp).format(0), gwPerCall,
			over(gr, round.revsPerOp).format(2),
		})
		if c == 1 {
			figures["gateway_call_vs_cycle_c1"] = p50.med
		}
		figures["gateway_rate_vs_cycle"] = rate.med // the last level is the highest
		figures["gateway_rate_vs_cycle_level"] = float64(c)
	}
	fmt.Fprintf(b.out, "gateway: a worker's cycle through intentd gateway to a trivial upstream (Acquire with register, the call, Complete; latency: the call alone), vs intentd's cycle (Acquire with register + Complete); %d rounds of %s each, interleaved; median (min–max)\n", b.cfg.rounds, b.cfg.duration)
	table(b.out, rows)
	fmt.Fprintf(b.out, "GATEWAY gateway_call_vs_cycle_c1=%s gateway_rate_vs_cycle=%s (at C=%s)\n\n",
		num(figures["gateway_call_vs_cycle_c1"], 2), num(figures["gateway_rate_vs_cycle"], 2), num(figures["gateway_rate_vs_cycle_level"], 0))
	return nil
}

// pairLatency is the median over rounds of a's q-latency ÷ b's in the
// same round.
func pairLatency(a, b []round, q float64) spread {
	xs := make([]float64, min(len(a), len(b)))
	for i := range xs {
		xs[i] = ratio(float64(a[i].pct(q)), float64(b[i].pct(q)))
	}
	return spreadOf(xs)
}
