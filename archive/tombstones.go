package archive

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
)

func subFS() (fs.FS, error) {
	f, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, fmt.Errorf("archive: migrations: %w", err)
	}
	return f, nil
}

// maxDay is the last day until_day (a smallint) holds: 2059-09-18. A
// tombstone kept past it is kept until it (a tombstone retention of more
// than 30 years).
const maxDay = math.MaxInt16

const day = 24 * time.Hour

// month is a tombstone partition: the entries whose until_day falls in
// one calendar month (UTC), counted as year*12 + month-1.
type month int

func monthOfDay(d uint16) month {
	t := time.Unix(int64(d)*86400, 0).UTC()
	return month(t.Year()*12 + int(t.Month()) - 1)
}

func (m month) start() time.Time {
	return time.Date(int(m)/12, time.Month(int(m)%12+1), 1, 0, 0, 0, 0, time.UTC)
}

// days is the partition's range of until_day, [from, to); to is -1 past
// maxDay (MAXVALUE).
func (m month) days() (from, to int) {
	from = int(m.start().Unix() / 86400)
	to = int((m + 1).start().Unix() / 86400)
	if to > maxDay {
		to = -1
	}
	return from, to
}

func (m month) table() string {
	return fmt.Sprintf("tombstones_y%04dm%02d", int(m)/12, int(m)%12+1)
}

func parseTable(name string) (month, bool) {
	rest, ok := strings.CutPrefix(name, "tombstones_y")
	if !ok || len(rest) != 7 || rest[4] != 'm' {
		return 0, false
	}
	y, err1 := strconv.Atoi(rest[:4])
	mo, err2 := strconv.Atoi(rest[5:])
	if err1 != nil || err2 != nil || mo < 1 || mo > 12 {
		return 0, false
	}
	return month(y*12 + mo - 1), true
}

// partitionLockID serializes the creation of tombstone partitions among
// processes ("tombpart").
const partitionLockID = 0x746f6d6270617274

// ensureAhead creates the tombstone partitions from now's month to the
// month a tombstone made now will end in, and the one after.
func (a *Archive) ensureAhead(ctx context.Context, now time.Time) error {
	first := monthOfDay(tombstones.Today(now))
	last := monthOfDay(clampDay(tombstones.Today(now.Add(a.opts.TombstoneRetention)) + 1))
	var ms []month
	for m := first; m <= last+1; m++ {
		if from, _ := m.days(); from > maxDay {
			break
		}
		ms = append(ms, m)
	}
	return a.ensure(ctx, ms)
}

func clampDay(d uint16) uint16 { return min(d, maxDay) }

// ensure creates the partitions of ms that do not exist yet.
func (a *Archive) ensure(ctx context.Context, ms []month) error {
	a.mu.Lock()
	var missing []month
	for _, m := range ms {
		if !a.months[m] {
			missing = append(missing, m)
		}
	}
	a.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(partitionLockID)); err != nil {
			return err
		}
		for _, m := range missing {
			from, to := m.days()
			bound := strconv.Itoa(to)
			if to < 0 {
				bound = "MAXVALUE"
			}
			var exists bool
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.table()).Scan(&exists); err != nil {
				return err
			}
			if exists {
				continue
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF tombstones FOR VALUES FROM (%d) TO (%s)", m.table(), from, bound)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE UNIQUE INDEX %s_hash ON %s (hash)", m.table(), m.table())); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return wrap("creating tombstone partitions", err)
	}
	a.mu.Lock()
	for _, m := range missing {
		a.months[m] = true
	}
	a.mu.Unlock()
	return nil
}

// Tombstone is the tombstone of tenant's key, if the archive holds one:
// the one that ends last, if it holds several (one whose day has passed
// may linger until its month's partition is dropped; the caller compares
// UntilDay with today).
func (a *Archive) Tombstone(ctx context.Context, tenant, key string) (tombstones.Entry, bool, error) {
	h := tombstones.HashOf(tenant, key)
	var (
		completed int32
		until     int16
		state     int16
	)
	err := a.pool.QueryRow(ctx, "SELECT completed, until_day, state FROM tombstones WHERE hash = $1 ORDER BY until_day DESC LIMIT 1",
		[16]byte(h)).Scan(&completed, &until, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return tombstones.Entry{}, false, nil
	}
	if err != nil {
		return tombstones.Entry{}, false, wrap("tombstone", err)
	}
	return tombstones.Entry{Hash: h, State: intent.State(state), Completed: uint32(completed), UntilDay: uint16(until)}, true, nil
}

// PutTombstones adds es; an entry already held (the same hash in the same
// month of UntilDay) is left as it is.
func (a *Archive) PutTombstones(ctx context.Context, es []tombstones.Entry) error {
	if len(es) == 0 {
		return nil
	}
	return wrap("put tombstones", a.insertTombstones(ctx, a.pool, es))
}

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// insertTombstones adds es, creating the partitions they need first.
func (a *Archive) insertTombstones(ctx context.Context, db execer, es []tombstones.Entry) error {
	hashes := make([][16]byte, len(es))
	completed := make([]int32, len(es))
	until := make([]int16, len(es))
	states := make([]int16, len(es))
	var ms []month
	seen := map[month]bool{}
	for i, e := range es {
		d := clampDay(e.UntilDay)
		hashes[i], completed[i], until[i], states[i] = e.Hash, int32(e.Completed), int16(d), int16(e.State)
		if m := monthOfDay(d); !seen[m] {
			seen[m] = true
			ms = append(ms, m)
		}
	}
	const sql = `INSERT INTO tombstones (hash, completed, until_day, state)
SELECT * FROM unnest($1::uuid[], $2::integer[], $3::smallint[], $4::smallint[]) ON CONFLICT DO NOTHING`
	for attempt := 0; ; attempt++ {
		if err := a.ensure(ctx, ms); err != nil {
			return err
		}
		_, err := db.Exec(ctx, sql, hashes, completed, until, states)
		var pgErr *pgconn.PgError
		if attempt == 0 && errors.As(err, &pgErr) && pgErr.Code == "23514" {
			// No partition for a row: another process dropped a month
			// this one thought was there. Look again, once.
			a.forget(ms)
			if _, ok := db.(pgx.Tx); ok {
				return err // the transaction is aborted: the caller retries
			}
			continue
		}
		return err
	}
}

func (a *Archive) forget(ms []month) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range ms {
		delete(a.months, m)
	}
}

// ExpireStats is what one Expire did.
type ExpireStats struct {
	// Tombstoned counts the archived intents past their retention that
	// became tombstones.
	Tombstoned int64
	// PartitionsDropped counts the months of tombstones dropped, every
	// entry of which had passed its day; TombstonesDropped the entries
	// they held, as PostgreSQL's statistics counted them.
	PartitionsDropped int
	TombstonesDropped int64
	// PartitionsPacked counts the months whose index was rebuilt full
	// (packPartitions).
	PartitionsPacked int
}

// Expire turns the archived intents whose retention ended by now into
// tombstones kept for the tombstone retention from now (one transaction
// per batch of Options.ExpireBatch: the rows deleted and their tombstones
// written together), then drops every month of tombstones whose entries
// have all passed their day. Several processes may run it at once: a row
// is turned by one of them.
func (a *Archive) Expire(ctx context.Context, now time.Time) (ExpireStats, error) {
	var st ExpireStats
	if err := a.ensureAhead(ctx, now); err != nil {
		return st, err
	}
	until := now.Add(a.opts.TombstoneRetention)
	for {
		n, err := a.expireBatch(ctx, now, until)
		st.Tombstoned += int64(n)
		if err != nil {
			return st, wrap("expiring intents", err)
		}
		if n < a.opts.ExpireBatch {
			break
		}
	}
	if err := a.dropPartitions(ctx, now, &st); err != nil {
		return st, err
	}
	return st, a.packPartitions(ctx, now, &st)
}

func (a *Archive) expireBatch(ctx context.Context, now, until time.Time) (int, error) {
	n := 0
	for attempt := 0; ; attempt++ {
		err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `DELETE FROM intents WHERE (tenant, key) IN (
	SELECT tenant, key FROM intents WHERE retain_until <= $1 ORDER BY retain_until LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING tenant, key, state, completed_at`, now.UnixNano(), a.opts.ExpireBatch)
			if err != nil {
				return err
			}
			var es []tombstones.Entry
			for rows.Next() {
				var (
					tenant, key string
					state       int16
					completed   int64
				)
				if err := rows.Scan(&tenant, &key, &state, &completed); err != nil {
					rows.Close()
					return err
				}
				es = append(es, tombstones.NewEntry(tenant, key, intent.State(state), fromNanos(completed), until))
			}
			if err := rows.Err(); err != nil {
				return err
			}
			n = len(es)
			if n == 0 {
				return nil
			}
			return a.insertTombstones(ctx, tx, es)
		})
		var pgErr *pgconn.PgError
		if attempt == 0 && errors.As(err, &pgErr) && pgErr.Code == "23514" {
			continue // a partition vanished under us: insertTombstones forgot it; again
		}
		return n, err
	}
}

// dropPartitions drops the months of tombstones whose every entry may be
// dropped on now's day. A DROP waits for the statements reading the
// partitioned table at most lockTimeout, and is tried again by the next
// Expire if it could not.
func (a *Archive) dropPartitions(ctx context.Context, now time.Time, st *ExpireStats) error {
	today := int(tombstones.Today(now))
	rows, err := a.pool.Query(ctx, `SELECT c.relname, greatest(c.reltuples, 0)::bigint FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'tombstones'::regclass`)
	if err != nil {
		return wrap("listing tombstone partitions", err)
	}
	type part struct {
		m    month
		rows int64
	}
	var drop []part
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			rows.Close()
			return wrap("listing tombstone partitions", err)
		}
		m, ok := parseTable(name)
		if !ok {
			continue
		}
		if _, to := m.days(); to >= 0 && to <= today+1 {
			drop = append(drop, part{m, n})
		}
	}
	if err := rows.Err(); err != nil {
		return wrap("listing tombstone partitions", err)
	}
	sort.Slice(drop, func(i, j int) bool { return drop[i].m < drop[j].m })
	for _, p := range drop {
		a.forget([]month{p.m})
		err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+p.m.table())
			return err
		})
		if err != nil {
			return wrap("dropping "+p.m.table(), err)
		}
		st.PartitionsDropped++
		st.TombstonesDropped += p.rows
	}
	return nil
}

// packLockID is the session advisory lock of packPartitions ("tombpack").
const packLockID = 0x746f6d627061636b

// lockTimeout bounds how long dropping a partition waits for its lock.
const lockTimeout = "5s"

// Stats is the archive's size.
type Stats struct {
	// Intents and Tombstones are rows, as PostgreSQL's statistics count
	// them (exact after a VACUUM or an ANALYZE, which autovacuum runs as
	// tables change; counted exactly for a table never analyzed).
	Intents, Tombstones int64
	// IntentBytes and TombstoneBytes are the tables' total relation size:
	// heap, TOAST and every index (of every partition).
	IntentBytes, TombstoneBytes int64
	// TombstonePartitions counts the months of tombstones.
	TombstonePartitions int
}

// Stats reads the archive's size from PostgreSQL's catalog.
func (a *Archive) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	rows, err := a.pool.Query(ctx, `SELECT c.relname, c.reltuples::bigint, pg_total_relation_size(c.oid), c.relname <> 'intents'
FROM pg_class c WHERE c.oid = 'intents'::regclass
   OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'tombstones'::regclass)`)
	if err != nil {
		return st, wrap("stats", err)
	}
	type rel struct {
		name       string
		tuples     int64
		tombstones bool
	}
	var unknown []rel
	for rows.Next() {
		var r rel
		var bytes int64
		if err := rows.Scan(&r.name, &r.tuples, &bytes, &r.tombstones); err != nil {
			rows.Close()
			return st, wrap("stats", err)
		}
		if r.tuples < 0 {
			unknown = append(unknown, r)
			r.tuples = 0
		}
		if r.tombstones {
			st.Tombstones += r.tuples
			st.TombstoneBytes += bytes
			st.TombstonePartitions++
		} else {
			st.Intents += r.tuples
			st.IntentBytes += bytes
		}
	}
	if err := rows.Err(); err != nil {
		return st, wrap("stats", err)
	}
	for _, r := range unknown {
		var n int64
		if err := a.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{r.name}.Sanitize()).Scan(&n); err != nil {
			return st, wrap("stats", err)
		}
		if r.tombstones {
			st.Tombstones += n
		} else {
			st.Intents += n
		}
	}
	return st, nil
}

// packPartitions rebuilds, once, the hash index of each month of
// tombstones that no tombstone made from now on falls in (the months
// before the one of now + the tombstone retention). Written in random
// order of hash, a btree's pages are about two thirds full; rebuilt with
// fillfactor 100 they are full, and stay so, as such a month is only read
// until it is dropped (see docs/PERFORMANCE.md for the bytes). The
// rebuild is REINDEX CONCURRENTLY: lookups and writes go on meanwhile. An
// index already set to fillfactor 100 is not rebuilt again, and the
// leftover of a rebuild that failed (an invalid index) is dropped first.
func (a *Archive) packPartitions(ctx context.Context, now time.Time, st *ExpireStats) error {
	// One process packs at a time (two REINDEX CONCURRENTLY of one index
	// deadlock); the others leave it to it.
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return wrap("packing tombstone indexes", err)
	}
	defer conn.Release()
	var mine bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(packLockID)).Scan(&mine); err != nil {
		return wrap("packing tombstone indexes", err)
	}
	if !mine {
		return nil
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(packLockID)); err != nil {
			conn.Conn().Close(context.Background()) // a closed session holds no lock
		}
	}()
	current := monthOfDay(clampDay(tombstones.Today(now.Add(a.opts.TombstoneRetention))))
	rows, err := conn.Query(ctx, `SELECT t.relname, i.relname, x.indisvalid,
	coalesce(i.reloptions @> ARRAY['fillfactor=100'], false)
FROM pg_inherits h JOIN pg_class t ON t.oid = h.inhrelid
JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class i ON i.oid = x.indexrelid
WHERE h.inhparent = 'tombstones'::regclass`)
	if err != nil {
		return wrap("listing tombstone indexes", err)
	}
	var invalid, pack []string
	for rows.Next() {
		var table, index string
		var valid, packed bool
		if err := rows.Scan(&table, &index, &valid, &packed); err != nil {
			rows.Close()
			return wrap("listing tombstone indexes", err)
		}
		m, ok := parseTable(table)
		switch {
		case !ok:
		case !valid:
			invalid = append(invalid, index)
		case !packed && m < current:
			pack = append(pack, index)
		}
	}
	if err := rows.Err(); err != nil {
		return wrap("listing tombstone indexes", err)
	}
	for _, index := range invalid {
		if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+pgx.Identifier{index}.Sanitize()); err != nil {
			return wrap("dropping the invalid index "+index, err)
		}
	}
	sort.Strings(pack)
	for _, index := range pack {
		id := pgx.Identifier{index}.Sanitize()
		if _, err := conn.Exec(ctx, "ALTER INDEX "+id+" SET (fillfactor = 100)"); err != nil {
			return wrap("packing "+index, err)
		}
		if _, err := conn.Exec(ctx, "REINDEX INDEX CONCURRENTLY "+id); err != nil {
			return wrap("packing "+index, err)
		}
		st.PartitionsPacked++
	}
	return nil
}
