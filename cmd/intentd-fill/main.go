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
// It exits non-zero if any call fails (a full store among them). Rate
// limits are turned off (they are per principal, and the fill is one
// principal); everything the store keeps is intentd's default.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
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

	"github.com/intentd/intentd/internal/daemon"
	"github.com/intentd/intentd/internal/fill"
)

func main() {
	n := flag.Int("n", 10000, "intents to register, acquire and complete")
	workers := flag.Int("c", 32, "concurrent workers")
	every := flag.Duration("every", 30*time.Second, "progress interval")
	dataDir := flag.String("data-dir", "", "data directory (must be empty or absent; default: a temporary one, removed at the end)")
	flag.Parse()
	if *n <= 0 || *workers <= 0 || *every <= 0 {
		fmt.Fprintln(os.Stderr, "intentd-fill: -n, -c and -every must be positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *n, *workers, *every, *dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "intentd-fill:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n, workers int, every time.Duration, dataDir string) error {
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
	metricsAddr, err := freePort()
	if err != nil {
		return err
	}
	// The default configuration, on ports that leave a running intentd
	// alone.
	cfg := daemon.DefaultConfig()
	cfg.DataDir = dataDir
	cfg.Listen = "127.0.0.1:0"
	cfg.EmbedClientURL = "http://127.0.0.1:0"
	cfg.EmbedPeerURL = "http://127.0.0.1:0"
	cfg.MetricsListen = metricsAddr
	cfg.RatePerPrincipal, cfg.RatePerTenant = 0, 0
	cfg.LogLevel = "warn" // the quota warnings, not every call

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

	var done atomic.Int64
	filled := make(chan error, 1)
	start := time.Now()
	go func() { filled <- fill.Run(ctx, conn, n, workers, &done) }() // exits when the fill ends
	tick := time.NewTicker(every)
	defer tick.Stop()
	metricsURL := "http://" + cfg.MetricsListen + "/metrics"
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
	return measure(ctx, cfg, n)
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
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "intentd_etcd_db_size_bytes":
			size = int64(v)
		case "intentd_etcd_db_size_in_use_bytes":
			inUse = int64(v)
		}
	}
	return size, inUse
}

// freePort returns a loopback address that was free a moment ago.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
