// Package archive is intentd's cold tier: a PostgreSQL database holding
// the final intents moved out of etcd after their hot window, and the
// tombstones of those past their retention (issue 26). etcd keeps what is
// live; package etcdstore moves final records here and asks here when it
// misses. Each record is kept as etcd stored it (Record.Data, byte for
// byte), with the fields its queries need beside it.
//
// # Calls
//
// Open parses the DSN (a URL or key=value pairs: TLS and credentials are
// the DSN's), opens a pgx pool and brings the schema to this package's
// version. Put is an idempotent upsert of a batch; Get and Tombstone look
// one key up, always within one tenant; List pages one tenant's records in
// (RegisteredAt, Key) order with an exclusive cursor; Expire turns records
// past their retention into tombstones and drops months of tombstones
// past theirs; Stats reads sizes from the catalog. An error whose cause is
// that PostgreSQL did not answer (unreachable, refused, gone during the
// call, starting or stopping, or the context's deadline) matches
// ErrUnavailable.
//
// A reader that asks for a record and then for a tombstone (Get, then
// Tombstone, in that order) cannot miss a key that Expire moves between
// its two calls: Expire deletes the row and writes its tombstone in one
// transaction, so the row is there until the tombstone is.
//
// # Migrations
//
// The schema is migrations/*.sql, embedded and applied by goose
// (github.com/pressly/goose/v3) through its Provider: no global state, an
// embed.FS as the source, one transaction per migration, the versions
// applied kept in goose_db_version, and a PostgreSQL session advisory lock
// around the whole run, so that replicas starting together migrate once.
// golang-migrate would do as well; goose was chosen because a failed
// migration leaves the database at the last good version (each runs in a
// transaction) instead of a "dirty" flag an operator must clear by hand,
// and because its provider takes the context and a *sql.DB of pgx's pool
// (stdlib.OpenDBFromPool) without registering drivers globally. A new
// migration is a new file, 00002_<what>.sql, never an edit of an applied
// one.
//
// # Schema
//
// intents: one row per archived intent, primary key (tenant, key): Get
// and Put's conflict are one probe of one index. Times are nanoseconds
// since the epoch (bigint), so that List orders exactly as etcd's
// indexes; text that is compared or ordered is COLLATE "C" (bytes, as
// etcd), whatever the database's locale. No column is NULL (a row
// without NULLs has no null bitmap): the fingerprint is one bytea (a
// SHA-256 in lowercase hex as its 32 bytes, any other fingerprint as its
// text with a NUL after it when 32 bytes or longer), and no parent is
// the empty string.
// Labels are a text[] of "name=value" (a label name holds no '=');
// data has STORAGE EXTERNAL (never compressed again: intentd compresses
// large final records already). Indexes: the primary key;
// (tenant, registered_at) for List, without the key, which would double
// it (records registered in the same nanosecond are rare, and an
// incremental sort orders them by key); a partial index by state of the
// rows not COMPLETED (a COMPLETED listing walks the time index); a
// partial index of children by parent; a GIN index of labels without a
// pending list (fastupdate off: the list's pages are never given back);
// retain_until for Expire. What each costs per row is in
// docs/PERFORMANCE.md ("The archive's bytes").
//
// The table is not partitioned by retain_until. A unique index of a
// partitioned table must hold its partition key, so (tenant, key) could
// no longer be one index probe (each partition's index would be probed)
// nor the target of Put's ON CONFLICT. Expire deletes in bounded batches
// instead (Options.ExpireBatch rows per transaction, SKIP LOCKED so that
// replicas share the work); autovacuum makes the space of deleted rows
// reusable by the rows archived after them, so the table stays at the
// size its retention holds rather than growing.
//
// tombstones: package etcdstore/tombstones' Entry, one row each: the
// 16-byte hash as a uuid (fixed length, no header), completion seconds
// (integer, read as unsigned), until_day (smallint: days to 2059-09-18;
// an end of retention past it is kept as that day) and the state.
// Partitioned by RANGE of until_day, one partition a calendar month,
// named tombstones_yYYYYmMM; Open and Expire create, ahead, the months a
// tombstone made now may need, and PutTombstones any other it meets. Each
// partition has a unique index on hash of its own (the partitioned table
// cannot: the key would have to hold until_day); ON CONFLICT DO NOTHING
// without a target uses it, so putting the same entry twice keeps one. A
// lookup probes each month's index (25 for two years of tombstones). A
// month whose every entry has passed its day is dropped whole (DROP TABLE
// with a lock timeout): no DELETE, no dead rows, no vacuum. A month no
// new tombstone falls in any more (before the month of now + the
// tombstone retention) has its index rebuilt once, full (REINDEX
// CONCURRENTLY at fillfactor 100; written in random order of hash, a
// btree's pages are two thirds full), by one process at a time.
//
// Locks between processes: migrations hold goose's session advisory lock;
// creating partitions, a transaction advisory lock; packing indexes, a
// session advisory lock tried, not waited for.
//
// # SQL this package relies on, and a distributed PostgreSQL
//
//   - INSERT ... ON CONFLICT (tenant, key) DO UPDATE ... WHERE (Put's
//     revision rule) and ON CONFLICT DO NOTHING without a target
//     (tombstones, arbitrated by each partition's unique index);
//   - DELETE ... WHERE ... IN (SELECT ... FOR UPDATE SKIP LOCKED)
//     RETURNING (Expire);
//   - declarative partitioning: PARTITION BY RANGE, CREATE TABLE ...
//     PARTITION OF, indexes on one partition, DROP TABLE of a partition;
//   - row comparison (registered_at, key) > ($1, $2) with a btree on
//     registered_at (List's cursor) and incremental sort, partial
//     indexes, a GIN index on text[] with @>;
//   - COLLATE "C", ALTER COLUMN ... SET STORAGE EXTERNAL, the uuid type;
//   - pg_advisory_xact_lock (creating partitions), pg_try_advisory_lock
//     (packing) and goose's session advisory lock (migrations); REINDEX
//     INDEX CONCURRENTLY and index reloptions (fillfactor); pg_class,
//     pg_index, pg_inherits, pg_total_relation_size, to_regclass (Stats,
//     partitions);
//   - a pgx batch: the statements of one Put share one Sync, which
//     PostgreSQL runs as one implicit transaction.
//
// On CockroachDB or YugabyteDB (PostgreSQL's wire protocol, distributed),
// what would change:
//
//   - advisory locks: CockroachDB has none that exclude (its functions
//     are no-ops), so migrations take goose's table locker
//     (lock.NewPostgresTableLocker) and partition creation and packing a
//     lock row of their own;
//   - STORAGE EXTERNAL, fillfactor, REINDEX CONCURRENTLY, pg_inherits and
//     pg_total_relation_size are PostgreSQL's own: the column keeps the
//     default storage, packing is left out (the stores' LSM trees keep
//     no half-empty pages), and Stats reads the database's own size
//     tables (CockroachDB's crdb_internal.table_spans, YugabyteDB's
//     yb_table_properties);
//   - declarative partitioning: YugabyteDB follows PostgreSQL's syntax
//     and drops partitions as here; CockroachDB partitions only by a
//     primary key prefix, so expired tombstones go by row-level TTL
//     (ttl_expiration_expression on until_day) or a ranged DELETE
//     instead of a DROP;
//   - a GIN index on text[] is CockroachDB's inverted index (the same @>
//     query); SKIP LOCKED, ON CONFLICT and COLLATE "C" work on both;
//   - CockroachDB runs every transaction serializable: concurrent Expire
//     batches may fail with a retryable error (SQLSTATE 40001), to be
//     run again;
//   - both spread a table by ranges of its primary key: intents by
//     (tenant, key) spreads, but List's index (tenant, registered_at)
//     takes every new row at its newest end, a write hotspot unless it
//     is hash-sharded (USING HASH in CockroachDB).
package archive
