// Command intentd-fill measures what stored intents cost the embedded etcd.
// It starts intentd in-process with its default configuration on a fresh
// data directory, then registers, acquires and completes N intents back to
// back through gRPC (realistic params, labels and result), and prints the
// database size as it goes and at the end: the file size (what etcd's quota
// counts), the size in use, and, after compacting every revision but the
// last and defragmenting, the bytes each retained intent costs.
//
//	go run ./cmd/intentd-fill -n 1000000 -c 48
//
// With -retention (say 1s) the daemon's default retention is that short and
// its janitor sweeps every second: after the fill, intentd-fill waits until
// the janitor has replaced every record by its tombstone, then measures
// what is left, the bytes each tombstone costs, less what the same store
// held before the fill (its baseline, also compacted and defragmented).
//
//	go run ./cmd/intentd-fill -n 50000 -c 32 -retention 1s
//
// It exits non-zero if any call fails (a full store among them). Rate
// limits are turned off (they are per principal, and the fill is one
// principal); everything the store keeps is intentd's default.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/run/fill"
)

func main() {
	n := flag.Int("n", 10000, "intents to register, acquire and complete")
	workers := flag.Int("c", 32, "concurrent workers")
	every := flag.Duration("every", 30*time.Second, "progress interval")
	dataDir := flag.String("data-dir", "", "data directory (must be empty or absent; default: a temporary one, removed at the end)")
	retention := flag.Duration("retention", 0, "measure tombstones: the daemon's default retention (e.g. 1s), a janitor sweeping every second, and a wait until it removed every record (default: intentd's retention, measuring retained intents)")
	flag.Parse()
	if *n <= 0 || *workers <= 0 || *every <= 0 || *retention < 0 {
		fmt.Fprintln(os.Stderr, "intentd-fill: -n, -c and -every must be positive, -retention not negative")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *n, *workers, *every, *dataDir, *retention); err != nil {
		fmt.Fprintln(os.Stderr, "intentd-fill:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n, workers int, every time.Duration, dataDir string, retention time.Duration) error {
	if dataDir == "" {
		d, err := os.MkdirTemp("", "intentd-fill-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dataDir = d
	} else if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		return fmt.Errorf("-data-dir %s: not empty; the fill measures a fresh store", dataDir)
	}
	metricsAddr, err := freeport.Loopback()
	if err != nil {
		return err
	}
	// The default configuration, on ports that leave a running intentd
	// alone.
	cfg := daemon.DefaultConfig()
	cfg.DataDir = dataDir
	cfg.Listen = "127.0.0.1:0"
	cfg.EmbedPeerURL = "http://127.0.0.1:0"
	cfg.MetricsListen = metricsAddr
	cfg.RatePerPrincipal, cfg.RatePerTenant = 0, 0
	cfg.LogLevel = "warn" // the quota warnings, not every call
	if retention > 0 {
		cfg.Store.DefaultRetention = retention
		cfg.JanitorInterval = time.Second
	}

	dctx, stopDaemon := context.WithCancel(context.Background())
	defer stopDaemon()
	ready := make(chan string, 1)
	exited := make(chan error, 1)
	go func() { exited <- daemon.Run(dctx, cfg, cfg.Logger(), func(addr string) { ready <- addr }) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-exited:
		return fmt.Errorf("intentd did not start: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() {
		stopDaemon()
		<-exited
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Printf("intentd-fill: %d intents, %d workers, data dir %s, quota %s, compaction %s %s\n",
		n, workers, dataDir, mib(cfg.EmbedQuotaBytes), cfg.EmbedCompaction.Mode, cfg.EmbedCompaction.Retention)
	metricsURL := "http://" + cfg.MetricsListen + "/metrics"
	var baseline int64
	if retention > 0 {
		fmt.Printf("tombstones: retention %s, janitor every %s, tombstone retention %s\n", retention, cfg.JanitorInterval, cfg.Store.TombstoneRetention)
		if _, baseline, err = compactDefrag(ctx, cfg); err != nil {
			return err
		}
		fmt.Printf("fresh store, compacted and defragmented: in use %d bytes\n", baseline)
	}

	var done atomic.Int64
	filled := make(chan error, 1)
	start := time.Now()
	go func() { filled <- fill.Run(ctx, conn, n, workers, &done) }() // exits when the fill ends
	tick := time.NewTicker(every)
	defer tick.Stop()
	for running := true; running; {
		select {
		case err := <-filled:
			if err != nil {
				return fmt.Errorf("after %d intents: %w", done.Load(), err)
			}
			running = false
		case <-tick.C:
			d := done.Load()
			el := time.Since(start)
			size, inUse := scrape(metricsURL)
			fmt.Printf("%8s  %9d intents  %6.0f/s  db %s  in use %s\n", el.Round(time.Second), d, float64(d)/el.Seconds(), mib(size), mib(inUse))
		}
	}
	el := time.Since(start)
	fmt.Printf("filled %d intents in %s (%.0f/s)\n", n, el.Round(time.Second), float64(n)/el.Seconds())
	if retention > 0 {
		return measureTombstones(ctx, cfg, metricsURL, n, every, baseline)
	}
	return measure(ctx, cfg, n)
}

// measureTombstones waits until the janitor has removed every record the
// fill completed (each leaving a tombstone), then compacts, defragments and
// prints what each tombstone costs above the fresh store's baseline.
func measureTombstones(ctx context.Context, cfg daemon.Config, metricsURL string, n int, every time.Duration, baseline int64) error {
	start := time.Now()
	last := start
	for {
		removed := scrapeRemoved(metricsURL)
		if removed >= int64(n) {
			break
		}
		if time.Since(last) >= every {
			last = time.Now()
			fmt.Printf("%8s  %9d records removed by the janitor\n", time.Since(start).Round(time.Second), removed)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	fmt.Printf("the janitor removed all %d records %s after the fill\n", n, time.Since(start).Round(time.Second))
	before, inUse, err := compactDefrag(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("compacted, defragmented: in use %s before, %s after (%d bytes; fresh store %d bytes)\n", mib(before), mib(inUse), inUse, baseline)
	fmt.Printf("%.0f bytes per tombstone; %.0f bytes of uncompacted history per intent at the end (the removals' among them)\n",
		float64(inUse-baseline)/float64(n), float64(before-inUse)/float64(n))
	return nil
}

// compactDefrag compacts every revision but the last, defragments, and
// returns the bytes in use before and after.
func compactDefrag(ctx context.Context, cfg daemon.Config) (before, after int64, err error) {
	ep := "unix://" + cfg.EmbedSocket()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, 0, err
	}
	defer cli.Close()
	st, err := cli.Status(ctx, ep)
	if err != nil {
		return 0, 0, err
	}
	before = st.DbSizeInUse
	if _, err := cli.Compact(ctx, st.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return 0, 0, fmt.Errorf("compact: %w", err)
	}
	if _, err := cli.Defragment(ctx, ep); err != nil {
		return 0, 0, fmt.Errorf("defragment: %w", err)
	}
	if st, err = cli.Status(ctx, ep); err != nil {
		return 0, 0, err
	}
	return before, st.DbSizeInUse, nil
}

// measure prints the database as the fill left it, then compacts every
// revision but the last and defragments, so that what is left is exactly
// what the retained intents cost; what compaction removed is the history
// the fill left uncompacted (all of it, if the fill took less than one
// compaction window).
func measure(ctx context.Context, cfg daemon.Config, n int) error {
	ep := "unix://" + cfg.EmbedSocket()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	before, err := cli.Status(ctx, ep)
	if err != nil {
		return err
	}
	fmt.Printf("after the fill:       db %s (%.0f bytes per intent), in use %s, quota %s (%.1f%% used), revision %d\n",
		mib(before.DbSize), float64(before.DbSize)/float64(n), mib(before.DbSizeInUse), mib(before.DbSizeQuota),
		100*float64(before.DbSize)/float64(before.DbSizeQuota), before.Header.Revision)
	if _, err := cli.Compact(ctx, before.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	t := time.Now()
	if _, err := cli.Defragment(ctx, ep); err != nil {
		return fmt.Errorf("defragment: %w", err)
	}
	took := time.Since(t)
	after, err := cli.Status(ctx, ep)
	if err != nil {
		return err
	}
	fmt.Printf("compacted, defragmented in %s: db %s, in use %s\n", took.Round(time.Millisecond), mib(after.DbSize), mib(after.DbSizeInUse))
	fmt.Printf("%.0f bytes per retained intent; %.0f bytes of uncompacted history per intent at the end of the fill\n",
		float64(after.DbSizeInUse)/float64(n), float64(before.DbSizeInUse-after.DbSizeInUse)/float64(n))
	return nil
}

// scrape reads the database size and the size in use from intentd's
// /metrics (zero when it cannot).
func scrape(url string) (size, inUse int64) {
	scrapeLines(url, func(name string, v float64) {
		switch name {
		case "intentd_etcd_db_size_bytes":
			size = int64(v)
		case "intentd_etcd_db_size_in_use_bytes":
			inUse = int64(v)
		}
	})
	return size, inUse
}

// scrapeLines calls f with each sample of intentd's /metrics (name with
// its labels, value); nothing when /metrics cannot be read.
func scrapeLines(url string, f func(name string, v float64)) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			f(name, v)
		}
	}
}

// scrapeRemoved reads from intentd's /metrics how many final records the
// janitor removed (zero when it cannot).
func scrapeRemoved(url string) int64 {
	var removed int64
	scrapeLines(url, func(name string, v float64) {
		if name == `intentd_janitor_items_total{action="removed"}` {
			removed = int64(v)
		}
	})
	return removed
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
