package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/internal/core/bytelru"
	"github.com/intentd/intentd/internal/core/machine"
)

// Store keeps intents in etcd. It is safe for concurrent use, and several
// Stores (in several intentd replicas) may share one etcd cluster.
type Store struct {
	cfg     Config
	keys    keys
	kv      flooredKV
	leases  clientv3.Lease
	watcher clientv3.Watcher

	// records remembers the newest version this store saw of each intent.
	records *bytelru.Cache[string, cached]
	// sessions remembers sessions this store saw; a session never changes
	// once opened, it only ends.
	sessions *bytelru.Cache[string, session]

	// rules are the state diagram's settings (package machine).
	rules machine.Rules

	stats  stats
	tracer trace.Tracer
	// floor refuses etcd answers below the highest revision seen: see
	// flooredKV.
	floor revisionFloor
	// group sends the transitions' writes, several in one transaction
	// (group.go); slots hands out the token slots of the leases they
	// issue, round robin.
	group *committer
	slots atomic.Uint64
	// watches numbers the watches, each on a gRPC stream of its own
	// (Watch).
	watches atomic.Uint64
	// chunks is what the store knows of the packed tombstones' chunks,
	// walk where the janitor's walk over them is (packed.go).
	chunks chunkMap
	walk   walkCursor
	// learnt is closed once LearnTombstones first succeeds.
	learnt     chan struct{}
	learntOnce sync.Once
	// answersKept is set once this store found a memo handed out with a
	// replay holding what its caller derived from it (the gRPC server does
	// on every replay's first): see cache.go. finals is the table of
	// intents seen final (finalhints.go).
	answersKept atomic.Bool
	finals      *finalHints
	// archive is the cold tier, if one is configured (archive.go);
	// formats decides which storage formats the store writes
	// (formatgate.go).
	archive archiveTier
	formats formatGate
}

// stats counts what the store did, for metrics.
type stats struct {
	commits, conflicts, ambiguous, replays, exhausted atomic.Int64
	markedUnknown, lapsesByAcquire, lapsesByJanitor   atomic.Int64
	// tombstonesDropped counts packed tombstones dropped past their
	// retention by a removal's rewrite of their chunk (the janitor's walk
	// counts its own).
	tombstonesDropped atomic.Int64
}

// Stats is a snapshot of the store's counters since it started.
type Stats struct {
	// Commits counts transitions written to etcd.
	Commits int64
	// Conflicts counts writes whose compare failed (someone else changed
	// the intent first): decided again on a fresh read.
	Conflicts int64
	// Ambiguous counts writes whose outcome was unknown (timeout, lost
	// reply, leader change): read back, never blindly repeated.
	Ambiguous int64
	// Replays counts final intents replayed from memory, without etcd.
	Replays int64
	// AttemptsExhausted counts intents this store moved to NEEDS_REVIEW
	// because too many of their attempts ended without a report.
	AttemptsExhausted int64
	// MarkedUnknown counts accepted MarkUnknown reports that moved an
	// intent to UNKNOWN (a repeated report of the same token, which
	// changes nothing, is not counted again).
	MarkedUnknown int64
	// LapsesByAcquire and LapsesByJanitor count leases found lapsed
	// without a report (their holder's session ended) and recorded as such,
	// by the path that noticed: an Acquire of the intent, or the janitor's
	// sweep. Each lapse is recorded once, by whichever comes first.
	LapsesByAcquire, LapsesByJanitor int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Commits: s.stats.commits.Load(), Conflicts: s.stats.conflicts.Load(),
		Ambiguous: s.stats.ambiguous.Load(), Replays: s.stats.replays.Load(),
		AttemptsExhausted: s.stats.exhausted.Load(), MarkedUnknown: s.stats.markedUnknown.Load(),
		LapsesByAcquire: s.stats.lapsesByAcquire.Load(), LapsesByJanitor: s.stats.lapsesByJanitor.Load(),
	}
}

// session is what the store knows of an open session.
type session struct {
	tenant string
	id     string
	rev    int64 // create revision of the session key
	lease  clientv3.LeaseID
	rec    sessionRecord
}

// machine is the session as the state diagram sees it.
func (s session) machine() machine.Session {
	return machine.Session{ID: s.id, Rev: s.rev, Worker: s.rec.Worker}
}

// New returns a Store on the client's cluster.
func New(c *clientv3.Client, cfg Config) (*Store, error) {
	return newStore(c.KV, c.Lease, c.Watcher, cfg)
}

func newStore(kv clientv3.KV, leases clientv3.Lease, watcher clientv3.Watcher, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	forSessions := cfg.CacheBytes / sessionCacheShare
	records, err := bytelru.NewAdmitting(cfg.CacheBytes-forSessions, cachedBytes, recordOf)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: %w", err)
	}
	sessions, err := bytelru.New(forSessions, sessionBytes)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: %w", err)
	}
	s := &Store{cfg: cfg, keys: keys{cfg.Prefix}, leases: leases, watcher: watcher, records: records, sessions: sessions,
		rules:  machine.Rules{DefaultRetention: cfg.DefaultRetention, TombstoneRetention: cfg.TombstoneRetention, MaxAttempts: cfg.MaxAttempts},
		tracer: newTracer(cfg.TracerProvider), finals: newFinalHints(finalHintSlots(cfg.CacheBytes))}
	s.archive.a, s.archive.after = cfg.Archive, cfg.ArchiveAfter
	s.floor.wentBack = make(chan struct{})
	s.learnt = make(chan struct{})
	// Every key-space call goes through the floor, in this one place.
	s.kv = flooredKV{kv: kv, local: cfg.LocalGet, floor: &s.floor, observe: cfg.ObserveTxn}
	s.group = &committer{kv: s.kv, timeout: cfg.RequestTimeout, observe: cfg.ObserveBatch}
	return s, nil
}

// Ping reads from etcd linearizably: it succeeds only while a quorum
// answers. Health checks use it.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	_, err := s.kv.Get(ctx, s.cfg.Prefix+"ping", clientv3.WithCountOnly())
	return unavailable(err)
}

// read returns a fresh view of an intent and, when its record is absent,
// its tombstone; of the other intents named (records and tombstones); and
// of the given sessions, in one linearizable read.
func (s *Store) read(ctx context.Context, tenant, key string, others []string, sessionIDs ...string) (*machine.View, error) {
	return s.readView(ctx, tenant, key, false, others, sessionIDs)
}

// readView is read; with spot set, it reads the key's tombstone spot even
// when its record exists (the janitor's removal writes the tombstone
// there). With an archive, a key etcd holds neither a record nor a
// tombstone of is looked up in the archive (unless spot is set).
//
// A record and its tombstone are never both there, and a read of an
// existing intent needs no tombstone: so the read is a transaction whose
// compare is the record's existence, reading the record alone when it
// exists, else the tombstone's spots too (packed.go), at the same
// revision. Both branches only read: etcd serves it as a read.
func (s *Store) readView(ctx context.Context, tenant, key string, spot bool, others []string, sessionIDs []string) (*machine.View, error) {
	v, err := s.readOnce(ctx, tenant, key, spot, true, others, sessionIDs)
	if errors.Is(err, errStaleBound) {
		v, err = s.readOnce(ctx, tenant, key, spot, false, others, sessionIDs)
	}
	if err == nil && !spot && v.Rec == nil && v.Tomb == nil && s.archive.on() &&
		!s.archive.filter.rulesOut(tombstones.HashOf(tenant, key), v.Spots[key].Rev) {
		// etcd does not hold the key: the archive may (archive.go), unless
		// its filter rules the key out (archivefilter.go). Asked after the
		// read, it holds every record moved before it (see the package
		// doc, "Archive").
		if err := s.fromArchive(ctx, tenant, key, v); err != nil {
			return nil, err
		}
	}
	return v, err
}

// readOnce is readView, the chunks' ranges bounded by what the store knows
// of them when bounded is set (spotOps).
func (s *Store) readOnce(ctx context.Context, tenant, key string, spot, bounded bool, others []string, sessionIDs []string) (*machine.View, error) {
	rec := clientv3.OpGet(s.keys.intent(tenant, key))
	common := make([]clientv3.Op, 0, 3*len(others)+len(sessionIDs))
	otherBounds := make([]bool, len(others))
	for i, k := range others {
		ops, b := s.spotOps(tenant, k, bounded)
		common = append(append(common, clientv3.OpGet(s.keys.intent(tenant, k))), ops...)
		otherBounds[i] = b
	}
	for _, id := range sessionIDs {
		common = append(common, clientv3.OpGet(s.keys.session(tenant, id)))
	}
	keyOps, keyBound := s.spotOps(tenant, key, bounded)
	withSpot := append(append([]clientv3.Op{rec}, keyOps...), common...)
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	rctx, span := s.startSpan(rctx, "etcd read", tenant, key)
	txn := s.kv.Txn(rctx)
	if spot {
		txn = txn.Then(withSpot...)
	} else {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(s.keys.intent(tenant, key)), ">", 0)).
			Then(append([]clientv3.Op{rec}, common...)...).
			Else(withSpot...)
	}
	resp, err := txn.Commit()
	endRead(span, err)
	if err != nil {
		return nil, err
	}
	at := 0
	next := func() *pb.RangeResponse {
		r := resp.Responses[at].GetResponseRange()
		at++
		return r
	}
	first := func(r *pb.RangeResponse) *mvccpb.KeyValue {
		if kvs := r.GetKvs(); len(kvs) > 0 {
			return kvs[0]
		}
		return nil
	}
	v := &machine.View{Key: key, Fresh: true, Sessions: map[string]int64{}, Others: map[string]machine.Other{}, Spots: map[string]machine.TombstoneSpot{}}
	if v.Rec, v.Rev, err = decodeAt(tenant, key, first(next())); err != nil {
		return nil, err
	}
	if spot || !resp.Succeeded {
		var sp machine.TombstoneSpot
		if v.Tomb, sp, err = s.decodeSpot(tenant, key, keyBound, next(), next()); err != nil {
			return nil, err
		}
		v.Spots[key] = sp
	}
	for i, k := range others {
		var o machine.Other
		if o.Rec, _, err = decodeAt(tenant, k, first(next())); err != nil {
			return nil, err
		}
		var sp machine.TombstoneSpot
		if o.Tomb, sp, err = s.decodeSpot(tenant, k, otherBounds[i], next(), next()); err != nil {
			return nil, err
		}
		v.Spots[k] = sp
		v.Others[k] = o
	}
	for _, id := range sessionIDs {
		v.Sessions[id] = createRevision(first(next()))
	}
	if v.Rec != nil {
		s.remember(tenant, key, v.Rec, v.Rev)
	}
	return v, nil
}

// decodeAt decodes an intent's record as read (nil when absent), and its
// mod revision.
func decodeAt(tenant, key string, rkv *mvccpb.KeyValue) (rec *machine.Record, rev int64, err error) {
	if rkv == nil {
		return nil, 0, nil
	}
	if rec, err = decodeRecord(tenant, key, rkv.Value, rkv.ModRevision); err != nil {
		return nil, 0, err
	}
	return rec, rkv.ModRevision, nil
}

// createRevision is a session key's create revision, 0 when absent.
func createRevision(kv *mvccpb.KeyValue) int64 {
	if kv == nil {
		return 0
	}
	return kv.CreateRevision
}

// readWithHolder reads an intent and the sessions, then, if the record is
// held by a session not read yet, that session too.
func (s *Store) readWithHolder(ctx context.Context, tenant, key string, others []string, sessionIDs ...string) (*machine.View, error) {
	v, err := s.read(ctx, tenant, key, others, sessionIDs...)
	if err != nil {
		return nil, err
	}
	holder := v.HolderUnread()
	if holder == "" {
		return v, nil
	}
	kv, err := s.getSession(ctx, tenant, holder)
	if err != nil {
		return nil, err
	}
	v.Sessions[holder] = createRevision(kv)
	return v, nil
}

func (s *Store) getSession(ctx context.Context, tenant, id string) (*mvccpb.KeyValue, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, err := s.kv.Get(rctx, s.keys.session(tenant, id))
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0], nil
}

func sessionID(id clientv3.LeaseID) string { return strconv.FormatUint(uint64(id), 16) }

func parseSessionID(s string) (clientv3.LeaseID, bool) {
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil || v == 0 || v > 1<<63-1 {
		return 0, false
	}
	return clientv3.LeaseID(v), true
}
