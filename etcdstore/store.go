package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/bytelru"
	"github.com/intentd/intentd/internal/machine"
)

// Config configures a Store. Start from DefaultConfig.
type Config struct {
	// Prefix is prepended to every key; it lets several intentd
	// installations share one etcd cluster.
	Prefix string
	// RequestTimeout bounds each single etcd call.
	RequestTimeout time.Duration
	// OperationTimeout bounds one store operation including its retries
	// after ambiguous outcomes; past it the store returns
	// intent.ErrUnavailable.
	OperationTimeout time.Duration
	// CacheBytes bounds the memory of what the store remembers, in bytes
	// of Go heap as estimated per entry (cache.go): records, of which
	// final ones are replayed from memory and others only seed an
	// optimistic write, and sessions (1/16 of it). The least recently
	// used go first.
	CacheBytes int64
	// DefaultRetention is how long a final record is kept when its
	// registration names no retention; MaxRetention is the most a
	// registration may ask for. TombstoneRetention is how long the
	// tombstone of a removed record is kept.
	DefaultRetention   time.Duration
	MaxRetention       time.Duration
	TombstoneRetention time.Duration
	// MaxAttempts is how many attempts of an intent may end without a
	// report (a lease lapsed, or MarkUnknown) before the intent goes to
	// NEEDS_REVIEW, unless its registration names its own limit (see
	// package machine).
	MaxAttempts int
	// Now tells the time written into history entries and used for
	// retention. Never used to decide lease expiry.
	Now func() time.Time
	// Logger receives the store's rare warnings.
	Logger *slog.Logger
	// TracerProvider receives a span per etcd transaction about an intent
	// (attributes: package traceattr); nil: no tracing.
	TracerProvider trace.TracerProvider
	// ObserveTxn, if set, is told how long each etcd transaction took
	// (reads and guarded writes alike; write is true when it puts or
	// deletes), failed ones included. It runs on the hot path: keep it
	// cheap.
	ObserveTxn func(write bool, d time.Duration)
	// ObserveBatch, if set, is told how many transitions each etcd
	// transaction of the group commit carried (1 when a write went alone;
	// see group.go). It runs on the hot path: keep it cheap.
	ObserveBatch func(transitions int)
}

// DefaultCacheBytes is the default of Config.CacheBytes: about 13,000
// completed intents of the benchmark's size (a record of 300-byte params
// and result with its history is about 2.4 KB decoded; 7 KB once replayed,
// with the server's converted answer), seconds to minutes of a busy
// installation's work, which is when retries come; an older one is
// replayed after one etcd read. Twice as much, with Go's collector's
// headroom, kept the main intentd of the benchmark above 300 MiB.
const DefaultCacheBytes = 32 << 20

// minCacheBytes leaves room for some records and sessions.
const minCacheBytes = 1 << 20

// DefaultMaxAttempts is the default of Config.MaxAttempts: enough for a
// downstream outage of a few minutes to pass through reconciliation (a
// failed lookup is a MarkUnknown, and counts), few enough that an intent
// which kills every worker reaches a human within minutes.
const DefaultMaxAttempts = 10

// DefaultConfig returns a Config with production defaults.
func DefaultConfig() Config {
	return Config{
		Prefix:             "/intentd/v1/",
		RequestTimeout:     3 * time.Second,
		OperationTimeout:   10 * time.Second,
		CacheBytes:         DefaultCacheBytes,
		DefaultRetention:   30 * 24 * time.Hour,
		MaxRetention:       365 * 24 * time.Hour,
		TombstoneRetention: 2 * 365 * 24 * time.Hour,
		MaxAttempts:        DefaultMaxAttempts,
		Now:                time.Now,
		Logger:             slog.Default(),
	}
}

// Validate checks the fields and how they relate. Its error is a
// ConfigError listing every field at fault, each named by its Go name; a
// program that sets the fields from flags renames them with Describe.
func (c Config) Validate() error {
	var errs ConfigError
	bad := func(field, value, reason string) {
		errs = append(errs, FieldError{Field: field, Value: value, Reason: reason})
	}
	badAgainst := func(field string, value any, reason, other string, otherValue any) {
		errs = append(errs, FieldError{Field: field, Value: fmt.Sprint(value), Reason: reason, Other: other, OtherValue: fmt.Sprint(otherValue)})
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		bad("Prefix", strconv.Quote(c.Prefix), "must end with /")
	}
	for _, d := range []struct {
		field string
		value time.Duration
	}{
		{"RequestTimeout", c.RequestTimeout}, {"OperationTimeout", c.OperationTimeout},
		{"DefaultRetention", c.DefaultRetention}, {"MaxRetention", c.MaxRetention},
		{"TombstoneRetention", c.TombstoneRetention},
	} {
		if d.value <= 0 {
			bad(d.field, d.value.String(), "must be positive")
		}
	}
	if c.OperationTimeout < c.RequestTimeout {
		badAgainst("OperationTimeout", c.OperationTimeout, "must be at least", "RequestTimeout", c.RequestTimeout)
	}
	if c.CacheBytes < minCacheBytes {
		bad("CacheBytes", strconv.FormatInt(c.CacheBytes, 10), fmt.Sprintf("must be at least %d (1 MiB)", minCacheBytes))
	}
	if c.DefaultRetention > c.MaxRetention {
		badAgainst("DefaultRetention", c.DefaultRetention, "must be at most", "MaxRetention", c.MaxRetention)
	}
	if c.TombstoneRetention < c.DefaultRetention {
		badAgainst("TombstoneRetention", c.TombstoneRetention, "must be at least", "DefaultRetention", c.DefaultRetention)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > intent.MaxAttemptsLimit {
		bad("MaxAttempts", strconv.Itoa(c.MaxAttempts), fmt.Sprintf("want 1 to %d", intent.MaxAttemptsLimit))
	}
	if c.Now == nil {
		bad("Now", "", "must be set")
	}
	if c.Logger == nil {
		bad("Logger", "", "must be set")
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// FieldError is one Config field whose value Validate refuses, alone or
// against another field.
type FieldError struct {
	// Field is the field at fault, by its Go name ("DefaultRetention");
	// Value is its value as the message shows it ("" for an unset func).
	Field, Value string
	// Reason says what is wrong: "must be positive", "must be at most".
	Reason string
	// Other and OtherValue name the field Reason compares Field with, if
	// any ("MaxRetention", "8760h0m0s").
	Other, OtherValue string
}

// Describe spells e with each field named by name(field): a daemon passes
// a table from field to flag, so that the message names what the operator
// typed ("--retention 720h0m0s: must be at most --max-retention 1h0m0s").
func (e FieldError) Describe(name func(field string) string) string {
	s := name(e.Field)
	if e.Value != "" {
		s += " " + e.Value
	}
	s += ": " + e.Reason
	if e.Other != "" {
		s += " " + name(e.Other) + " " + e.OtherValue
	}
	return s
}

// ConfigError is the error of Config.Validate: every field at fault.
type ConfigError []FieldError

// Error lists the faults with the fields' Go names.
func (e ConfigError) Error() string {
	msgs := make([]string, len(e))
	for i, f := range e {
		msgs[i] = f.Describe(func(field string) string { return field })
	}
	return "etcdstore: config: " + strings.Join(msgs, "; ")
}

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

// CacheUsage is what the store's caches hold now: entries, and their
// estimated bytes of heap (at most Config.CacheBytes together).
type CacheUsage struct {
	Records, RecordBytes   int64
	Sessions, SessionBytes int64
}

// CacheUsage returns what the store's caches hold.
func (s *Store) CacheUsage() CacheUsage {
	return CacheUsage{
		Records: int64(s.records.Len()), RecordBytes: s.records.Bytes(),
		Sessions: int64(s.sessions.Len()), SessionBytes: s.sessions.Bytes(),
	}
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

// cached is a record and the mod revision it was read or written at.
type cached struct {
	rec *machine.Record
	rev int64
	// memo goes with a final record's answers replayed from this version
	// (intent.Memo), nil for a record that is not final. A newer version
	// gets a new entry and so a new memo.
	memo *intent.Memo
	// replayed is set once the memo was handed out with a replay: from
	// then on the entry counts what the memo may hold (cachedBytes).
	replayed bool
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

func cacheKey(tenant, key string) string { return tenant + "\x00" + key }

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

// remember caches the newest version seen of a record.
func (s *Store) remember(tenant, key string, rec *machine.Record, rev int64) {
	k := cacheKey(tenant, key)
	if old, ok := s.records.Get(k); ok && old.rev >= rev {
		return
	}
	c := cached{rec: rec, rev: rev}
	if rec.State.Final() {
		c.memo = new(intent.Memo)
	}
	s.records.Add(k, c)
}

// replayedFrom counts, against the record cache's budget, what the memo
// handed out with a replay may come to hold, the first time it is handed
// out (the version's entry, if still the one cached). Callers that read
// the entry skip it once the entry says it was replayed: a replay then
// takes the cache's lock once.
func (s *Store) replayedFrom(tenant, key string, memo *intent.Memo) {
	s.records.Update(cacheKey(tenant, key), func(c cached) (cached, bool) {
		if c.memo != memo || c.replayed {
			return c, false
		}
		c.replayed = true
		return c, true
	})
}

// cachedEntry is the remembered version of a record, if any, with that
// version's memo and whether a replay has handed it out yet.
func (s *Store) cachedEntry(tenant, key string) (cached, bool) {
	return s.records.Get(cacheKey(tenant, key))
}

// view is a view of the entry's version of the record under key: not
// fresh (see machine.View).
func (c cached) view(key string) *machine.View {
	return &machine.View{Key: key, Rec: c.rec, Rev: c.rev}
}

// decideFunc is one call's decide function of package machine, bound to
// its call and clock. It may be called several times, once per attempt.
type decideFunc func(v *machine.View) machine.Decision

// transition decides on a view of the intent and commits the decision's
// writes with compare-and-swap, deciding again on a fresh read whenever a
// guard fails or the outcome of a commit is ambiguous. It never writes
// without comparing the revision the decision was made from, so a retried
// write can never apply twice. It returns the decision's answer, or its
// refusal (after writing the evidence the decision keeps, if any).
func (s *Store) transition(ctx context.Context, tenant, key string, start *machine.View, load func(context.Context) (*machine.View, error), decide decideFunc) (machine.Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OperationTimeout)
	defer cancel()
	v := start
	// full is set once etcd answered NOSPACE: the store is full, but the
	// write may have been applied anyway (etcd applies the write that
	// crosses the quota, then raises the alarm and answers NOSPACE). Read
	// back like any ambiguous outcome; only a decision that still needs a
	// write is refused as full.
	full := false
	for attempt := 0; ; attempt++ {
		if v == nil {
			var err error
			if v, err = load(ctx); err != nil {
				if errors.Is(err, errCorrupt) {
					return machine.Answer{}, err
				}
				if werr := s.backoff(ctx, attempt, err); werr != nil {
					return machine.Answer{}, werr
				}
				continue
			}
		}
		d := decide(v)
		if id := d.NeedSession; id != "" {
			// The decision shows a holder the view did not read: read
			// it, then decide again on the same view.
			kv, err := s.getSession(ctx, tenant, id)
			if err != nil {
				if werr := s.backoff(ctx, attempt, err); werr != nil {
					return machine.Answer{}, werr
				}
				continue
			}
			if v.Sessions == nil {
				v.Sessions = map[string]int64{}
			}
			v.Sessions[id] = createRevision(kv)
			continue
		}
		if (d.Err != nil || !d.Writes()) && !v.Fresh {
			v = nil // confirm a refusal or a no-op on a fresh read
			continue
		}
		if !d.Writes() {
			return answered(d.Answer, d.Err)
		}
		if full {
			return machine.Answer{}, fmt.Errorf("%w: etcd's backend quota is exhausted (NOSPACE alarm)", intent.ErrStoreFull)
		}
		cctx, span := s.startSpan(ctx, "etcd txn", tenant, key)
		res, next, err := s.commit(cctx, tenant, v, &d)
		endCommit(span, attempt, &d, res, err)
		if errors.Is(err, intent.ErrTooLarge) {
			return machine.Answer{}, err
		}
		if errors.Is(err, rpctypes.ErrNoSpace) {
			full, v = true, nil // reads are still served
			continue
		}
		if errors.Is(err, ErrRevisionWentBack) {
			// Refused, not ambiguous: the write may have been applied by
			// the etcd that went back, but nothing of it reaches the
			// caller, and trying again would be refused the same way.
			return machine.Answer{}, err
		}
		if errors.Is(err, rpctypes.ErrRequestTooLarge) {
			// etcd refused the request whole: nothing was written, and
			// sending it again would fail the same way.
			return machine.Answer{}, fmt.Errorf("%w: etcd refused it: %v", intent.ErrTooLarge, err)
		}
		if err != nil {
			// The write may or may not have committed: read back and
			// decide again. The compare keeps a committed write from
			// applying twice; the decision recognizes its own effect.
			s.stats.ambiguous.Add(1)
			s.cfg.Logger.Debug("etcdstore: ambiguous commit, reading back", "tenant", tenant, "key", key, "err", err)
			if werr := s.backoff(ctx, attempt, err); werr != nil {
				return machine.Answer{}, werr
			}
			v = nil
			continue
		}
		if !res.succeeded {
			s.stats.conflicts.Add(1)
			v = nil
			continue
		}
		s.stats.commits.Add(1)
		committed := s.committed(tenant, key, &d, next, res.rev)
		return answered(d.Finish(committed, res.rev), d.Err)
	}
}

// answered is a decision's answer, or its refusal and no answer.
func answered(a machine.Answer, refusal error) (machine.Answer, error) {
	if refusal != nil {
		return machine.Answer{}, refusal
	}
	return a, nil
}

// committed updates the cache and the counters after d committed at
// revision rev, with next the value written for d.Next, and returns the
// record as a reader now sees it (tokens materialized; nil when the record
// was removed).
func (s *Store) committed(tenant, key string, d *machine.Decision, next []byte, rev int64) *machine.Record {
	var committed *machine.Record
	if d.Next != nil {
		// The cache and the caller see exactly what a reader would.
		committed = asCommitted(d.Next, rev)
		if checkCommitted != nil {
			checkCommitted(tenant, key, committed, next, rev)
		}
		s.remember(tenant, key, committed, rev)
	} else {
		s.records.Remove(cacheKey(tenant, key))
	}
	switch d.Ended {
	case machine.EndedMarkedUnknown:
		s.stats.markedUnknown.Add(1)
	case machine.EndedLapsedAtAcquire:
		s.stats.lapsesByAcquire.Add(1)
	case machine.EndedLapsedAtSweep:
		s.stats.lapsesByJanitor.Add(1)
	}
	if d.Exhausted {
		s.stats.exhausted.Add(1)
		s.cfg.Logger.Warn("etcdstore: intent needs review: too many attempts ended without a report",
			"tenant", tenant, "key", key, "attempts", committed.Attempts, "max_attempts", machine.AttemptLimit(committed, s.cfg.MaxAttempts))
	}
	return committed
}

// checkCommitted, set by the store's tests, is told each record committed
// and the value it was written as, to check that asCommitted is what
// decodeRecord would give.
var checkCommitted func(tenant, key string, committed *machine.Record, value []byte, rev int64)

// maxTxnOps is etcd's default limit of operations in one transaction
// (--max-txn-ops; the embedded etcd keeps it).
const maxTxnOps = 128

// commit writes a decision: its guards become the transaction's compares,
// its writes the operations, with the index keys each written record gains
// and loses. The write goes with others in one etcd transaction when some
// are waiting (group.go); a decision too large for a transaction of its
// own is refused here, before it could share one. It returns the value
// written for d.Next, if any.
func (s *Store) commit(ctx context.Context, tenant string, v *machine.View, d *machine.Decision) (outcome, []byte, error) {
	// The record, its index entries, a tombstone's three writes, and each
	// child with its entries: room for all but unusual label counts.
	m := &member{
		cmps:  make([]clientv3.Cmp, len(d.Guards)),
		reads: make([]string, 0, len(d.Guards)),
		ops:   make([]clientv3.Op, 0, 8+6*len(d.Create)),
	}
	for i, g := range d.Guards {
		m.cmps[i] = s.compare(tenant, g)
		m.reads = append(m.reads, string(m.cmps[i].KeyBytes()))
	}
	if d.Issues() {
		m.slot = int(s.slots.Add(1)%machine.TokenSlots) + 1
		d.Next.Lease.Slot = m.slot
	}
	k := s.keys.intent(tenant, v.Key)
	var next []byte
	if d.Next != nil {
		var err error
		if next, err = encodeRecord(d.Next); err != nil {
			return outcome{}, nil, err
		}
		m.ops = append(m.ops, clientv3.OpPut(k, string(storedValue(d.Next, next))))
		m.ops = s.keys.appendIndexOps(m.ops, v.Rec, d.Next)
	}
	if t := d.Tombstone; t != nil {
		tomb, err := encodeTombstone(t)
		if err != nil {
			return outcome{}, nil, err
		}
		m.ops = append(m.ops, clientv3.OpDelete(k), clientv3.OpPut(s.keys.tombstone(tenant, v.Key), string(tomb)),
			clientv3.OpPut(s.keys.tombRetention(t.Until, tenant, v.Key), ""))
		m.ops = s.keys.appendIndexOps(m.ops, v.Rec, nil)
	}
	for _, c := range d.Create {
		val, err := encodeRecord(c)
		if err != nil {
			return outcome{}, nil, err
		}
		m.ops = append(m.ops, clientv3.OpPut(s.keys.intent(tenant, c.Key), string(val)))
		m.ops = s.keys.appendIndexOps(m.ops, nil, c)
	}
	if len(m.ops) > maxTxnOps || len(m.cmps) > maxTxnOps {
		return outcome{}, nil, fmt.Errorf("%w: %d operations, more than etcd's %d per transaction", intent.ErrTooLarge, len(m.ops), maxTxnOps)
	}
	if m.bytes = opsBytes(m.ops); m.bytes > maxTxnBytes {
		return outcome{}, nil, fmt.Errorf("%w: %d bytes, more than the %d one transaction may carry", intent.ErrTooLarge, m.bytes, maxTxnBytes)
	}
	m.writes = make([]string, len(m.ops))
	for i, op := range m.ops {
		m.writes[i] = string(op.KeyBytes())
	}
	o := s.group.commit(ctx, m)
	return o, next, o.err
}

// compare is a guard as an etcd compare.
func (s *Store) compare(tenant string, g machine.Guard) clientv3.Cmp {
	switch g.Kind {
	case machine.RecordAt:
		return clientv3.Compare(clientv3.ModRevision(s.keys.intent(tenant, g.Key)), "=", g.Rev)
	case machine.SessionAlive:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.session(tenant, g.Session)), "=", g.Rev)
	case machine.SessionGone:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.session(tenant, g.Session)), "!=", g.Rev)
	case machine.NoTombstone:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.tombstone(tenant, g.Key)), "=", 0)
	case machine.Exists:
		return clientv3.Compare(clientv3.CreateRevision(s.keys.intent(tenant, g.Key)), ">", 0)
	}
	panic(fmt.Sprintf("etcdstore: guard kind %d has no compare", g.Kind))
}

// maxTxnBytes bounds what one transaction writes, well under etcd's default
// request limit of 1.5 MiB.
const maxTxnBytes = 1 << 20

// opsBytes estimates the request size of a transaction's writes.
func opsBytes(ops []clientv3.Op) int {
	n := 0
	for _, op := range ops {
		n += len(op.KeyBytes()) + len(op.ValueBytes())
	}
	return n
}

// backoff waits before the next attempt, or returns why it must not: the
// caller's context ended, or the operation ran out of time (then the store
// is unavailable, and the caller may retry the same call safely).
func (s *Store) backoff(ctx context.Context, attempt int, cause error) error {
	if errors.Is(cause, ErrRevisionWentBack) {
		return cause // every retry would be refused the same way
	}
	d := min(10*time.Millisecond<<min(attempt, 6), 500*time.Millisecond)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", intent.ErrUnavailable, cause)
	case <-t.C:
		return nil
	}
}

// unavailable wraps an etcd error of a call that wrote nothing: the store
// did not answer — or, for a full backend, refused.
func unavailable(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrRevisionWentBack) {
		return err // a refusal below the floor is already ErrUnavailable
	}
	if errors.Is(err, rpctypes.ErrNoSpace) {
		return fmt.Errorf("%w: %v", intent.ErrStoreFull, err)
	}
	return fmt.Errorf("%w: %v", intent.ErrUnavailable, err)
}

func sessionID(id clientv3.LeaseID) string { return strconv.FormatUint(uint64(id), 16) }

func parseSessionID(s string) (clientv3.LeaseID, bool) {
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil || v == 0 || v > 1<<63-1 {
		return 0, false
	}
	return clientv3.LeaseID(v), true
}
