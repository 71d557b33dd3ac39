// Package etcdstore keeps intents in etcd. Every etcd key, transaction, lease
// and watch of intentd lives here; the rest of intentd sees plain domain
// types from package intent.
//
// # Key layout
//
// All keys live under a prefix (default "/intentd/v1/"). Per tenant:
//
//	t/<tenant>/i/<key>                  the intent record: state, params,
//	                                    fingerprint, current lease, result,
//	                                    bounded history, retention
//	t/<tenant>/s/<session-id>           a worker session (JSON: worker, ttl),
//	                                    attached to the session's etcd lease
//	t/<tenant>/z/<key>                  a tombstone of an earlier version (key,
//	                                    fingerprint, final state, when): read
//	                                    alongside the packed ones until it goes
//	t/<tenant>/Xs<state digit><order>   index by state        (value: empty)
//	t/<tenant>/Xl<name>=<value>/<order> index by label        (escaped name, value)
//	t/<tenant>/Xp<parent>/<order>       index by parent       (escaped parent key)
//
// where <order> is the registration time as 8 big-endian bytes of
// nanoseconds (sign bit flipped), then the key, so that every listing is
// oldest first. Index entries have empty values: the key names the intent.
// Records not written since an earlier version keep that version's
// entries, t/<tenant>/x/s/<STATE>/<20-digit ns>/<key> and so on (some with
// the intent key as their value), which List and the janitor read too, and
// a record's next write moves them (keys.go). Cluster-wide, for the
// janitor:
//
//	x/h/<tenant>/<session-id>/<key>     intents held under a session
//	Xr<retain-until, 8 bytes><tenant>/<key> final records by end of retention
//	                                    (earlier versions: x/r/<20-digit ns>/...)
//	Z/<bound, 32 hex digits>            packed tombstones: the chunk of those
//	                                    whose hash is at most its bound (see
//	                                    Tombstones); with an archive, a move
//	                                    puts its chunk again (see Archive)
//	Zr<until, 8 bytes><tenant>/<key>    earlier versions' tombstones by end of
//	                                    their retention (earlier still:
//	                                    x/zr/<20-digit ns>/..., the intent key
//	                                    as value)
//	x/o/<registered ns>/<tenant>/<key>  intents not final yet, by age
//	janitor/                            the janitor's election
//	replicas/<id>                       a live replica's storage formats and
//	                                    whether it has an archive (JSON), on
//	                                    its own lease (formatgate.go)
//	cluster/format                      the cluster's storage format version,
//	                                    only advanced, by compare-and-swap
//	cluster/archive                     written once before the first move to
//	                                    an archive, never removed
//	                                    (archivegate.go)
//	cluster/archive-moved               the 16-byte hashes of the keys the
//	                                    last move moved, written by its
//	                                    transaction; the filter of archived
//	                                    keys watches it (archivefilter.go)
//	installation                        this installation's random id, written
//	                                    once (create-if-absent) and never
//	                                    changed: a snapshot restore keeps it,
//	                                    a new cluster gets a new one
//	console/s/<hex SHA-256 of a secret> a review console session, sealed by
//	                                    the console (etcdstore stores bytes),
//	                                    on an etcd lease of its idle timeout
//
// Index keys are a function of the record alone (indexKeys). Every
// transition writes the keys its new version gains and deletes those it
// loses in the transaction that writes the record, so the indexes cannot
// drift from the records, and a listing reads an index range whose length
// follows the page, never a scan of all intents.
//
// A session id is the hex id of the etcd lease behind it. A session is alive
// exactly while its key exists with the create revision recorded when it was
// opened; etcd deletes the key when the lease lapses, so whether a lease has
// expired is decided by etcd alone, never by comparing intentd replicas'
// clocks.
//
// # Stored values
//
// Records are stored in the compact format of schema.go (a format byte,
// then the protobuf of a storage-only message, proto/storage/v1), packed
// tombstones in the format of package tombstones, sessions as JSON; never
// as the domain types, which convert to and from the stored forms in one
// place. Tombstones of earlier versions (a key each, compact or JSON) still
// decode. Values in the JSON format earlier versions
// wrote (schema_json.go) still decode, and a record's next write replaces
// its JSON by the compact format: an existing data dir migrates record by
// record, with no migration step. The same holds for the compact records
// of the previous version (format byte 0x01), which held their tenant and
// key; this version's (0x02) take them from their etcd key, and a final
// record's value is stored zstd-compressed (0x03) when that saves a
// sixteenth of it (compress.go). testdata/records pins every uncompressed
// format byte for byte, and holds a compressed record every version must
// decode. A replica of an earlier version cannot read a later format (it
// refuses the value as corrupt, never misreads it): from the first release
// on (RELEASES), a new format is written only once the cluster's format
// version says every live replica reads it (formatgate.go); replicas of
// versions before it are upgraded by stopping them all first.
//
// # Transitions
//
// What each call does to an intent is decided by package internal/core/machine,
// a pure function of the record read; this package reads the record, turns
// the decision's guards into compares and its writes into operations, and
// runs the optimistic loop. Every transition is one etcd transaction on one
// intent record, guarded by
// compares: the record's mod revision must equal the one the decision was
// made from, and where it matters the acquiring session must be alive
// (create revision equal) or the holder's session must be gone (create
// revision different). History entries go into the record written by that
// same transaction. A happy-path intent costs two etcd writes: Acquire
// (registering the intent in the same transaction when asked to) and
// Complete.
//
// # Fencing tokens
//
// The token of a lease is derived from the etcd revision of the transaction
// that issued it: revision × machine.TokenSlots + the issuing write's slot,
// a number below TokenSlots that no other write of that transaction has
// (concurrent transitions share transactions: see group.go). Tokens thus
// strictly increase over every lease the cluster ever issued. The acquiring
// write cannot know its own revision, so it stores token 0 and its slot;
// reading that version computes the token from its mod revision, and the
// next write of the record stores the number. A lease stored before there
// were slots has token 0 and no slot: its token is the bare revision, as it
// was issued, and it is below every token issued since (a later revision r
// gives tokens of at least r × TokenSlots). Tokens are opaque to clients:
// nothing promises that a token equals a revision.
//
// # Revision floor
//
// Because tokens follow revisions, an etcd whose revision goes back (restored
// from a snapshot without --bump-revision, or a wiped member) would hand out
// tokens that workers and fencing gateways have already seen. The store
// refuses every etcd answer below the highest revision it has seen or been
// told of (RaiseFloor), with a *RolledBackError (matching
// intent.ErrStoreRolledBack and intent.ErrUnavailable: the one error for
// this condition), and from then on refuses every call before it reaches
// etcd. The check is on answers, so the one write that discovers the
// problem may have been applied by the etcd that went back; nothing of it
// reaches anyone, and a lease it granted lapses unanswered.
//
// The floor is the store's, whole, across restarts too (Floor, floor.go):
// only the store sees every revision etcd answers at (flooredKV) and knows
// the installation key, whose value tells a restored cluster (same
// installation, held to its floor) from a new one (not held to an old
// one's). So the store also keeps the floor in a file of a directory it is
// given (HoldFloor, at start, refuses an etcd already below it; Floor.Run
// writes the floor as it grows and returns the refusal, explained for the
// operator, when a call finds etcd went back). intentd's daemon only names
// the directory (its data directory), runs Floor.Run as one of its
// components, and stops when it returns.
//
// # Failure modes
//
// An etcd call that fails with a timeout, Unavailable or a leader change may
// still have committed. The store never repeats a write blindly: it reads the
// record back and decides again. Every write compares the revision it was
// decided from, so a write that did commit makes its retry's compare fail,
// and every operation recognizes its own effect on read-back (Acquire by
// session and request id, reports by token and kind in the history). Every
// etcd call carries a deadline; when the store cannot reach etcd within the
// operation timeout it returns intent.ErrUnavailable, and the caller may
// retry the same call safely.
//
// A report from the current token is accepted even after the holder's
// session lapsed, as long as no newer token was issued: it is the best
// evidence there is. A report under a superseded token changes nothing; it
// is appended to the history as evidence.
//
// Final records (COMPLETED, FAILED, CANCELLED) never change their state or
// result, so the store replays them from memory without touching etcd,
// until their retention ends. Records that are not final are always read
// linearizably.
//
// # Retention
//
// A final record is kept for its retention (the server's default unless its
// registration asked for another, up to a maximum), counted from when it
// became final. Then the janitor removes it and its index keys and leaves a
// tombstone, in one transaction; Register and Acquire of that key answer
// EXPIRED from then on: the work needs a new approval and never executes
// again on its own. Tombstones are removed after their own, longer
// retention (see Tombstones). Intents that are not final are never removed, only counted as
// overdue. Retention is measured with the store's clock (Config.Now): a
// replica whose clock runs ahead removes records early, which costs a
// replay, never a second execution. One replica sweeps at a time (an etcd
// election), and every removal is a compare-and-swap anyway.
//
// The janitor also marks IN_PROGRESS intents whose holder's session has
// lapsed as UNKNOWN, so that the review queue and watchers see them without
// waiting for the next Acquire.
//
// # Tombstones
//
// A tombstone answers one question, whether a tenant's key was finished and
// how, so it is 23 bytes (package tombstones: 16 bytes of SHA-256 of tenant
// and key, the final state, the completion to the second, the end of its
// retention to the day), packed by the hundred into etcd values: etcd's and
// bbolt's per-key costs (some 50 bytes of database and 200 of etcd's
// in-memory index per key) are paid per chunk, not per tombstone. The
// 128-bit hash makes a collision, which would answer a new intent EXPIRED,
// negligible (about 1.5 × 10⁻²¹ for any two of 10⁹ tombstones; the
// package's doc has the arithmetic). A packed tombstone no longer holds the
// fingerprint: an EXPIRED answer's is empty. It lives at least its
// retention, and at most a day longer.
//
// Chunks cover the hashes: the chunk under Z/<bound> holds the entries whose
// hash is at most its bound and above the previous chunk's (which its value
// also holds, as its lower bound); the last chunk's bound is ff…ff and it
// is never removed, so no chunk at all means no tombstone at all.
//
//   - A lookup is a range in the read of the record, at the same revision:
//     from Z/<hex of the hash>, ascending, limit 1, gives the covering chunk;
//     a binary search of its value finds the entry or not. The read is a
//     transaction whose compare is the record's existence: an existing
//     record is read alone, an absent one with its chunk (and its key of an
//     earlier version's tombstone), so that reading an intent costs what it
//     did. Both branches only read: etcd serves it as a read.
//   - A write that relies on a key having no tombstone (a registration, an
//     outbox child) compares the chunk's mod revision with the one read (0:
//     no chunk), and that no tombstone key of an earlier version exists: any
//     change to the chunk refuses the write, and the write loop reads again.
//   - The janitor's removal reads the record and its chunk and, in one
//     transaction comparing both, deletes the record and its index keys and
//     rewrites the chunk with the entry added and those past their day
//     dropped; a chunk past tombstones.MaxEntries splits at the median, the
//     left half under a new key (its last hash as bound). Its walk over the
//     chunks goes by what it knows of them (each one's size and earliest
//     day, in memory), so that it reads only the chunks it rewrites, a
//     bounded number a pass: it drops what is past its day and merges a
//     chunk left with fewer than tombstones.MinEntries into its right
//     neighbour. Records due together whose entries go into one known chunk
//     are removed together, in one transaction that compares each record and
//     the chunk, rewritten once. Group commit never
//     puts two writes of one chunk in one batch (a member's compares and
//     writes are its reads and writes): the second compares the revision
//     the first replaced, fails, and decides again on a fresh read.
//   - Acquire with register writes at once, without reading, when the
//     store can tell that the key has no tombstone: it keeps, for each
//     chunk it read or wrote, its range, its mod revision and a Bloom filter
//     of its hashes (six bits a tombstone), and a key whose chunk is
//     known and whose hash the filter rules out is registered under the
//     guard of that chunk at that revision. Otherwise (the chunk not known
//     yet, a false positive, about 6 %) it reads first, as Register does;
//     a chunk changed since fails the guard, and the loop reads. Every
//     replica learns every chunk when RunJanitor starts (LearnTombstones).
//
// Tombstones of earlier versions (t/<tenant>/z/<key>, indexed under Zr or
// x/zr/) are read alongside, compared alongside, and removed by their index
// when their own retention ends; new ones are only packed. A replica of an
// earlier version does not read packed tombstones: replicas of versions
// before the first release (RELEASES) are all stopped before one of this
// version removes a record. What a tombstone costs: docs/PERFORMANCE.md, "Tombstones,
// packed".
//
// # Archive
//
// With Config.Archive set (issue 26; archive.go, archiver.go), final
// records leave etcd for a second tier, the archive (package archive, on
// PostgreSQL), Config.ArchiveAfter after they became final (or once their
// retention ended): etcd keeps live intents, sessions, leases and an hour
// or so of final ones. No key of etcd's layout is added: the archiver
// finds candidates in the retention index (Xr, both layouts), which every
// version writes when a record becomes final, so records finalized before
// the archive was turned on, or by a replica without it, are found as
// well (the backfill, a bounded walk of the whole index after each
// election and hourly, finds those of a retention longer than the
// default). Without an archive nothing of this runs.
//
//   - The move writes the archive first, an idempotent upsert of the
//     record's etcd value byte for byte and its mod revision, then deletes
//     the record and its index keys in one transaction that compares the
//     record's mod revision with the one archived and the mod revision of
//     the tombstone chunk covering its hash (see Tombstones) with the one
//     read, and puts that chunk again as it was (none yet: the empty last
//     chunk), so that its mod revision moves. A crash between the two
//     leaves the record in etcd, answering as before, and the next pass
//     writes the archive again; two archivers at once both write the
//     archive (one row) and one deletes.
//   - A key etcd holds neither a record nor a tombstone of is looked up
//     in the archive after the etcd read (at revision R) that found it
//     absent: its record, else its tombstone. Every creation (Register,
//     Acquire with register, an outbox child) is guarded by the chunk of
//     its key at the revision read, as for tombstones. A move of the key
//     before R wrote the archive before its delete, so the lookup (after
//     R) finds it; a move after R rewrote the chunk, the creation's write
//     fails, and the write loop reads again. Acquire's write without a
//     read asks the archive after taking the chunk's revision it is
//     guarded by: the same argument, with that revision for R. So no key
//     is created twice, and a moved record answers as before its move:
//     the same bytes decode to the same record at the same revision
//     (replays, mismatches, Get, history).
//   - The lookup is spared when this replica's filter of archived keys
//     (RunArchiveFilter, archivefilter.go) rules the key out: it holds
//     every key moved up to a revision at or past the chunk's, so a new
//     key is one etcd write, as without an archive, also while the
//     archive is down.
//   - An archived record is final and never written again: a late
//     report's evidence is not recorded (Report answers its refusal
//     without the write). The archive is read only for what etcd does not
//     hold: calls on live intents never wait for it. A call that must ask
//     it and cannot fails at once with intent.ErrArchiveUnavailable (also
//     intent.ErrUnavailable), never a guess.
//   - List merges the index scan of etcd (at the listing's revision) with
//     the archive's listing, by position, a key once: one page token
//     across both tiers. Get's children are merged likewise, for an
//     intent older than half of ArchiveAfter (a younger one can have no
//     archived child, so its Get never needs the archive). A completion's
//     outbox asks the archive about children etcd does not hold. A
//     registration naming an archived parent is refused as one naming
//     none (the parent's guard is its existence in etcd).
//   - Watch follows etcd alone: a move is no transition, and with an
//     archive a record's deletion is only ever a move, so watchers see no
//     event of it.
//   - Retention: with an archive the janitor removes no record past its
//     retention in etcd and writes no packed tombstone; it moves the
//     record, and the archive keeps it until its retention ends and its
//     tombstone after (its Expire). Tombstones already packed in etcd are
//     read alongside and expire as before.
//
// Records move only while every replica asks the archive (archivegate.go):
// the cluster's format version at FormatArchive, every live replica
// announced with an archive, none unannounced; until then the janitor
// removes records past their retention as without one. The archiver marks
// the cluster (cluster/archive) before its first move, and a replica
// without an archive refuses to join a marked one. Every replica must be
// given the same archive: that one is the same PostgreSQL is the
// operator's to keep (docs/OPERATIONS.md). What the archiver counted:
// Store.ArchiveStats.
//
// # History
//
// An intent's history holds registration, every lease issued (worker,
// token, mode), every report — accepted, or refused and kept as evidence —,
// escalations, decisions, cancellations and outbox children, with who and
// when. Live heartbeats are not written: they touch only the session's etcd
// lease, so their cost does not grow with the intents a worker holds; a
// heartbeat under a superseded token is kept as evidence. The history is
// bounded at 128 entries: past that, heartbeat evidence and other refused
// reports are dropped oldest first, then the oldest entries after the
// registration.
package etcdstore
