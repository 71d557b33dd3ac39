package etcdstore

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/intentd/intentd/internal/core/bytelru"
	"github.com/intentd/intentd/internal/core/machine"
)

// Store keeps intents in etcd. It is safe for concurrent use, and several
// Stores (in several intentd replicas) may share one etcd cluster.
type Store struct {
	cfg     Config
	keys    keys
	kv      clientv3.KV
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
}

// stats counts what the store did, for metrics.
type stats struct {
	commits, conflicts, ambiguous, replays, exhausted atomic.Int64
	markedUnknown, lapsesByAcquire, lapsesByJanitor   atomic.Int64
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
	records, err := bytelru.New(cfg.CacheBytes-forSessions, cachedBytes)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: %w", err)
	}
	sessions, err := bytelru.New(forSessions, sessionBytes)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: %w", err)
	}
	s := &Store{cfg: cfg, keys: keys{cfg.Prefix}, leases: leases, watcher: watcher, records: records, sessions: sessions,
		rules:  machine.Rules{DefaultRetention: cfg.DefaultRetention, TombstoneRetention: cfg.TombstoneRetention, MaxAttempts: cfg.MaxAttempts},
		tracer: newTracer(cfg.TracerProvider)}
	s.floor.wentBack = make(chan struct{})
	// Every key-space call goes through the floor, in this one place.
	s.kv = flooredKV{kv: kv, floor: &s.floor, observe: cfg.ObserveTxn}
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

// read returns a fresh view of an intent and its tombstone, of the other
// intents named (records and tombstones) and of the given sessions, in one
// linearizable read.
func (s *Store) read(ctx context.Context, tenant, key string, others []string, sessionIDs ...string) (*machine.View, error) {
	ops := []clientv3.Op{clientv3.OpGet(s.keys.intent(tenant, key)), clientv3.OpGet(s.keys.tombstone(tenant, key))}
	for _, k := range others {
		ops = append(ops, clientv3.OpGet(s.keys.intent(tenant, k)), clientv3.OpGet(s.keys.tombstone(tenant, k)))
	}
	for _, id := range sessionIDs {
		ops = append(ops, clientv3.OpGet(s.keys.session(tenant, id)))
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	rctx, span := s.startSpan(rctx, "etcd read", tenant, key)
	resp, err := s.kv.Txn(rctx).Then(ops...).Commit()
	endRead(span, err)
	if err != nil {
		return nil, err
	}
	first := func(i int) *mvccpb.KeyValue {
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			return kvs[0]
		}
		return nil
	}
	v := &machine.View{Key: key, Fresh: true, Sessions: map[string]int64{}, Others: map[string]machine.Other{}}
	if v.Rec, v.Rev, v.Tomb, err = decodeAt(tenant, key, first(0), first(1)); err != nil {
		return nil, err
	}
	for i, k := range others {
		var o machine.Other
		if o.Rec, _, o.Tomb, err = decodeAt(tenant, k, first(2+2*i), first(3+2*i)); err != nil {
			return nil, err
		}
		v.Others[k] = o
	}
	for i, id := range sessionIDs {
		v.Sessions[id] = createRevision(first(2 + 2*len(others) + i))
	}
	if v.Rec != nil {
		s.remember(tenant, key, v.Rec, v.Rev)
	}
	return v, nil
}

// decodeAt decodes an intent's record and tombstone as read (nil when
// absent), and the record's mod revision.
func decodeAt(tenant, key string, rkv, tkv *mvccpb.KeyValue) (rec *machine.Record, rev int64, tomb *machine.Tombstone, err error) {
	if rkv != nil {
		if rec, err = decodeRecord(tenant, key, rkv.Value, rkv.ModRevision); err != nil {
			return nil, 0, nil, err
		}
		rev = rkv.ModRevision
	}
	if tkv != nil {
		if tomb, err = decodeTombstone(key, tkv.Value); err != nil {
			return nil, 0, nil, fmt.Errorf("%w: tombstone of %q: %v", errCorrupt, key, err)
		}
	}
	return rec, rev, tomb, nil
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
