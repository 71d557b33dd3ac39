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
// etcd), whatever the database's locale. The fingerprint is stored as the
// 32 bytes its hex says; labels as a text[] of "name=value" (a label name
// holds no '='); data with STORAGE EXTERNAL (not compressed again: large
// final records are compressed by intentd already). Indexes: the primary
// key; (tenant, registered_at, key) for List; a partial index of the rows
// not COMPLETED by state; a partial index of children by parent; a GIN
// index of labels; retain_until for Expire.
//
// The table is not partitioned by retain_until. A unique index of a
// partitioned table must hold its partition key, so (tenant, key) could
// no longer be one index probe (each partition's index would be probed)
// nor the target of Put's ON CONFLICT. Expire deletes in bounded batches
// instead (Options.ExpireBatch rows per transaction, SKIP LOCKED so that
// replicas share the work); autovacuum makes the space of deleted rows
// reusable by the rows archived after them, so the table stays at the
// size its retention holds rather than growing (the bytes per row are in
// docs/PERFORMANCE.md).
//
// tombstones: package etcdstore/tombstones' Entry, one row each: the
// 16-byte hash as a uuid (fixed length, no header), completion seconds
// (integer), until_day (smallint: days to 2059-09-18; an end of retention
// past it is kept as that day) and the state. Partitioned by RANGE of
// until_day, one partition a calendar month, named tombstones_yYYYYmMM;
// Open and Expire create the months a tombstone made now may need, ahead,
// and PutTombstones any other it meets. Each partition has a unique index
// on hash of its own (the partitioned table cannot: the key would have to
// hold until_day); ON CONFLICT DO NOTHING without a target uses it, so
// putting the same entry twice keeps one. A lookup probes each month's
// index (about 25 for two years of tombstones). A month whose every entry
// has passed its day is dropped whole (DROP TABLE with a lock timeout):
// no DELETE, no dead rows, no vacuum.
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
//   - row comparison (registered_at, key) > ($1, $2) on a btree (List's
//     cursor), partial indexes, a GIN index on text[] with @>;
//   - COLLATE "C", ALTER COLUMN ... SET STORAGE EXTERNAL, the uuid type;
//   - pg_advisory_xact_lock (creating partitions) and goose's session
//     advisory lock (migrations); pg_class, pg_inherits,
//     pg_total_relation_size, to_regclass (Stats, partitions);
//   - a pgx batch: the statements of one Put share one Sync, which
//     PostgreSQL runs as one implicit transaction.
//
// On CockroachDB or YugabyteDB (PostgreSQL's wire protocol, distributed):
// advisory locks are absent or no-ops (CockroachDB), so migrations need
// goose's table locker (lock.NewPostgresTableLocker) and partition
// creation a lock row of its own; STORAGE EXTERNAL, pg_total_relation_size
// and pg_inherits do not exist (sizes come from the database's own
// statistics); declarative partitioning differs (CockroachDB partitions
// by a primary key prefix, and a DROP of a partition is a DELETE by range
// or row-level TTL instead; YugabyteDB follows PostgreSQL's syntax and
// drops partitions as here); a GIN index on an array is an inverted index
// in CockroachDB (the same @> query); SKIP LOCKED is supported by both.
// CockroachDB runs every transaction serializable, so concurrent
// Expire batches may be retried on conflict; COLLATE "C" and ON CONFLICT
// work on both. On either, List's index (tenant, registered_at, key)
// takes every new row at its newest end: a write hotspot, unless it is
// hash-sharded.
package archive
