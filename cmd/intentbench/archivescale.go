package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// The archive workload's scale phase (only with --archive-scale; issue
// 26's "Scale" target): a new registration's latency (the Acquire of a
// cycle on a fresh key) and an archived replay's, at C=1 on the archived
// intentd with its smallest cache, first with the archive as the workload
// left it, then with the archive grown to --archive-scale rows in bulk
// (INSERT ... SELECT in PostgreSQL, not through the API: copies of one
// archived row under keys of their own, retained far into the future) and
// intentd restarted, so that its filter of archived keys loads them all.
// The figures are the p99s' ratios, large ÷ small (target ≤ 1.3 each).

// scaleBatch is how many rows one INSERT of the seeding adds.
const scaleBatch = 1_000_000

// scalePoint is one measurement of the scale phase.
type scalePoint struct {
	rows                 int64
	register, replay     []round
	filterKeys, filterMB float64
	loaded               time.Duration // from intentd's start until its filter was ready
	readsPerRegister     float64
}

// scale runs the phase over the replay phase's archived keys (and its
// restarted, small-cache intentd).
func (r *archiveRun) scale(ctx context.Context, replayKeys []string) error {
	b := r.b
	want := int64(b.cfg.archiveScale)
	small, err := r.scalePoint(ctx, replayKeys, time.Time{})
	if err != nil {
		return err
	}
	if small.rows >= want {
		return fmt.Errorf("archive, scale: --archive-scale %d is not more than the %d rows the archive already holds", want, small.rows)
	}
	t := time.Now()
	if err := r.seed(ctx, want-small.rows); err != nil {
		return err
	}
	seeded := time.Since(t)
	b.progress("archive, scale: restarting the archived intentd (its filter loads %d keys)", want)
	r.arch.close()
	started := time.Now()
	if r.arch, err = b.startIntentdBin(ctx, r.arch.name, "", nil, r.flags(true, true)...); err != nil {
		return err
	}
	large, err := r.scalePoint(ctx, replayKeys, started)
	if err != nil {
		return err
	}
	p99 := pctMs(0.99)
	r.fig.scaleRegister = ratio(over(large.register, p99).med, over(small.register, p99).med)
	r.fig.scaleReplay = ratio(over(large.replay, p99).med, over(small.replay, p99).med)

	fmt.Fprintf(b.out, "archive, scale: at C=%d on the archived intentd (--cache-bytes %d), a new registration (the Acquire of a cycle on a fresh key, its Complete untimed) and a replay of an archived intent, interleaved, %d rounds of %s; then %d rows added in bulk in %s and intentd restarted (its filter of archived keys ready %s after its start), and again\n",
		archiveLow, missCacheBytes, b.cfg.rounds, b.cfg.duration, want-small.rows, seeded.Round(time.Second), large.loaded.Round(100*time.Millisecond))
	rows := [][]string{{"archive rows", "registration p50 / p99 ms", "replay p50 / p99 ms", "archive reads/registration", "filter keys", "filter MiB"}}
	for _, p := range []scalePoint{small, large} {
		rows = append(rows, []string{num(float64(p.rows), 0), latencies(p.register), latencies(p.replay), num(p.readsPerRegister, 2), num(p.filterKeys, 0), num(p.filterMB, 1)})
	}
	rows = append(rows, []string{"large ÷ small, p99", num(r.fig.scaleRegister, 2), num(r.fig.scaleReplay, 2), "", "", ""})
	table(b.out, rows)
	return nil
}

// scalePoint waits for the archived intentd's filter, then times
// registrations against replays of keys.
func (r *archiveRun) scalePoint(ctx context.Context, keys []string, started time.Time) (scalePoint, error) {
	b := r.b
	var p scalePoint
	var err error
	if p.rows, err = r.rows(ctx); err != nil {
		return p, err
	}
	deadline := time.Now().Add(30 * time.Minute)
	for r.arch.metric("intentd_archive_filter_ready") != 1 {
		if err := r.arch.child.exited(); err != nil {
			return p, err
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("archive, scale: the filter of archived keys not ready after 30m")
		}
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if !started.IsZero() {
		p.loaded = time.Since(started)
	}
	p.filterKeys = r.arch.metric("intentd_archive_filter_keys")
	p.filterMB = r.arch.metric("intentd_archive_filter_bytes") / (1 << 20)
	ids, err := b.sessions(ctx, r.arch, 1, cycleTTL)
	if err != nil {
		return p, err
	}
	defer b.closeSessions(r.arch, ids)
	session := ids[0]
	register := func(ctx context.Context, _ int) (time.Duration, error) {
		key := b.key("sr")
		t := time.Now()
		token, err := b.acquireNew(ctx, r.arch, session, key)
		lat := time.Since(t)
		if err != nil {
			return 0, err
		}
		return lat, b.complete(ctx, r.arch, key, token)
	}
	var next atomic.Int64
	replay := b.replayOp(r.arch, session, keys, &next, nil)
	// The archive reads of registrations alone: none while the filter
	// rules every new key out.
	const alone = 200
	reads0 := r.arch.metric("intentd_archive_reads_total")
	for range alone {
		if _, err := register(ctx, 0); err != nil {
			return p, fmt.Errorf("archive, scale: %w", err)
		}
	}
	p.readsPerRegister = ratio(r.arch.metric("intentd_archive_reads_total")-reads0, alone)
	rs, err := b.interleave(ctx, "archive, scale", []peer{
		{"new registration", r.arch.proc, nil, register},
		{"archived replay", r.arch.proc, nil, replay},
	}, archiveLow)
	if err != nil {
		return p, err
	}
	p.register, p.replay = rs[0], rs[1]
	return p, nil
}

// seed adds n rows to the archive in batches: copies of one archived
// row (its tenant, fingerprint and data) under keys of their own,
// registered after every other row and retained for a century, then
// VACUUM ANALYZE, as autovacuum would leave a table that large.
func (r *archiveRun) seed(ctx context.Context, n int64) error {
	// The template: the newest row the workload archived through intentd.
	var tenant, key string
	if err := r.db.QueryRow(ctx, "SELECT tenant, key FROM intents ORDER BY registered_at DESC LIMIT 1").Scan(&tenant, &key); err != nil {
		return fmt.Errorf("archive, scale: the template row: %w", err)
	}
	for done := int64(0); done < n; {
		m := min(scaleBatch, n-done)
		r.b.progress("archive, scale: adding rows %d to %d of %d", done+1, done+m, n)
		_, err := r.db.Exec(ctx, `
INSERT INTO intents (registered_at, completed_at, retain_until, revision, state, tenant, key, fingerprint, parent, labels, data)
SELECT t.registered_at + g, t.completed_at + g, t.retain_until + 100::bigint*365*86400*1000000000, t.revision, t.state, t.tenant,
       'scale-' || $3 || '-' || g, t.fingerprint, t.parent, t.labels, t.data
FROM (SELECT * FROM intents WHERE tenant = $1 AND key = $2) t, generate_series($4::bigint, $5::bigint) g`,
			tenant, key, r.b.run, done+1, done+m)
		if err != nil {
			return fmt.Errorf("archive, scale: seeding: %w", err)
		}
		done += m
	}
	r.b.progress("archive, scale: VACUUM ANALYZE")
	if _, err := r.db.Exec(ctx, "VACUUM (ANALYZE) intents"); err != nil {
		return fmt.Errorf("archive, scale: VACUUM: %w", err)
	}
	return nil
}
