-- The archive's schema, version 1 (package archive's doc.go says why each
-- choice). Every text column that is ordered or compared is COLLATE "C":
-- the archive orders as etcd's indexes do, by bytes, whatever the
-- database's locale.

-- +goose Up

-- One row per final intent moved out of etcd. Not partitioned: a primary
-- key on (tenant, key) is one index probe only on a table whose unique
-- indexes need not carry a partition key, and Put's idempotence
-- (ON CONFLICT) needs exactly that key. Expire deletes in bounded
-- batches; autovacuum makes the space of deleted rows reusable for the
-- rows archived after them, so the table does not grow past its retention.
CREATE TABLE intents (
    registered_at bigint NOT NULL,   -- nanoseconds since the epoch (List's order, as etcd's indexes)
    completed_at  bigint NOT NULL,   -- nanoseconds since the epoch, 0 unknown
    retain_until  bigint NOT NULL,   -- nanoseconds since the epoch: past it, a tombstone
    revision      bigint NOT NULL,   -- etcd's mod revision of the record when moved
    state         smallint NOT NULL, -- intent.State
    tenant        text COLLATE "C" NOT NULL,
    key           text COLLATE "C" NOT NULL,
    fingerprint   bytea NOT NULL,    -- a SHA-256 in lowercase hex as its 32 bytes, any other as its text
                                     -- (with a NUL after it if 32 bytes or longer: see package archive)
    parent        text COLLATE "C" NOT NULL, -- the empty string: none
    labels        text[] COLLATE "C",-- "name=value" in the record's order; NULL: none
    data          bytea NOT NULL,    -- the record's etcd value, exactly
    PRIMARY KEY (tenant, key)
);
-- Data is often compressed already (intentd compresses large final
-- records): no second compression, out of line only when the row is large.
ALTER TABLE intents ALTER COLUMN data SET STORAGE EXTERNAL;

-- List by tenant, in (registered_at, key) order, cursor after cursor. The
-- key is left out of the index (half its size): records registered in
-- the same nanosecond are rare, and an incremental sort orders them.
CREATE INDEX intents_by_time ON intents (tenant, registered_at);
-- List by state: COMPLETED, most of the archive, walks intents_by_time;
-- the rarer final states have an index of their own rows only.
CREATE INDEX intents_by_state ON intents (tenant, state, registered_at) WHERE state <> 4;
-- List by parent: only children are indexed.
CREATE INDEX intents_by_parent ON intents (tenant, parent, registered_at) WHERE parent <> '';
-- List by label: an inverted index of the "name=value" strings.
CREATE INDEX intents_by_label ON intents USING gin (labels) WITH (fastupdate = off) WHERE labels IS NOT NULL;
-- Expire: the rows past their retention, oldest first.
CREATE INDEX intents_by_retention ON intents (retain_until);

-- One row per tombstone: package etcdstore/tombstones' Entry. hash is the
-- first 16 bytes of SHA-256(tenant, 0x00, key), stored as a uuid (16 bytes
-- inline, no length header). Partitioned by until_day, one partition a
-- month (tombstones_yYYYYmMM), created ahead by the package; a month whose
-- every entry may be dropped is dropped whole: no DELETE, no bloat. Each
-- partition has a unique index on hash of its own (a unique index of the
-- partitioned table would have to hold until_day).
CREATE TABLE tombstones (
    hash      uuid NOT NULL,
    completed integer NOT NULL,  -- seconds since the epoch (0: unknown), read as unsigned
    until_day smallint NOT NULL, -- days since the epoch, read as unsigned
    state     smallint NOT NULL
) PARTITION BY RANGE (until_day);

-- +goose Down
DROP TABLE tombstones;
DROP TABLE intents;
