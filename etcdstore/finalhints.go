package etcdstore

import (
	"hash/maphash"
	"math/bits"
	"sync/atomic"
)

// finalHints remembers, in 4 bytes each, which intents this store has
// seen final, long after their records left the record cache: a hint,
// never an answer. An Acquire of an intent the cache does not hold but the
// hints name reads the record alone and replays it (replayRead), where it
// would otherwise try to register the intent in a write that must fail (a
// raft round trip for nothing) and read after it. A hint that is wrong
// (its slot's fingerprint another intent's, or the record gone since)
// costs one read: the replay falls back to the whole path.
//
// The table is the store's, sized from its Config.CacheBytes
// (finalHintSlots). Its slots are buckets of 4 32-bit
// fingerprints, a key's in the freer of two buckets (so that a table
// filled to half its slots forgets almost nothing), set and read with
// atomic operations: two calls that race over a slot may lose a hint,
// which costs what a missing one does.
type finalHints struct {
	seed  maphash.Seed
	slots []atomic.Uint32
	mask  uint64 // of a bucket's first slot
}

// finalHintWays is a bucket's slots.
const finalHintWays = 4

// finalHintSlots is the table's slots for a store of cacheBytes: one per
// 128 bytes of the cache (4 bytes each: a 32nd of the cache's budget, and
// many times the final records the cache itself holds), at least 64 Ki
// (256 KiB) and at most 4 Mi (16 MiB), a power of two.
func finalHintSlots(cacheBytes int64) int {
	n := min(max(cacheBytes/128, 1<<16), 1<<22)
	return 1 << (bits.Len64(uint64(n)) - 1)
}

// hints is the store's table of intents seen final.
func (s *Store) hints() *finalHints { return s.finals }

// newFinalHints is an empty table of n slots, a power of two.
func newFinalHints(n int) *finalHints {
	return &finalHints{seed: maphash.MakeSeed(), slots: make([]atomic.Uint32, n), mask: uint64(n-1) &^ (finalHintWays - 1)}
}

// at is where the hint of tenant's key under prefix may live: the first
// slots of its two buckets, and its fingerprint (never 0, the empty slot).
func (h *finalHints) at(prefix, tenant, key string) (b1, b2 int, fp uint32) {
	var m maphash.Hash
	m.SetSeed(h.seed)
	m.WriteString(prefix)
	m.WriteByte(0)
	m.WriteString(tenant)
	m.WriteByte(0)
	m.WriteString(key)
	x := m.Sum64()
	return int(x & h.mask), int(bits.RotateLeft64(x, -16) & h.mask), uint32(x>>32) | 1
}

// note records that tenant's key was seen final: in the first free slot
// of its two buckets, or when both are full, over one of them.
func (h *finalHints) note(prefix, tenant, key string) {
	b1, b2, fp := h.at(prefix, tenant, key)
	free := -1
	for _, b := range [2]int{b1, b2} {
		for i := range finalHintWays {
			switch h.slots[b+i].Load() {
			case fp:
				return
			case 0:
				if free < 0 {
					free = b + i
				}
			}
		}
	}
	if free < 0 {
		// Two full buckets give up the slot the fingerprint picks: which
		// older hint goes is as good as random.
		free = b1
		if fp&0x100 != 0 {
			free = b2
		}
		free += int(fp>>9) % finalHintWays
	}
	h.slots[free].Store(fp)
}

// seen reports whether tenant's key was probably seen final.
func (h *finalHints) seen(prefix, tenant, key string) bool {
	b1, b2, fp := h.at(prefix, tenant, key)
	for i := range finalHintWays {
		if h.slots[b1+i].Load() == fp || h.slots[b2+i].Load() == fp {
			return true
		}
	}
	return false
}
