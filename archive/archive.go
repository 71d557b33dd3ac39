package archive

import (
	"context"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
)

// Record is one final intent as the archive keeps it.
type Record struct {
	Tenant, Key string
	// State is final: COMPLETED, FAILED or CANCELLED.
	State       intent.State
	Fingerprint string
	// Parent is the parent intent's key, "" if none.
	Parent string
	Labels []intent.Label
	// RegisteredAt orders List: (RegisteredAt, Key), as etcd's indexes
	// (to the nanosecond).
	RegisteredAt time.Time
	CompletedAt  time.Time
	// RetainUntil is the end of the record's retention: past it, Expire
	// turns the record into a tombstone.
	RetainUntil time.Time
	// Revision is etcd's mod revision of the record when it was moved:
	// Put keeps the row of the highest.
	Revision int64
	// Data is the record's value exactly as etcd stored it (opaque bytes,
	// given back byte for byte).
	Data []byte
}

// Options are an archive's settings; the zero value of each field means
// its default.
type Options struct {
	// MaxConns bounds the pool's connections (default: pgxpool's, the
	// larger of 4 and the number of CPUs).
	MaxConns int32
	// TombstoneRetention is how long the tombstone of an archived intent
	// past its retention is kept (default: two years, as etcdstore's).
	TombstoneRetention time.Duration
	// ExpireBatch is how many archived intents one of Expire's
	// transactions turns into tombstones (default 1000).
	ExpireBatch int
	// Now is the clock that decides which tombstone partitions Open
	// creates ahead (default time.Now).
	Now func() time.Time
}

const (
	defaultTombstoneRetention = 2 * 365 * 24 * time.Hour
	defaultExpireBatch        = 1000
)

// Archive is a PostgreSQL database holding final intents and tombstones.
// Its methods are safe for concurrent use, also by several processes on
// one database.
type Archive struct {
	pool *pgxpool.Pool
	opts Options

	mu     sync.Mutex
	months map[month]bool // tombstone partitions known to exist, by month (year*12 + month-1)
}

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLockID is the advisory lock Open's migrations hold, so that
// replicas starting together migrate one at a time ("intentd" in ASCII).
const migrationLockID = 0x696e74656e7464

// Open connects to the database dsn names (a URL, postgres://..., or
// key=value pairs; TLS and credentials are the DSN's), and brings its
// schema to the version this package knows, once whatever how many
// processes open it together.
func Open(ctx context.Context, dsn string, opts Options) (*Archive, error) {
	if strings.TrimSpace(dsn) == "" {
		// pgx would read an empty DSN as "every default": a local server.
		return nil, errors.New("archive: the DSN is empty")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's message names what is wrong, the password masked.
		return nil, fmt.Errorf("archive: the DSN does not parse: %w", err)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if opts.TombstoneRetention <= 0 {
		opts.TombstoneRetention = defaultTombstoneRetention
	}
	if opts.ExpireBatch <= 0 {
		opts.ExpireBatch = defaultExpireBatch
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, wrap("connecting", err)
	}
	a := &Archive{pool: pool, opts: opts, months: map[month]bool{}}
	if err := a.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	if err := a.ensureAhead(ctx, opts.Now()); err != nil {
		pool.Close()
		return nil, err
	}
	return a, nil
}

// migrate applies the embedded migrations not yet applied (goose keeps
// which in its table goose_db_version), under a session advisory lock.
func (a *Archive) migrate(ctx context.Context) error {
	db := stdlib.OpenDBFromPool(a.pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	fsys, err := subFS()
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("archive: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return wrap("migrating the schema", err)
	}
	return nil
}

// SchemaVersion is the version of the schema the database holds.
func (a *Archive) SchemaVersion(ctx context.Context) (int64, error) {
	var v int64
	err := a.pool.QueryRow(ctx, "SELECT max(version_id) FROM goose_db_version WHERE is_applied").Scan(&v)
	return v, wrap("reading the schema version", err)
}

// Ping checks that PostgreSQL answers.
func (a *Archive) Ping(ctx context.Context) error {
	return wrap("ping", a.pool.Ping(ctx))
}

// Close closes the pool's connections, waiting for calls in flight.
func (a *Archive) Close() { a.pool.Close() }

// nanos is t as the archive stores it: nanoseconds since the epoch, 0 for
// the zero time.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// fingerprintBytes is how a fingerprint is stored: a SHA-256 in lowercase
// hex (the fingerprint intentd computes) as its 32 bytes; any other as its
// text, with a NUL after it if it is 32 bytes or longer (so that the
// stored length tells which: 32 is a SHA-256).
func fingerprintBytes(fp string) []byte {
	if len(fp) == 64 {
		if b, err := hex.DecodeString(fp); err == nil && hex.EncodeToString(b) == fp {
			return b
		}
	}
	if len(fp) >= 32 {
		return append([]byte(fp), 0)
	}
	return []byte(fp)
}

func fingerprintOf(b []byte) string {
	switch {
	case len(b) == 32:
		return hex.EncodeToString(b)
	case len(b) > 32:
		return string(b[:len(b)-1])
	}
	return string(b)
}

func labelStrings(ls []intent.Label) ([]string, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	out := make([]string, len(ls))
	for i, l := range ls {
		if strings.Contains(l.Name, "=") {
			return nil, fmt.Errorf("label name %q holds '='", l.Name)
		}
		out[i] = l.Name + "=" + l.Value
	}
	return out, nil
}

func parseLabels(ss []string) []intent.Label {
	if len(ss) == 0 {
		return nil
	}
	out := make([]intent.Label, len(ss))
	for i, s := range ss {
		name, value, _ := strings.Cut(s, "=")
		out[i] = intent.Label{Name: name, Value: value}
	}
	return out
}

const putSQL = `INSERT INTO intents (registered_at, completed_at, retain_until, revision, state, tenant, key,
	fingerprint, parent, labels, data)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (tenant, key) DO UPDATE SET
	registered_at = EXCLUDED.registered_at, completed_at = EXCLUDED.completed_at,
	retain_until = EXCLUDED.retain_until, revision = EXCLUDED.revision, state = EXCLUDED.state,
	fingerprint = EXCLUDED.fingerprint,
	parent = EXCLUDED.parent, labels = EXCLUDED.labels, data = EXCLUDED.data
WHERE intents.revision < EXCLUDED.revision`

// Put writes recs, in one round trip and one transaction: each is
// inserted, or replaces the row of its (tenant, key) if that row's
// revision is lower; a row of the same or a higher revision is left as
// it is. Putting the same records again changes nothing.
func (a *Archive) Put(ctx context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range recs {
		if r.Tenant == "" || r.Key == "" {
			return fmt.Errorf("archive: put: a record without a tenant or a key (%q, %q)", r.Tenant, r.Key)
		}
		if !r.State.Final() {
			return fmt.Errorf("archive: put %s/%s: state %v is not final", r.Tenant, r.Key, r.State)
		}
		labels, err := labelStrings(r.Labels)
		if err != nil {
			return fmt.Errorf("archive: put %s/%s: %w", r.Tenant, r.Key, err)
		}
		data := r.Data
		if data == nil {
			data = []byte{}
		}
		b.Queue(putSQL, nanos(r.RegisteredAt), nanos(r.CompletedAt), nanos(r.RetainUntil), r.Revision,
			int16(r.State), r.Tenant, r.Key, fingerprintBytes(r.Fingerprint), r.Parent, labels, data)
	}
	// The batch's statements go in one pipeline closed by one Sync:
	// PostgreSQL runs them as one implicit transaction.
	return wrap("put", a.pool.SendBatch(ctx, b).Close())
}

const recordColumns = `registered_at, completed_at, retain_until, revision, state, tenant, key,
	fingerprint, parent, labels, data`

func scanRecord(row pgx.Row) (Record, error) {
	var (
		r                 Record
		reg, comp, retain int64
		state             int16
		fp                []byte
		labels            []string
	)
	err := row.Scan(&reg, &comp, &retain, &r.Revision, &state, &r.Tenant, &r.Key, &fp, &r.Parent, &labels, &r.Data)
	if err != nil {
		return Record{}, err
	}
	r.RegisteredAt, r.CompletedAt, r.RetainUntil = fromNanos(reg), fromNanos(comp), fromNanos(retain)
	r.State = intent.State(state)
	r.Fingerprint = fingerprintOf(fp)
	r.Labels = parseLabels(labels)
	if r.Data == nil {
		r.Data = []byte{}
	}
	return r, nil
}

// Get is tenant's archived record of key. A key archived for another
// tenant only is absent, as one archived nowhere.
func (a *Archive) Get(ctx context.Context, tenant, key string) (Record, bool, error) {
	r, err := scanRecord(a.pool.QueryRow(ctx, "SELECT "+recordColumns+" FROM intents WHERE tenant = $1 AND key = $2", tenant, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, wrap("get", err)
	}
	return r, true, nil
}

// Hashes calls fn with the hash (tombstones.HashOf) of every key the
// archive holds a record or a tombstone of, in no order, streaming: a
// replica's filter of archived keys is loaded from it. A key may come
// twice (its record and its tombstone). It stops at fn's first error.
func (a *Archive) Hashes(ctx context.Context, fn func(tombstones.Hash) error) error {
	rows, err := a.pool.Query(ctx, "SELECT tenant, key FROM intents")
	if err != nil {
		return wrap("hashes", err)
	}
	var tenant, key string
	_, err = pgx.ForEachRow(rows, []any{&tenant, &key}, func() error { return fn(tombstones.HashOf(tenant, key)) })
	if err != nil {
		return wrap("hashes", err)
	}
	rows, err = a.pool.Query(ctx, "SELECT hash FROM tombstones")
	if err != nil {
		return wrap("hashes", err)
	}
	var h [16]byte
	_, err = pgx.ForEachRow(rows, []any{&h}, func() error { return fn(tombstones.Hash(h)) })
	return wrap("hashes", err)
}

// Cursor is a position in List's order: (RegisteredAt, Key).
type Cursor struct {
	RegisteredAt time.Time
	Key          string
}

// Of is the cursor of r: the next page starts after it.
func Of(r Record) Cursor { return Cursor{RegisteredAt: r.RegisteredAt, Key: r.Key} }

// Query asks List for one page of one tenant's archived records; the
// filters combine with AND.
type Query struct {
	Tenant string
	State  *intent.State
	Label  *intent.Label
	Parent string
	// After is the exclusive cursor: the page starts after it (nil: at
	// the start).
	After *Cursor
	// Limit is the page's size (at most; default 100).
	Limit int
}

// DefaultLimit is a page's size when a Query names none.
const DefaultLimit = 100

// List is one page of tenant's archived records matching q, ascending by
// (RegisteredAt, Key). A page that holds fewer than q.Limit records is the
// last. Rows archived while a caller pages through are found by the later
// pages when they sort after the cursor, never twice.
func (a *Archive) List(ctx context.Context, q Query) ([]Record, error) {
	sql, args, err := listSQL(q)
	if err != nil {
		return nil, err
	}
	rows, err := a.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap("list", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, wrap("list", err)
		}
		out = append(out, r)
	}
	return out, wrap("list", rows.Err())
}

// listSQL is List's statement and its arguments.
func listSQL(q Query) (string, []any, error) {
	if q.Tenant == "" {
		return "", nil, errors.New("archive: list: no tenant")
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	args := []any{q.Tenant}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	var sql strings.Builder
	sql.WriteString("SELECT " + recordColumns + " FROM intents WHERE tenant = $1")
	if q.State != nil {
		// A literal, not a parameter: the planner must see that a state
		// other than COMPLETED is in intents_by_state.
		fmt.Fprintf(&sql, " AND state = %d", int16(*q.State))
	}
	if q.Parent != "" {
		sql.WriteString(" AND parent = " + arg(q.Parent))
	}
	if q.Label != nil {
		ls, err := labelStrings([]intent.Label{*q.Label})
		if err != nil {
			return "", nil, fmt.Errorf("archive: list: %w", err)
		}
		sql.WriteString(" AND labels @> " + arg(ls) + "::text[]")
	}
	if q.After != nil {
		at := arg(nanos(q.After.RegisteredAt))
		fmt.Fprintf(&sql, " AND registered_at >= %s AND (registered_at, key) > (%s, %s)", at, at, arg(q.After.Key))
	}
	sql.WriteString(" ORDER BY registered_at, key LIMIT " + arg(limit))
	return sql.String(), args, nil
}

// Seed adds recs with PostgreSQL's COPY, many times faster than Put: for
// filling an archive in bulk (a benchmark's ten million intents). Unlike
// Put it is not idempotent: a record whose (tenant, key) the archive
// holds already fails the whole call.
func (a *Archive) Seed(ctx context.Context, recs []Record) error {
	rows := make([][]any, 0, len(recs))
	for _, r := range recs {
		if r.Tenant == "" || r.Key == "" || !r.State.Final() {
			return fmt.Errorf("archive: seed: %s/%s in state %v is no final record", r.Tenant, r.Key, r.State)
		}
		labels, err := labelStrings(r.Labels)
		if err != nil {
			return fmt.Errorf("archive: seed %s/%s: %w", r.Tenant, r.Key, err)
		}
		data := r.Data
		if data == nil {
			data = []byte{}
		}
		rows = append(rows, []any{nanos(r.RegisteredAt), nanos(r.CompletedAt), nanos(r.RetainUntil), r.Revision,
			int16(r.State), r.Tenant, r.Key, fingerprintBytes(r.Fingerprint), r.Parent, labels, data})
	}
	_, err := a.pool.CopyFrom(ctx, pgx.Identifier{"intents"}, []string{"registered_at", "completed_at", "retain_until",
		"revision", "state", "tenant", "key", "fingerprint", "parent", "labels", "data"}, pgx.CopyFromRows(rows))
	return wrap("seed", err)
}
