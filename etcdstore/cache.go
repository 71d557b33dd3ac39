package etcdstore

import (
	"math/bits"
	"strings"
	"time"
	"unsafe"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// The store's caches: records (the newest version this store saw of each
// intent, with a final version's replay memo) and sessions, and what each
// entry costs.

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

// cached is a record and the mod revision it was read or written at.
type cached struct {
	// rec is the record as read; nil once the entry is compact (head).
	rec *machine.Record
	rev int64
	// memo goes with a final record's answers replayed from this version
	// (intent.Memo), nil for a record that is not final. A newer version
	// gets a new entry and so a new memo.
	memo *intent.Memo
	// replayed is set once the memo was handed out with a replay: from
	// then on the entry counts what the memo may hold (memoBytes).
	replayed bool
	// head is what a compact entry keeps of its final record.
	head *finalHead
}

// A final record's replays are answered from its entry, and what their
// caller derives from it (the gRPC server: its converted answer) is kept
// in the entry's memo. Once the store has found a memo holding that
// (its caller keeps answers: answersKept), a final record's entry is made
// compact on the record's first replay: the record goes (the first replay
// still hands it out whole, for its caller to derive from), and the entry
// keeps the record's head and the memo, what the memo holds counted
// against the cache's budget (memoBytes, until the memo says: memoSizer),
// cached apart from whole records (compactKey). Later replays answer with an
// intent of the head's fields alone (tenant, key, state, fingerprint,
// revision, completion and retention times) and the memo, from which
// their caller answers; should the memo be empty then, the replay reads
// the record (replayRead). Until then, and in a store whose
// callers keep nothing in memos, entries keep whole records, and replay
// them whole. A caller that keeps answers says so (KeepsAnswers), and
// then the store need not find out: a store whose replays all miss the
// cache never sees a memo filled, and would decode every miss whole,
// history included, and cache it whole, only to see it evicted.

// KeepsAnswers tells the store that its callers keep what they derive
// from a replayed final record in the memo handed out with it (the gRPC
// server keeps its encoded answer there), so that final records' entries
// are compact from their first replay on.
func (s *Store) KeepsAnswers() { s.answersKept.Store(true) }

// finalHead is what a compact entry keeps of its final record: what
// machine.ReplayFinal decides on, and what an answer from it carries
// besides what the memo holds.
type finalHead struct {
	state       intent.State
	fingerprint string
	// completedAt and retainUntil are Unix nanoseconds, read back in UTC,
	// as a record stores its times (0: none).
	completedAt, retainUntil int64
	// memo is what the memo's content is counted at: memoBytes of the
	// record, until the content says what it holds (exact: memoSizer).
	memo  int64
	exact bool
}

// memoSizer is what a memo's content may say of itself: the heap it
// holds (the gRPC server's kept answer does).
type memoSizer interface{ HeapBytes() int64 }

func cacheKey(tenant, key string) string { return tenant + "\x00" + key }

// remember caches the newest version seen of a record, and notes a final
// one in the store's hints (finalHints), which outlast the cache.
func (s *Store) remember(tenant, key string, rec *machine.Record, rev int64) {
	s.noteFinal(tenant, key, rec)
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

// noteFinal tells the final hints (finalHints) that tenant's key is
// final, if rec says so.
func (s *Store) noteFinal(tenant, key string, rec *machine.Record) {
	if rec.State.Final() {
		s.hints().note(s.cfg.Prefix, tenant, key)
	}
}

// replayedFrom counts, against the record cache's budget, what the memo
// handed out with a replay may come to hold, the first time it is handed
// out (the version's entry, if still the one cached), and makes the entry
// compact if callers keep answers (answersKept). Callers that read the
// entry skip it once the entry says it was replayed: a replay then takes
// the cache's lock once.
func (s *Store) replayedFrom(tenant, key string, memo *intent.Memo) {
	compact := s.answersKept.Load()
	var whole cached
	s.records.Update(cacheKey(tenant, key), func(c cached) (cached, bool) {
		if c.memo != memo || c.replayed || c.rec == nil {
			return c, false
		}
		c.replayed = true
		whole = c
		return c, !compact
	})
	if compact && whole.rec != nil {
		s.compact(tenant, key, whole)
	}
}

// settle is a later replay's look at a replayed entry: once its memo
// holds what the caller derived, the store knows its callers keep
// answers, a whole entry is made compact, and a compact one counts what
// its memo says it holds (memoSizer), once.
func (s *Store) settle(tenant, key string, c cached) {
	if c.head != nil && c.head.exact {
		return
	}
	v := c.memo.Load()
	if v == nil {
		return
	}
	if !s.answersKept.Load() {
		s.answersKept.Store(true)
	}
	if c.rec != nil {
		s.compact(tenant, key, c)
		return
	}
	m, ok := v.(memoSizer)
	if !ok {
		return
	}
	n := alloc(int(m.HeapBytes()))
	s.records.Update(compactKey(tenant, key), func(e cached) (cached, bool) {
		if e.memo != c.memo || e.head == nil || e.head.exact {
			return e, false
		}
		h := *e.head // replaced, never changed: readers of the entry share it
		h.memo, h.exact = n, true
		e.head = &h
		return e, true
	})
}

// compact replaces the whole entry c of tenant's key by a compact one,
// under compactKey: its record's head, its memo. Should another version's
// entry have replaced c in between, it goes too: that costs a read, never
// a wrong answer.
func (s *Store) compact(tenant, key string, c cached) { s.putCompact(tenant, key, c, false) }

// rememberReplayed caches the compact entry of a final record a replay
// read from etcd (c: the record without its history), if the record cache
// admits it: when the cache is full, only a record replayed more often
// lately than the entry it would evict (bytelru's Admit; replayEntry
// counts the replays). A round of replays larger than the cache, which
// least-recently-used eviction would turn into a round of misses each
// evicting the next, then leaves the entries already held to answer their
// share of it. It reports whether the entry is cached: if not, c's memo is
// the caller's alone.
func (s *Store) rememberReplayed(tenant, key string, c cached) bool {
	return s.putCompact(tenant, key, c, true)
}

// putCompact caches c's compact entry in place of any whole one, by Admit
// if admit is set, else by Add, unless the cache holds a newer version's.
// It reports whether the entry is cached.
func (s *Store) putCompact(tenant, key string, c cached, admit bool) bool {
	r := c.rec
	s.records.Remove(cacheKey(tenant, key))
	ck := compactKey(tenant, key)
	if old, ok := s.records.Peek(ck); ok && old.rev > c.rev {
		return false
	}
	e := cached{rev: c.rev, memo: c.memo, replayed: true, head: &finalHead{state: r.State, fingerprint: r.Fingerprint,
		completedAt: unixNano(r.CompletedAt), retainUntil: unixNano(r.RetainUntil), memo: memoBytes(r)}}
	if admit {
		return s.records.Admit(ck, e)
	}
	s.records.Add(ck, e)
	return true
}

// compactKey is where a compact entry of tenant's key is cached: apart
// from the entries of whole records (cacheKey), so that what decides on a
// cached record (a report, a heartbeat, a submission) never finds one. No
// tenant begins with byte 1.
func compactKey(tenant, key string) string { return "\x01" + tenant + "\x00" + key }

// recordOf is the key a record cache entry's requests are counted under
// (bytelru's Asked): the record's, whether the entry is whole or compact.
func recordOf(k string) string { return strings.TrimPrefix(k, "\x01") }

// replayEntry is the entry a replay of tenant's key is answered from: the
// whole record's, if cached, else a compact one. It counts the replay, for
// the cache's admission of what a replay reads from etcd
// (rememberReplayed).
func (s *Store) replayEntry(tenant, key string) (cached, bool) {
	if c, ok := s.records.Ask(cacheKey(tenant, key)); ok {
		return c, true
	}
	return s.records.Get(compactKey(tenant, key))
}

// cachedEntry is the remembered version of a record, if any, with that
// version's memo and whether a replay has handed it out yet; never a
// compact entry (replayEntry).
func (s *Store) cachedEntry(tenant, key string) (cached, bool) {
	return s.records.Get(cacheKey(tenant, key))
}

// view is a view of the entry's version of the record under key: not
// fresh (see machine.View); nil for a compact entry, which holds too
// little of its record to decide anything but a replay on (and is cached
// apart: compactKey).
func (c cached) view(key string) *machine.View {
	if c.rec == nil {
		return nil
	}
	return &machine.View{Key: key, Rec: c.rec, Rev: c.rev}
}

// replayView is the view a replay of tenant's key is decided on: the
// entry's record, or for a compact entry its head, when its memo holds
// what the caller derived from the record (nil otherwise: the replay then
// reads the record).
func (c cached) replayView(tenant, key string) *machine.View {
	if c.rec != nil {
		return c.view(key)
	}
	h := c.head
	if h == nil || c.memo.Load() == nil {
		return nil
	}
	return &machine.View{Key: key, Rev: c.rev, Rec: &machine.Record{Tenant: tenant, Key: key, State: h.state,
		Fingerprint: h.fingerprint, CompletedAt: fromUnixNano(h.completedAt), RetainUntil: fromUnixNano(h.retainUntil)}}
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// The store's caches are bounded in bytes (Config.CacheBytes), each entry
// counted at the estimate below: the Go heap its key and value occupy,
// headers and what they point to, as decoded from etcd. The estimate
// counts each allocation (a struct, a string's or slice's bytes) rounded
// up as Go's allocator rounds it (alloc), and a map as the groups of slots
// Go's maps allocate. TestCacheEstimateIsTheHeapARecordHolds
// measures it against the heap that decoded records occupy, and
// TestCacheBytesPerReplayedIntent in package server against the heap that
// replayed intents' entries occupy: whatever a cached entry comes to hold
// (a new field of machine.Record, the converted answer in its memo,
// counted from the first replay on) must be counted here.

// sessionCacheShare is the part of Config.CacheBytes the session cache
// gets; the records get the rest. A worker holds one session entry, much
// smaller than a record's (sessionBytes, recordBytes), while records are
// one per intent.
const sessionCacheShare = 16

// A map of strings is a header and groups of 8 slots (a key and a value
// header each) behind 8 control bytes, filled to 7/8 at most.
const (
	mapHeader    = 48
	mapGroupSize = 8 + 8*2*16
)

var (
	recordSize  = int64(unsafe.Sizeof(machine.Record{}))
	leaseSize   = int64(unsafe.Sizeof(machine.Lease{}))
	resultSize  = int64(unsafe.Sizeof(intent.Result{}))
	failureSize = int64(unsafe.Sizeof(intent.Failure{}))
	eventSize   = int64(unsafe.Sizeof(intent.Event{}))
)

// alloc is n bytes as Go's allocator hands them out: small sizes in
// classes 8 or 16 bytes apart, larger ones in steps of an eighth of
// their power of two (close to its size classes; above 32 KiB, pages).
func alloc(n int) int64 {
	switch {
	case n <= 0:
		return 0
	case n <= 32:
		return int64((n + 7) &^ 7)
	case n <= 256:
		return int64((n + 15) &^ 15)
	}
	step := 1 << (bits.Len(uint(n-1)) - 3)
	return int64((n + step - 1) &^ (step - 1))
}

// cachedBytes estimates a record cache entry besides the cache's own
// (bytelru.EntryOverhead): its key's bytes, the value and its record (or
// once compact its head), and once replayed what its memo may hold.
func cachedBytes(key string, c cached) int64 {
	n := alloc(len(key)) + int64(unsafe.Sizeof(c)) + recordBytes(c.rec)
	if c.memo != nil {
		n += alloc(int(unsafe.Sizeof(*c.memo)))
	}
	switch h := c.head; {
	case h != nil:
		n += headSize + alloc(len(h.fingerprint)) + h.memo
	case c.replayed:
		n += memoBytes(c.rec)
	}
	return n
}

var headSize = alloc(int(unsafe.Sizeof(finalHead{})))

// memoBytes is what a replayed final record's memo may hold until it says
// (memoSizer): no more than the gRPC server's converted answer (an
// AcquireResponse: the intent without its history, params and identity as
// Structs, the result's payload, which the statement shares, and a
// statement of a few hundred bytes), which a Struct's text and some 70
// bytes for each value, field and container (jsonValues) take; the server
// keeps the answer's encoding, smaller. TestCacheBytesPerReplayedIntent in
// package server holds the count to the heap.
func memoBytes(r *machine.Record) int64 {
	n := 1800 + len(r.Params) + 70*jsonValues(r.Params) + len(r.Identity) + 70*jsonValues(r.Identity) +
		2*(len(r.Key)+len(r.Action)+len(r.Summary)) + len(r.ParentKey) + len(r.ParamsVersion) + len(r.Fingerprint)
	if r.Result != nil {
		n += len(r.Result.Payload)
		for k, v := range r.Result.ExternalRefs {
			n += 2 * (len(k) + len(v) + 48)
		}
	}
	for k, v := range r.Labels {
		n += len(k) + len(v) + 48
	}
	return int64(n)
}

// jsonValues counts the bytes of JSON text that begin or separate values
// (':', ',', '[', '{'): at least its values, fields and containers, more
// when its strings hold them too.
func jsonValues(b []byte) int {
	n := 0
	for _, c := range b {
		switch c {
		case ':', ',', '[', '{':
			n++
		}
	}
	return n
}

// recordBytes estimates the heap a decoded record occupies.
func recordBytes(r *machine.Record) int64 {
	if r == nil {
		return 0
	}
	n := alloc(int(recordSize)) + alloc(len(r.Tenant)) + alloc(len(r.Key)) + alloc(cap(r.Params)) +
		alloc(len(r.ParamsVersion)) + alloc(len(r.Fingerprint)) + alloc(len(r.ParentKey)) +
		alloc(len(r.Action)) + alloc(cap(r.Identity)) + alloc(len(r.Summary))
	n += stringMapBytes(r.Labels)
	if l := r.Lease; l != nil {
		n += alloc(int(leaseSize)) + alloc(len(l.SessionID)) + alloc(len(l.Worker)) + alloc(len(l.RequestID))
	}
	n += resultBytes(r.Result) + failureBytes(r.Failure)
	n += alloc(cap(r.History) * int(eventSize))
	for i := range r.History {
		e := &r.History[i]
		n += alloc(len(e.SessionID)) + alloc(len(e.Worker)) + alloc(len(e.PayloadSHA256)) + alloc(len(e.Reason)) +
			alloc(len(e.Principal)) + alloc(len(e.Channel)) + alloc(len(e.RequestID))
		n += resultBytes(e.Result) + failureBytes(e.Failure)
	}
	n += submissionsBytes(r.Submissions)
	return n
}

func resultBytes(r *intent.Result) int64 {
	if r == nil {
		return 0
	}
	return alloc(int(resultSize)) + alloc(cap(r.Payload)) + stringMapBytes(r.ExternalRefs)
}

func failureBytes(f *intent.Failure) int64 {
	if f == nil {
		return 0
	}
	return alloc(int(failureSize)) + alloc(len(f.Code)) + alloc(len(f.Message))
}

func stringMapBytes(m map[string]string) int64 {
	if m == nil {
		return 0
	}
	groups := max(1, (len(m)*8+6)/7/8)
	n := alloc(mapHeader) + alloc(groups*mapGroupSize)
	for k, v := range m {
		n += alloc(len(k)) + alloc(len(v))
	}
	return n
}

// sessionBytes estimates a session cache entry besides the cache's own:
// its key's bytes and the session.
func sessionBytes(key string, s session) int64 {
	return int64(unsafe.Sizeof(s)) + alloc(len(key)) + alloc(len(s.tenant)) + alloc(len(s.id)) + alloc(len(s.rec.Worker))
}
