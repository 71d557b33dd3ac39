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
	"github.com/intentd/intentd/internal/run/console"
)

// metrics is what intentd exports to Prometheus: gRPC calls by method and
// code (with latency histograms); what workers were told (Acquire outcomes,
// stale-token refusals, fingerprint conflicts); what became of attempts
// (MarkUnknown, lapsed leases, intents sent to review after too many);
// the review queue's depth and the open sessions; the store's commits,
// conflicts, ambiguous commits, replays from memory, etcd transaction
// latency and how many transitions each transaction carried; the
// janitor's work; readiness; how full etcd's database is; and
// the Go runtime. The metrics table of docs/OPERATIONS.md ("Metrics")
// lists every name, and a test holds it to /metrics.
type metrics struct {
	registry *prometheus.Registry
	grpc     *grpcprom.ServerMetrics
	answers  answers
	txn      *prometheus.HistogramVec
	// txnRead and txnWrite are txn's two children, resolved once.
	txnRead, txnWrite prometheus.Observer
	// batch is the group commit's transitions per etcd transaction.
	batch   prometheus.Histogram
	sweeps  *prometheus.CounterVec
	overdue prometheus.Gauge
	// queue (by state) and sessions are counted across tenants (see
	// etcdstore.Store.Depths).
	queue    *prometheus.GaugeVec
	sessions prometheus.Gauge
	// final counts the final records etcd holds (with an archive: not
	// moved yet), beside intentd_archive_rows.
	final prometheus.Gauge
	// dbSize, dbInUse and dbQuota are the fullest etcd member's database
	// (see dbStatus).
	dbSize, dbInUse, dbQuota prometheus.Gauge
	// formats answers GET /formats (formats.go), once the replica joined.
	formats http.Handler
}

// newMetrics builds intentd's own metrics; exportStore and
// exportReadiness add those read at scrape time, once their sources exist
// (the store's transaction latency is observed from its first call, so the
// metrics come before the store).
func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		answers:  newAnswers(),
		txn: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "intentd_etcd_txn_duration_seconds", Help: "Duration of the store's etcd transactions (kind: read, or write when it puts or deletes), failed ones included.",
			Buckets: []float64{.0002, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"kind"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "intentd_store_batch_transitions", Help: "Transitions each etcd transaction of the group commit carried: calls on distinct intents that arrive while earlier transactions are in flight share one (1: a write that went alone).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "intentd_review_queue_intents", Help: "Intents waiting for a reviewer, by state (UNKNOWN, NEEDS_REVIEW), across tenants; the same figure from every replica.",
		}, []string{"state"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "intentd_sessions_open", Help: "Worker sessions open (not closed, not lapsed), across tenants; the same figure from every replica.",
		}),
		final: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "intentd_etcd_final_intents", Help: "Final intents etcd holds, across tenants (with an archive: those not moved to it yet; intentd_archive_rows counts the archive's); the same figure from every replica.",
		}),
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
	m.txnRead, m.txnWrite = m.txn.WithLabelValues("read"), m.txn.WithLabelValues("write")
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.grpc, m.answers.outcomes, m.answers.stale, m.answers.fingerprint, m.txn, m.batch,
		m.sweeps, m.overdue, m.queue, m.sessions, m.final, m.dbSize, m.dbInUse, m.dbQuota,
	)
	for _, st := range []string{"UNKNOWN", "NEEDS_REVIEW"} {
		m.queue.WithLabelValues(st)
	}
	for _, a := range []string{"lapsed", "removed", "tombstone_removed"} {
		m.sweeps.WithLabelValues(a)
	}
	return m
}

// exportStore exports the store's counters, read at scrape time.
func (m *metrics) exportStore(store *etcdstore.Store) {
	stats := store.Stats
	counter := func(name, help string, f func(etcdstore.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(stats())) })
	}
	lapses := prometheus.NewDesc("intentd_lease_lapses_total",
		"Leases found lapsed without a report (the holder's session ended) and recorded, by the path that noticed first: acquire or janitor.",
		[]string{"noticed_by"}, nil)
	cacheBytes := prometheus.NewDesc("intentd_store_cache_bytes",
		"Estimated heap held by the store's caches (records, sessions), together at most --cache-bytes.",
		[]string{"cache"}, nil)
	cacheEntries := prometheus.NewDesc("intentd_store_cache_entries",
		"Entries in the store's caches (records, sessions).",
		[]string{"cache"}, nil)
	m.registry.MustRegister(
		counter("intentd_store_commits_total", "Transitions written to etcd.", func(s etcdstore.Stats) int64 { return s.Commits }),
		counter("intentd_store_conflicts_total", "Writes whose compare failed and were decided again.", func(s etcdstore.Stats) int64 { return s.Conflicts }),
		counter("intentd_store_ambiguous_commits_total", "Writes with an unknown outcome, resolved by reading back.", func(s etcdstore.Stats) int64 { return s.Ambiguous }),
		counter("intentd_store_replays_from_memory_total", "Final intents replayed without touching etcd.", func(s etcdstore.Stats) int64 { return s.Replays }),
		counter("intentd_intents_attempts_exhausted_total", "Intents moved to NEEDS_REVIEW because max_attempts of their attempts ended without a report (leases lapsed, MarkUnknown).", func(s etcdstore.Stats) int64 { return s.AttemptsExhausted }),
		counter("intentd_marked_unknown_total", "Accepted MarkUnknown reports that moved an intent to UNKNOWN: a worker could not tell whether its call took effect.", func(s etcdstore.Stats) int64 { return s.MarkedUnknown }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_etcd_revision", Help: "Highest etcd revision this replica has seen (its revision floor): an etcd restored from a snapshot must be bumped above it, or intentd refuses it.",
		}, func() float64 { return float64(store.HighestRevision()) }),
		collectFunc{desc: cacheBytes, collect: func(ch chan<- prometheus.Metric) {
			u := store.CacheUsage()
			ch <- prometheus.MustNewConstMetric(cacheBytes, prometheus.GaugeValue, float64(u.RecordBytes), "records")
			ch <- prometheus.MustNewConstMetric(cacheBytes, prometheus.GaugeValue, float64(u.SessionBytes), "sessions")
		}},
		collectFunc{desc: cacheEntries, collect: func(ch chan<- prometheus.Metric) {
			u := store.CacheUsage()
			ch <- prometheus.MustNewConstMetric(cacheEntries, prometheus.GaugeValue, float64(u.Records), "records")
			ch <- prometheus.MustNewConstMetric(cacheEntries, prometheus.GaugeValue, float64(u.Sessions), "sessions")
		}},
		collectFunc{desc: lapses, collect: func(ch chan<- prometheus.Metric) {
			st := stats()
			ch <- prometheus.MustNewConstMetric(lapses, prometheus.CounterValue, float64(st.LapsesByAcquire), "acquire")
			ch <- prometheus.MustNewConstMetric(lapses, prometheus.CounterValue, float64(st.LapsesByJanitor), "janitor")
		}},
	)
}

// exportReadiness exports r as intentd_ready.
func (m *metrics) exportReadiness(r *readiness) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "intentd_ready", Help: "1 while this replica is ready (gRPC health SERVING, /readyz 200: etcd answers and its revision did not go back), else 0.",
	}, func() float64 {
		if r.state() == "" {
			return 1
		}
		return 0
	}))
}

// watchDepths counts the review queue and the open sessions every
// interval until ctx ends; a failed count keeps the last figures (etcd
// being away shows in intentd_ready).
func watchDepths(ctx context.Context, store *etcdstore.Store, every time.Duration, m *metrics, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		d, err := store.Depths(ctx)
		switch {
		case err == nil:
			m.depths(d)
		case ctx.Err() == nil:
			log.Debug("counting the review queue failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observeTxn is etcdstore.Config.ObserveTxn.
func (m *metrics) observeTxn(write bool, d time.Duration) {
	if write {
		m.txnWrite.Observe(d.Seconds())
	} else {
		m.txnRead.Observe(d.Seconds())
	}
}

// observeBatch is etcdstore.Config.ObserveBatch.
func (m *metrics) observeBatch(transitions int) { m.batch.Observe(float64(transitions)) }

// depths records the review queue's depth and the open sessions.
func (m *metrics) depths(d etcdstore.Depths) {
	m.queue.WithLabelValues("UNKNOWN").Set(float64(d.Unknown))
	m.queue.WithLabelValues("NEEDS_REVIEW").Set(float64(d.NeedsReview))
	m.sessions.Set(float64(d.Sessions))
	m.final.Set(float64(d.Final))
}

// collectFunc is a collector of one metric family read at scrape time.
type collectFunc struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectFunc) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c collectFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

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

// serve serves /metrics, /healthz, /readyz and the review console (if
// review is not nil) on addr until ctx ends.
// Exits when ctx ends.
func (m *metrics) serve(ctx context.Context, addr string, ready *readiness, review http.Handler, log *slog.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", ready.readyz)
	if m.formats != nil {
		mux.Handle("GET /formats", m.formats)
	}
	if review != nil {
		mountConsole(mux, review)
	}
	log.Info("metrics serving", "addr", lis.Addr().String())
	if review != nil {
		log.Info("review console serving", "url", "http://"+lis.Addr().String()+console.Path)
	}
	return serveHTTP(ctx, lis, mux)
}

// mountConsole serves the review console on mux, at console.Path.
func mountConsole(mux *http.ServeMux, review http.Handler) {
	mux.Handle(console.Path, review)
	mux.Handle("GET /console", http.RedirectHandler(console.Path, http.StatusMovedPermanently))
}

// serveHTTP serves h on lis until ctx ends, then lets requests in flight
// finish for up to two seconds.
func serveHTTP(ctx context.Context, lis net.Listener, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { // exits when ctx ends
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// consoleBesideMetrics is the console the metrics listener serves: review,
// unless --console-listen gives it a listener of its own.
func consoleBesideMetrics(cfg Config, review http.Handler) http.Handler {
	if cfg.ConsoleListen != "" {
		return nil
	}
	return review
}

// serveConsole serves the review console alone at addr (empty: off; the
// metrics listener serves it), and / as a redirect to it, so that a proxy
// in front of it reaches neither /metrics nor the health endpoints. Its
// failure is logged, not fatal, as the metrics listener's: gRPC goes on
// serving.
func serveConsole(addr string, review http.Handler, log *slog.Logger) component {
	return func(ctx context.Context) error {
		if addr == "" {
			<-ctx.Done()
			return nil
		}
		lis, err := net.Listen("tcp", addr)
		if err == nil {
			mux := http.NewServeMux()
			mountConsole(mux, review)
			mux.Handle("GET /{$}", http.RedirectHandler(console.Path, http.StatusFound))
			log.Info("review console serving", "url", "http://"+lis.Addr().String()+console.Path)
			err = serveHTTP(ctx, lis, mux)
		}
		if err != nil {
			log.Error("console listener failed; serving gRPC without the review console", "addr", addr, "err", err)
			<-ctx.Done()
		}
		return nil
	}
}
