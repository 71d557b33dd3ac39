package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/intentd/intentd/archive"
	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/etcdstore/tombstones"
)

// The archive (issue 26): with --archive-dsn, final intents move from etcd
// to PostgreSQL after --archive-after (the store's archiver, under the
// janitor), and every read that misses etcd asks there. The daemon opens
// it at start (its migrations run), hands the store an adapter of it
// (archiveAdapter, which also times and counts each call for /metrics),
// expires what it holds past retention while this replica is the janitor,
// probes it for readiness (degraded, never not ready: calls on live
// intents do not need it) and closes its pool last.

// ArchiveDSNError is a --archive-dsn intentd cannot start with: it does not
// parse, or PostgreSQL refused it or did not answer within --dial-timeout.
// intentd exits 2 on it, as on a bad flag. Its text names the flag and
// never holds the DSN's password.
type ArchiveDSNError struct{ err error }

func (e *ArchiveDSNError) Error() string { return "intentd: --archive-dsn: " + e.err.Error() }
func (e *ArchiveDSNError) Unwrap() error { return e.err }

// checkArchiveDSN reports whether dsn parses, the error without its
// password.
func checkArchiveDSN(dsn string) error {
	if strings.TrimSpace(dsn) == "" {
		return errors.New("empty")
	}
	if _, err := pgconn.ParseConfig(dsn); err != nil {
		return errors.New(redact(oneLine(err.Error()), dsn))
	}
	return nil
}

// redact removes dsn's password from s, wherever pgx's messages might
// quote it.
func redact(s, dsn string) string {
	if cfg, err := pgconn.ParseConfig(dsn); err == nil && cfg.Password != "" {
		s = strings.ReplaceAll(s, cfg.Password, "xxxxx")
	}
	// An unparsable DSN: its password may still stand in it, as a URL's
	// user:password@ or a password=... pair.
	if i := strings.Index(dsn, "://"); i >= 0 {
		rest := dsn[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				if pw := rest[colon+1 : at]; pw != "" {
					s = strings.ReplaceAll(s, pw, "xxxxx")
				}
			}
		}
	}
	for f := range strings.FieldsSeq(dsn) {
		if pw, ok := strings.CutPrefix(f, "password="); ok && pw != "" {
			s = strings.ReplaceAll(s, pw, "xxxxx")
		}
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// openArchive opens the archive cfg names (nil without --archive-dsn),
// waiting at most DialTimeout for PostgreSQL to answer and the schema to be
// brought to this build's version.
func openArchive(ctx context.Context, cfg Config, log *slog.Logger) (*archive.Archive, error) {
	if cfg.ArchiveDSN == "" {
		return nil, nil
	}
	if err := checkArchiveDSN(cfg.ArchiveDSN); err != nil {
		return nil, &ArchiveDSNError{err: err}
	}
	octx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	a, err := archive.Open(octx, cfg.ArchiveDSN, archive.Options{TombstoneRetention: cfg.Store.TombstoneRetention, Now: cfg.Store.Now})
	if err != nil {
		what := "PostgreSQL refused it"
		if errors.Is(err, archive.ErrUnavailable) {
			what = fmt.Sprintf("PostgreSQL did not answer within --dial-timeout %v", cfg.DialTimeout)
		}
		return nil, &ArchiveDSNError{err: fmt.Errorf("%s: %s", what, redact(oneLine(err.Error()), cfg.ArchiveDSN))}
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	v, _ := a.SchemaVersion(pctx)
	log.Info("archive open", "schema_version", v, "archive_after", cfg.Store.ArchiveAfter)
	return a, nil
}

// archiveAdapter is etcdstore.Archive on package archive: the two
// packages' types convert one for one. Each call is timed and counted.
type archiveAdapter struct {
	a *archive.Archive
	m *archiveMetrics
}

// staleTries bounds the calls of one archive operation (staleTry).
const staleTries = 8

// staleWithin is how soon a failed attempt must fail for staleTry to try
// again: a connection PostgreSQL closed while it sat in the pool (a
// restart, a failover) fails its next call at once.
const staleWithin = 250 * time.Millisecond

// staleTry runs f, an idempotent call of the archive, and again while it
// fails at once as unavailable: after PostgreSQL restarted, each pooled
// connection it closed fails the first call that takes it (pgx pings only
// a connection idle for more than a second before handing it out), and
// the pool drops it. A call that waited (PostgreSQL does not answer) is
// not repeated: its caller's deadline is spent.
func staleTry(ctx context.Context, f func() error) error {
	var err error
	for range staleTries {
		start := time.Now()
		if err = f(); err == nil || !errors.Is(err, archive.ErrUnavailable) || ctx.Err() != nil || time.Since(start) > staleWithin {
			return err
		}
	}
	return err
}

func (ad archiveAdapter) Put(ctx context.Context, recs []etcdstore.ArchivedRecord) error {
	rs := make([]archive.Record, len(recs))
	for i, r := range recs {
		rs[i] = archive.Record(r)
	}
	defer ad.m.observe("put", time.Now())
	return ad.m.failed(staleTry(ctx, func() error { return ad.a.Put(ctx, rs) }))
}

func (ad archiveAdapter) Get(ctx context.Context, tenant, key string) (etcdstore.ArchivedRecord, bool, error) {
	defer ad.m.observe("get", time.Now())
	var r archive.Record
	var ok bool
	err := staleTry(ctx, func() (err error) { r, ok, err = ad.a.Get(ctx, tenant, key); return err })
	return etcdstore.ArchivedRecord(r), ok, ad.m.failed(err)
}

func (ad archiveAdapter) Tombstone(ctx context.Context, tenant, key string) (tombstones.Entry, bool, error) {
	defer ad.m.observe("tombstone", time.Now())
	var e tombstones.Entry
	var ok bool
	err := staleTry(ctx, func() (err error) { e, ok, err = ad.a.Tombstone(ctx, tenant, key); return err })
	return e, ok, ad.m.failed(err)
}

func (ad archiveAdapter) PutTombstones(ctx context.Context, entries []tombstones.Entry) error {
	defer ad.m.observe("put_tombstones", time.Now())
	return ad.m.failed(staleTry(ctx, func() error { return ad.a.PutTombstones(ctx, entries) }))
}

func (ad archiveAdapter) List(ctx context.Context, q etcdstore.ArchiveQuery) ([]etcdstore.ArchivedRecord, error) {
	aq := archive.Query{Tenant: q.Tenant, State: q.State, Label: q.Label, Parent: q.Parent, Limit: q.Limit}
	if q.After != nil {
		aq.After = &archive.Cursor{RegisteredAt: q.After.RegisteredAt, Key: q.After.Key}
	}
	defer ad.m.observe("list", time.Now())
	var rs []archive.Record
	if err := staleTry(ctx, func() (err error) { rs, err = ad.a.List(ctx, aq); return err }); err != nil {
		return nil, ad.m.failed(err)
	}
	out := make([]etcdstore.ArchivedRecord, len(rs))
	for i, r := range rs {
		out[i] = etcdstore.ArchivedRecord(r)
	}
	return out, nil
}

// Hashes streams every archived key's hash, for the store's filter of
// archived keys; not retried (the filter loads again after a failure).
func (ad archiveAdapter) Hashes(ctx context.Context, fn func(tombstones.Hash) error) error {
	defer ad.m.observe("hashes", time.Now())
	return ad.m.failed(ad.a.Hashes(ctx, fn))
}

// archiveMetrics is what /metrics shows of the archive beyond the store's
// own figures (etcdstore.ArchiveStats): each call's latency by operation,
// failures by kind, the archive's rows and bytes from its last Stats, and
// whether it failed the last probe.
type archiveMetrics struct {
	calls  *prometheus.HistogramVec
	errors *prometheus.CounterVec
	rows   *prometheus.GaugeVec
	bytes  *prometheus.GaugeVec
	down   prometheus.Gauge
	expire *prometheus.CounterVec
}

func newArchiveMetrics() *archiveMetrics {
	m := &archiveMetrics{
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "intentd_archive_call_duration_seconds", Help: "Duration of this replica's calls to the archive (PostgreSQL) by operation: get, tombstone and list are reads (a key etcd does not hold, a listing's page), put and put_tombstones the archiver's moves; failed calls included.",
			Buckets: []float64{.0002, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "intentd_archive_errors_total", Help: "Failed archive calls by kind: unavailable (PostgreSQL did not answer in time, refused the connection or went away: callers got ARCHIVE_UNAVAILABLE), refused (PostgreSQL answered with an error), corrupt (an archived record that did not decode), expire (a failed expiry pass).",
		}, []string{"kind"}),
		rows: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "intentd_archive_rows", Help: "Rows in the archive by table (intents, tombstones), as PostgreSQL's statistics count them, at the last size check.",
		}, []string{"table"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "intentd_archive_bytes", Help: "Total relation size of the archive's tables (heap, TOAST, indexes) by table, at the last size check.",
		}, []string{"table"}),
		down: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "intentd_archive_unavailable", Help: "1 while the archive (PostgreSQL) did not answer the last probe: calls that need it get ARCHIVE_UNAVAILABLE and archiving pauses (live intents are not affected); 0 while it answers, and without --archive-dsn.",
		}),
		expire: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "intentd_archive_expired_total", Help: "What the archive's expiry did on this replica: archived intents past their retention turned into tombstones (tombstoned), tombstones dropped with their month (tombstones_dropped).",
		}, []string{"action"}),
	}
	for _, op := range []string{"get", "tombstone", "list", "put", "put_tombstones"} {
		m.calls.WithLabelValues(op)
	}
	for _, k := range []string{"unavailable", "refused", "expire"} {
		m.errors.WithLabelValues(k)
	}
	for _, t := range []string{"intents", "tombstones"} {
		m.rows.WithLabelValues(t)
		m.bytes.WithLabelValues(t)
	}
	for _, a := range []string{"tombstoned", "tombstones_dropped"} {
		m.expire.WithLabelValues(a)
	}
	return m
}

// observe records the time a call of op begun at start took (deferred
// with start evaluated at the call's beginning).
func (m *archiveMetrics) observe(op string, start time.Time) {
	m.calls.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// failed counts err by kind, and returns it.
func (m *archiveMetrics) failed(err error) error {
	switch {
	case err == nil:
	case errors.Is(err, archive.ErrUnavailable):
		m.errors.WithLabelValues("unavailable").Inc()
	case errors.Is(err, context.Canceled):
		// The caller gave up: nobody's failure.
	default:
		m.errors.WithLabelValues("refused").Inc()
	}
	return err
}

// register adds the archive's metrics, and the store's figures of it read
// at scrape time, to m: also without an archive (all zero then), so that
// dashboards and alerts find the same series on every replica.
func (am *archiveMetrics) register(m *metrics, store *etcdstore.Store) {
	stats := store.ArchiveStats
	m.registry.MustRegister(am.calls, am.errors, am.rows, am.bytes, am.down, am.expire,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_archive_lag_seconds", Help: "How far the oldest final intent etcd still held at the archiver's last pass is past --archive-after (0: none overdue); grows while the archive is down or the archiver behind. Only the janitor replica's figure moves.",
		}, func() float64 { return stats().Lag.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_archive_oldest_final_seconds", Help: "Age of the oldest final intent etcd held at the archiver's last pass (0: none).",
		}, func() float64 { return stats().OldestFinal.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "intentd_archive_moved_total", Help: "Final intents this replica moved from etcd to the archive (rate(): moved per second).",
		}, func() float64 { return float64(stats().Moved) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "intentd_archive_reads_total", Help: "Reads of the store that asked the archive (a key etcd does not hold, a listing's page), failed ones included.",
		}, func() float64 { return float64(stats().Reads) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "intentd_archive_corrupt_records_total", Help: "Archived records that did not decode (answered as an internal fault of the archive, never as absent).",
		}, func() float64 { return float64(stats().Corrupt) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_archive_filter_ready", Help: "1 while this replica's filter of archived keys is loaded and follows the moves: a key etcd does not hold is then known new without asking the archive (registrations continue while PostgreSQL is down); 0 while it loads or after its watch failed (every such key asks the archive).",
		}, func() float64 {
			if stats().FilterReady {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_archive_filter_keys", Help: "Keys in this replica's filter of archived keys (it only grows until the replica restarts).",
		}, func() float64 { return float64(stats().FilterKeys) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_archive_filter_bytes", Help: "Memory of this replica's filter of archived keys (1.8 to 3.6 bytes a key).",
		}, func() float64 { return float64(stats().FilterBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "intentd_archive_lookups_skipped_total", Help: "Lookups of a key etcd does not hold that the filter of archived keys answered (never archived) without asking PostgreSQL.",
		}, func() float64 { return float64(stats().FilterRuledOut) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "intentd_archive_lookups_passed_total", Help: "Lookups the loaded filter of archived keys sent to PostgreSQL: archived keys, and its false positives (about 0.1 % of new keys per filter).",
		}, func() float64 { return float64(stats().FilterPassed) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "intentd_archive_backfilled", Help: "1 once this replica's archiver went through every final record in etcd since it was last elected janitor (records finished before the archive was turned on included), else 0.",
		}, func() float64 {
			if stats().Backfilled {
				return 1
			}
			return 0
		}),
	)
}

// stats records one Stats of the archive.
func (am *archiveMetrics) stats(st archive.Stats) {
	am.rows.WithLabelValues("intents").Set(float64(st.Intents))
	am.rows.WithLabelValues("tombstones").Set(float64(st.Tombstones))
	am.bytes.WithLabelValues("intents").Set(float64(st.IntentBytes))
	am.bytes.WithLabelValues("tombstones").Set(float64(st.TombstoneBytes))
}

// archiveHealth is what readiness says of the archive: "" while it
// answers, else why not.
type archiveHealth struct {
	mu     sync.Mutex
	reason string
}

func (h *archiveHealth) set(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reason = reason
}

func (h *archiveHealth) get() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason
}

// watchArchive probes the archive every interval (PostgreSQL answers a
// ping within timeout), telling readiness and intentd_archive_up, and
// reads its size every sizeEvery, until ctx ends.
func watchArchive(ctx context.Context, a *archive.Archive, am *archiveMetrics, ready *readiness, every, sizeEvery, timeout time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	var lastSize time.Time
	last := ""
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := a.Ping(pctx)
		if err == nil && time.Since(lastSize) >= sizeEvery {
			var st archive.Stats
			if st, err = a.Stats(pctx); err == nil {
				am.stats(st)
				lastSize = time.Now()
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		reason := ""
		if err != nil {
			reason = "archive: " + oneLine(err.Error())
			if errors.Is(err, archive.ErrUnavailable) {
				reason = fmt.Sprintf("archive: PostgreSQL does not answer (%s)", oneLine(err.Error()))
			}
			am.down.Set(1)
		} else {
			am.down.Set(0)
		}
		ready.degrade(reason)
		if reason != last {
			if reason == "" {
				log.Info("archive answers again")
			} else {
				log.Warn("archive degraded: calls that need an archived intent get ARCHIVE_UNAVAILABLE, archiving pauses; live intents are not affected", "reason", reason)
			}
			last = reason
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// archiveExpireEvery is how often the janitor replica expires the
// archive: archived intents past their retention become tombstones, months
// of expired tombstones are dropped.
const archiveExpireEvery = time.Minute

// janitorLease tells whether this replica is the janitor: the janitor's
// report marks each pass, and a replica that passed within the last few
// janitor intervals leads.
type janitorLease struct {
	last  atomic.Int64 // Unix ns of the last pass, 0 for none
	every time.Duration
}

func (j *janitorLease) passed(now time.Time) { j.last.Store(now.UnixNano()) }

func (j *janitorLease) leading(now time.Time) bool {
	l := j.last.Load()
	return l != 0 && now.Sub(time.Unix(0, l)) < 3*j.every
}

// expireArchive runs the archive's Expire every archiveExpireEvery while
// this replica is the janitor (several at once would share the work:
// Expire skips the rows another holds), until ctx ends.
func expireArchive(ctx context.Context, a *archive.Archive, lead *janitorLease, now func() time.Time, am *archiveMetrics, log *slog.Logger) {
	t := time.NewTicker(archiveExpireEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !lead.leading(time.Now()) {
			continue
		}
		st, err := a.Expire(ctx, now())
		am.expire.WithLabelValues("tombstoned").Add(float64(st.Tombstoned))
		am.expire.WithLabelValues("tombstones_dropped").Add(float64(st.TombstonesDropped))
		switch {
		case err != nil && ctx.Err() == nil:
			am.errors.WithLabelValues("expire").Inc()
			log.Warn("archive expiry failed", "err", err)
		case st != archive.ExpireStats{}:
			log.Info("archive expiry", "tombstoned", st.Tombstoned, "partitions_dropped", st.PartitionsDropped,
				"tombstones_dropped", st.TombstonesDropped, "partitions_packed", st.PartitionsPacked)
		}
	}
}
