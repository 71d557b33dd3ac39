package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/intentd/intentd/etcdstore"
)

// metrics is what intentd exports to Prometheus: gRPC calls by method and
// code (with latency histograms), the store's commits, conflicts,
// ambiguous commits and replays from memory, intents sent to review after
// too many attempts, the janitor's work, how full etcd's database is, and
// the Go runtime.
type metrics struct {
	registry *prometheus.Registry
	grpc     *grpcprom.ServerMetrics
	sweeps   *prometheus.CounterVec
	overdue  prometheus.Gauge
	// dbSize, dbInUse and dbQuota are the fullest etcd member's database
	// (see dbStatus).
	dbSize, dbInUse, dbQuota prometheus.Gauge
}

func newMetrics(store *etcdstore.Store) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets([]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}))),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "intentd_janitor_items_total", Help: "Intents the janitor changed, by what it did.",
		}, []string{"action"}),
		overdue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "intentd_overdue_unfinished_intents", Help: "Intents registered longer than the default retention ago and still not final, at the last janitor pass.",
		}),
		dbSize: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "intentd_etcd_db_size_bytes", Help: "Size of the fullest etcd member's database file: what etcd holds against its quota.",
		}),
		dbInUse: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "intentd_etcd_db_size_in_use_bytes", Help: "Bytes of that database in use; the rest are free pages, reused before the file grows.",
		}),
		dbQuota: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "intentd_etcd_db_quota_bytes", Help: "That member's backend quota: past it etcd only reads and deletes (0: etcd does not say).",
		}),
	}
	counter := func(name, help string, f func(etcdstore.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(store.Stats())) })
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.grpc, m.sweeps, m.overdue, m.dbSize, m.dbInUse, m.dbQuota,
		counter("intentd_store_commits_total", "Transitions written to etcd.", func(s etcdstore.Stats) int64 { return s.Commits }),
		counter("intentd_store_conflicts_total", "Writes whose compare failed and were decided again.", func(s etcdstore.Stats) int64 { return s.Conflicts }),
		counter("intentd_store_ambiguous_commits_total", "Writes with an unknown outcome, resolved by reading back.", func(s etcdstore.Stats) int64 { return s.Ambiguous }),
		counter("intentd_store_replays_from_memory_total", "Final intents replayed without touching etcd.", func(s etcdstore.Stats) int64 { return s.Replays }),
		counter("intentd_intents_attempts_exhausted_total", "Intents moved to NEEDS_REVIEW because max_attempts of their attempts ended without a report (leases lapsed, MarkUnknown).", func(s etcdstore.Stats) int64 { return s.AttemptsExhausted }),
	)
	return m
}

// sweep records one janitor pass.
func (m *metrics) sweep(r etcdstore.SweepReport) {
	m.sweeps.WithLabelValues("lapsed").Add(float64(r.Lapsed))
	m.sweeps.WithLabelValues("removed").Add(float64(r.Removed))
	m.sweeps.WithLabelValues("tombstone_removed").Add(float64(r.TombstonesRemoved))
	m.overdue.Set(float64(r.Overdue))
}

// db records the fullest etcd member's database size.
func (m *metrics) db(st dbStatus) {
	m.dbSize.Set(float64(st.size))
	m.dbInUse.Set(float64(st.inUse))
	m.dbQuota.Set(float64(st.quota))
}

// serve serves /metrics, /healthz and /readyz on addr until ctx ends.
// Exits when ctx ends.
func (m *metrics) serve(ctx context.Context, addr string, ready *readiness, log *slog.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", ready.readyz)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { // exits when ctx ends
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	log.Info("metrics serving", "addr", lis.Addr().String())
	if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
