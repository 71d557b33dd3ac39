package daemon_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/run/fill"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// etcdStatus asks the embedded etcd of cfg for its status over its socket.
func etcdStatus(t *testing.T, cfg daemon.Config) *clientv3.StatusResponse {
	t.Helper()
	ep := "unix://" + cfg.EmbedSocket()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, ep)
	if err != nil {
		t.Fatalf("etcd status: %v", err)
	}
	return st
}

// Regression: the embedded etcd kept 24 hours of history under etcd's
// default 2 GiB quota, while a completed intent costs kilobytes retained
// and more with its history (see docs/PERFORMANCE.md, "The embedded
// store's size, measured"): minutes of load ended in NOSPACE, after which
// intentd only read. The default
// configuration must hold a million intents registered and completed back
// to back. The test runs that workload scaled down by k: the default
// quota, the default compaction window and the million intents are all
// divided by k, so that history kept per byte of quota is the default's.
// With the old defaults (2 GiB, 24 h) the scaled quota is 2 MiB and the
// scaled window 84 s, longer than the test: the fill ends in STORE_FULL.
// With the new ones (8 GiB, 5 m: 8 MiB and 0.3 s) it fits with room to
// spare.
func TestDefaultStoreDoesNotFillUp(t *testing.T) {
	const k = 1024
	def := daemon.DefaultConfig()
	window, err := time.ParseDuration(def.EmbedCompaction.Retention)
	if def.EmbedCompaction.Mode != "periodic" || err != nil {
		t.Fatalf("default compaction %+v: this test scales a periodic window", def.EmbedCompaction)
	}
	cfg := testConfig(t.TempDir())
	cfg.EmbedQuotaBytes = def.EmbedQuotaBytes / k
	cfg.EmbedCompaction.Retention = (window / k).String()
	cfg.RatePerPrincipal, cfg.RatePerTenant = 0, 0 // the store is under test, not the limits
	in := start(t, cfg)
	n := 1_000_000 / k
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := fill.Run(ctx, in.conn, n, 16, nil); err != nil {
		t.Fatalf("filling %d intents into a %d-byte quota compacted every %s: %v, want no error", n, cfg.EmbedQuotaBytes, cfg.EmbedCompaction.Retention, err)
	}
	st := etcdStatus(t, cfg)
	t.Logf("%d intents: db %d bytes (%d per intent), in use %d, quota %d", n, st.DbSize, st.DbSize/int64(n), st.DbSizeInUse, st.DbSizeQuota)
	if limit := int64(0.8 * float64(st.DbSizeQuota)); st.DbSize > limit {
		t.Errorf("db %d bytes after %d intents, want at most 80%% of the quota (%d): compaction does not keep up", st.DbSize, n, limit)
	}
}

// metricValue returns the value of the unlabelled metric name in a
// Prometheus text exposition.
func metricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// An etcd filling up is visible before it is full: /metrics shows its size,
// what of it is in use, and its quota, and the log warns from 80 % of the
// quota on, naming the flag that raises it.
func TestFillingStoreIsMeasuredAndWarned(t *testing.T) {
	metricsAddr := freeAddr(t)
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = metricsAddr
	cfg.EmbedQuotaBytes = 8 << 20
	cfg.RatePerPrincipal, cfg.RatePerTenant = 0, 0
	cfg.HealthInterval = 20 * time.Millisecond // the size is checked every 5 of them
	addr, logs := runLogged(t, cfg)
	conn := dialWith(t, addr, insecure.NewCredentials())
	c := intentv1.NewIntentServiceClient(conn)
	big := strings.Repeat("x", 60<<10)
	const warning = "etcd's database is filling up"
	for i := 0; !strings.Contains(logs.String(), warning); i++ {
		if i == 200 {
			t.Fatalf("no warning after %d intents of 60 KB in an 8 MiB quota; log:\n%s", i, logs.String())
		}
		p, err := structpb.NewStruct(map[string]any{"note": big, "n": float64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Register(call(t), &intentv1.RegisterRequest{Key: fmt.Sprintf("big-%d", i), Params: p}); err != nil {
			t.Fatalf("Register big-%d: %v (the warning should come first)", i, err)
		}
		time.Sleep(20 * time.Millisecond) // let the 100 ms size check see each step
	}
	for _, want := range []string{"used_percent=8", "quota_bytes=8388608", "--embed-quota-bytes"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("warning lacks %q:\n%s", want, logs.String())
		}
	}
	b := scrape(t, metricsAddr)
	size, okSize := metricValue(b, "intentd_etcd_db_size_bytes")
	inUse, okInUse := metricValue(b, "intentd_etcd_db_size_in_use_bytes")
	quota, okQuota := metricValue(b, "intentd_etcd_db_quota_bytes")
	if !okSize || !okInUse || !okQuota {
		t.Fatalf("/metrics lacks the etcd database gauges:\n%s", b)
	}
	if quota != 8<<20 || size < 0.8*quota || inUse <= 0 || inUse > size {
		t.Errorf("db size %v, in use %v, quota %v: want quota 8388608, size at least 80%% of it, 0 < in use <= size", size, inUse, quota)
	}
}

// With an external cluster the same gauges come from etcd's Status call:
// the fullest member's size and its quota.
func TestExternalEtcdSizeIsMeasured(t *testing.T) {
	srv := etcdtest.StartWith(t, t.TempDir(), func(c *embed.Config) { c.QuotaBackendBytes = 64 << 20 })
	cfg := testConfig(t.TempDir())
	cfg.EtcdEndpoints = srv.Endpoints
	cfg.MetricsListen = freeAddr(t)
	start(t, cfg)
	waitFor(t, "/metrics shows the external etcd's size and quota", func() bool {
		b := scrape(t, cfg.MetricsListen)
		quota, _ := metricValue(b, "intentd_etcd_db_quota_bytes")
		size, _ := metricValue(b, "intentd_etcd_db_size_bytes")
		return quota == 64<<20 && size > 0
	})
}
