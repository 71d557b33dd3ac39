package etcdstore

import (
	"math/bits"
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

func cacheKey(tenant, key string) string { return tenant + "\x00" + key }

// remember caches the newest version seen of a record, and notes a final
// one in the process's hints (finalHints), which outlast the cache.
func (s *Store) remember(tenant, key string, rec *machine.Record, rev int64) {
	if rec.State.Final() {
		s.hints().note(s.cfg.Prefix, tenant, key)
	}
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

// The store's caches are bounded in bytes (Config.CacheBytes), each entry
// counted at the estimate below: the Go heap its key and value occupy,
// headers and what they point to, as decoded from etcd. The estimate
// counts each allocation (a struct, a string's or slice's bytes) rounded
// up as Go's allocator rounds it (alloc), and a map as the groups of slots
// Go's maps allocate. TestCacheEstimateIsTheHeapARecordHolds
// measures it against the heap that decoded records occupy: whatever a
// cached entry comes to hold (a new field of machine.Record, the converted
// answer in its memo, counted from the first replay on) must be counted
// here.

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
// (bytelru.EntryOverhead): its key's bytes, the value and its record.
func cachedBytes(key string, c cached) int64 {
	n := alloc(len(key)) + int64(unsafe.Sizeof(c)) + recordBytes(c.rec)
	if c.memo != nil {
		n += alloc(int(unsafe.Sizeof(*c.memo)))
	}
	if c.replayed {
		n += memoBytes(c.rec)
	}
	return n
}

// memoBytes is what a replayed final record's memo may hold: the server's
// converted answer (intent.MemoBytes).
func memoBytes(r *machine.Record) int64 {
	payload := 0
	if r.Result != nil {
		payload = len(r.Result.Payload)
	}
	// The identity is converted to a Struct as the params are; action and
	// summary cost less than that per byte, and counting them with the
	// params keeps the estimate above, never below, what they hold.
	return intent.MemoBytes(len(r.Params)+len(r.Identity)+len(r.Action)+len(r.Summary), payload)
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
