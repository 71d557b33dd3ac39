// Package tombstones is the packed tombstone format: what intentd keeps of
// an intent removed after its retention, so that a late retry of its key
// is refused (EXPIRED: it needs a new approval) for as long as the
// tombstone lives.
//
// A tombstone is one 23-byte entry, a standalone encoding (package
// etcdstore packs entries in etcd values; an archive may store the same
// bytes elsewhere):
//
//	offset  size  field
//	0       16    the first 16 bytes of SHA-256(tenant, 0x00, key)
//	16      1     the final state: intent.State (COMPLETED 4, FAILED 5, CANCELLED 7)
//	17      4     when it became final: seconds since the Unix epoch,
//	              big-endian (to 2106; 0: unknown)
//	21      2     the end of the tombstone's retention: days since the
//	              epoch, big-endian (to 2149), rounded up; from that day
//	              (UTC) on the entry may be dropped
//
// Neither a tenant nor a key holds a NUL, so (tenant, 0x00, key) names
// one intent of one tenant. A 128-bit hash makes a collision — a new
// intent refused as EXPIRED because another key, of any tenant, hashed
// alike — negligible: among n = 10⁹ tombstones the chance that any two
// collide is about n²/2¹²⁹ ≈ 1.5 × 10⁻²¹, and the chance that a given new
// key meets one of them n/2¹²⁸ ≈ 3 × 10⁻³⁰.
//
// Entries are kept in chunks: sorted by hash, each chunk covering the
// hashes above its lower bound and up to its upper bound (the chunks of a
// store cover every hash, the last one's upper bound is ff…ff). A chunk's
// value is a format byte (0x01), its lower bound (16 bytes), then its
// entries; its upper bound is its name (etcdstore's key). Rechunk is the
// one way chunks change: entries added, expired ones dropped, a chunk
// that outgrew MaxEntries split, small neighbours merged. Set applies it
// in memory, as a store's writes would in etcd.
package tombstones

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"time"

	"github.com/intentd/intentd/intent"
)

// EntrySize is the bytes of one entry.
const EntrySize = 23

// Hash names a tenant's key: the first 16 bytes of SHA-256(tenant, 0x00,
// key). Hashes sort as their bytes do.
type Hash [16]byte

// HashOf is the hash of tenant's key.
func HashOf(tenant, key string) Hash {
	var buf [336]byte // a tenant (64), a NUL and a key (256) fit: no allocation
	b := append(append(append(buf[:0], tenant...), 0), key...)
	sum := sha256.Sum256(b)
	return Hash(sum[:16])
}

// String is the hash in 32 lowercase hex digits, which sort as the hashes
// do.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// ParseHash reads a hash's String.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*len(h) {
		return h, fmt.Errorf("tombstones: hash %q: want %d hex digits", s, 2*len(h))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil || h.String() != s {
		return h, fmt.Errorf("tombstones: hash %q: want lowercase hex", s)
	}
	return h, nil
}

func (h Hash) compare(o Hash) int { return bytes.Compare(h[:], o[:]) }

// Last is the greatest hash: the last chunk's upper bound.
var Last = Hash{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Entry is one tombstone.
type Entry struct {
	Hash  Hash
	State intent.State
	// Completed is when the intent became final, in seconds since the
	// epoch (0: unknown).
	Completed uint32
	// UntilDay is the day (since the epoch, UTC) from which the entry may
	// be dropped: the end of the tombstone's retention, rounded up.
	UntilDay uint16
}

const day = 24 * 60 * 60

// NewEntry is the tombstone of tenant's key, which ended in state at
// completed and is kept until until. A completion time outside what four
// bytes of seconds hold is stored as unknown; an end of retention past
// 2149 as the last day there is.
func NewEntry(tenant, key string, state intent.State, completed, until time.Time) Entry {
	e := Entry{Hash: HashOf(tenant, key), State: state}
	if s := completed.Unix(); !completed.IsZero() && s > 0 && s <= math.MaxUint32 {
		e.Completed = uint32(s)
	}
	d := (until.Unix() + day - 1) / day
	e.UntilDay = uint16(min(max(d, 0), math.MaxUint16))
	return e
}

// CompletedAt is when the intent became final, to the second (the zero
// time when unknown).
func (e Entry) CompletedAt() time.Time {
	if e.Completed == 0 {
		return time.Time{}
	}
	return time.Unix(int64(e.Completed), 0).UTC()
}

// Until is the start of the day from which the entry may be dropped.
func (e Entry) Until() time.Time { return time.Unix(int64(e.UntilDay)*day, 0).UTC() }

// Today is the day of t, as UntilDay counts days: an entry whose UntilDay
// is at most Today(now) may be dropped.
func Today(t time.Time) uint16 {
	return uint16(min(max(t.Unix()/day, 0), math.MaxUint16))
}

// expired reports whether e may be dropped on day today.
func (e Entry) expired(today uint16) bool { return e.UntilDay <= today }

// Append appends e's 23 bytes to b.
func (e Entry) Append(b []byte) []byte {
	b = append(b, e.Hash[:]...)
	b = append(b, byte(e.State))
	b = binary.BigEndian.AppendUint32(b, e.Completed)
	return binary.BigEndian.AppendUint16(b, e.UntilDay)
}

// ParseEntry reads the 23 bytes of an entry.
func ParseEntry(b []byte) (Entry, error) {
	if len(b) != EntrySize {
		return Entry{}, fmt.Errorf("tombstones: an entry of %d bytes, want %d", len(b), EntrySize)
	}
	return entryAt(b), nil
}

func entryAt(b []byte) Entry {
	return Entry{Hash: Hash(b[:16]), State: intent.State(b[16]), Completed: binary.BigEndian.Uint32(b[17:21]), UntilDay: binary.BigEndian.Uint16(b[21:23])}
}

// formatChunk is the first byte of a chunk's value.
const formatChunk = 0x01

// chunkHeader is the bytes before a chunk's entries: the format byte and
// the lower bound.
const chunkHeader = 1 + 16

// MaxEntries bounds a chunk's entries: a chunk that would hold more is
// split. A full chunk is about 11.8 KB; with entries arriving in random
// order of hash, chunks are three quarters full on average (see
// docs/PERFORMANCE.md, "Tombstones, packed").
const MaxEntries = 512

// MinEntries is the fewest entries a chunk keeps once the store's walk
// over its chunks has passed: a smaller one is merged into its right
// neighbour.
const MinEntries = MaxEntries / 4

// ErrCorrupt marks a chunk value that does not decode.
var ErrCorrupt = errors.New("tombstones: corrupt chunk")

// Chunk is the entries of one hash range, (Lo, Hi]: sorted by hash, held
// as their bytes. The first chunk (Lo zero) covers the zero hash too.
type Chunk struct {
	Lo, Hi  Hash
	entries []byte
}

// ParseChunk reads the value of the chunk whose upper bound is hi, and
// checks it whole (Check). It keeps value (the entries are read from it
// when asked for).
func ParseChunk(hi Hash, value []byte) (Chunk, error) {
	c, err := ReadChunk(hi, value)
	if err == nil {
		err = c.Check()
	}
	if err != nil {
		return Chunk{}, err
	}
	return c, nil
}

// ReadChunk is ParseChunk without the check of the entries, which costs as
// much as the lookup it would precede: for a value checked once already
// (a store checks each version of a chunk the first time it reads it).
func ReadChunk(hi Hash, value []byte) (Chunk, error) {
	if len(value) < chunkHeader || value[0] != formatChunk || (len(value)-chunkHeader)%EntrySize != 0 {
		return Chunk{}, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(value))
	}
	c := Chunk{Lo: Hash(value[1:chunkHeader]), Hi: hi, entries: value[chunkHeader:]}
	if c.Lo.compare(c.Hi) > 0 {
		return Chunk{}, fmt.Errorf("%w: lower bound %s above upper bound %s", ErrCorrupt, c.Lo, c.Hi)
	}
	return c, nil
}

// Check reports whether the chunk's entries are in order, distinct and
// within its range.
func (c Chunk) Check() error {
	for i := 1; i < c.Len(); i++ {
		if bytes.Compare(c.hashAt(i-1), c.hashAt(i)) >= 0 {
			return fmt.Errorf("%w: entries out of order at %d", ErrCorrupt, i)
		}
	}
	if n := c.Len(); n > 0 && (!c.Covers(Hash(c.hashAt(0))) || !c.Covers(Hash(c.hashAt(n-1)))) {
		return fmt.Errorf("%w: entries outside (%s, %s]", ErrCorrupt, c.Lo, c.Hi)
	}
	return nil
}

// NewChunk is the chunk (lo, hi] holding entries, which must be sorted by
// hash, distinct and within its range.
func NewChunk(lo, hi Hash, entries []Entry) Chunk {
	b := make([]byte, 0, len(entries)*EntrySize)
	for _, e := range entries {
		b = e.Append(b)
	}
	return Chunk{Lo: lo, Hi: hi, entries: b}
}

// Value is the chunk's stored value.
func (c Chunk) Value() []byte {
	b := make([]byte, 0, chunkHeader+len(c.entries))
	b = append(append(b, formatChunk), c.Lo[:]...)
	return append(b, c.entries...)
}

// Len is how many entries the chunk holds.
func (c Chunk) Len() int { return len(c.entries) / EntrySize }

// At is the chunk's i-th entry.
func (c Chunk) At(i int) Entry { return entryAt(c.entries[i*EntrySize : (i+1)*EntrySize]) }

func (c Chunk) hashAt(i int) []byte { return c.entries[i*EntrySize : i*EntrySize+16] }

// Entries is the chunk's entries, in order.
func (c Chunk) Entries() []Entry {
	out := make([]Entry, c.Len())
	for i := range out {
		out[i] = c.At(i)
	}
	return out
}

// Expiring counts the entries that may be dropped on day today.
func (c Chunk) Expiring(today uint16) int {
	n := 0
	for i := range c.Len() {
		if binary.BigEndian.Uint16(c.entries[(i+1)*EntrySize-2:]) <= today {
			n++
		}
	}
	return n
}

// FirstDay is the earliest UntilDay of the chunk's entries (the last day
// there is when it holds none).
func (c Chunk) FirstDay() uint16 {
	first := uint16(math.MaxUint16)
	for i := range c.Len() {
		first = min(first, binary.BigEndian.Uint16(c.entries[(i+1)*EntrySize-2:]))
	}
	return first
}

// Covers reports whether h is in the chunk's range.
func (c Chunk) Covers(h Hash) bool {
	return (c.Lo == Hash{} || h.compare(c.Lo) > 0) && h.compare(c.Hi) <= 0
}

// Find is the entry of hash h, if the chunk holds one.
func (c Chunk) Find(h Hash) (Entry, bool) {
	i, found := c.search(h)
	if !found {
		return Entry{}, false
	}
	return c.At(i), true
}

// search is where h is, or would be, among the entries.
func (c Chunk) search(h Hash) (int, bool) {
	i := sort.Search(c.Len(), func(i int) bool { return bytes.Compare(c.hashAt(i), h[:]) >= 0 })
	return i, i < c.Len() && bytes.Equal(c.hashAt(i), h[:])
}

// Rechunk is the one way chunks change. It returns the chunks that
// replace run, adjacent chunks in order (each the lower bound of the
// next), after adding entries (each within the run's range; one of the
// hash of an entry there replaces it) and dropping every entry expired on
// day today. They cover what run covered: the first from its lower bound,
// the last up to its upper bound, each other up to its last entry's hash.
// They are as few as hold the entries with at most MaxEntries each, of
// equal sizes give or take one: a full chunk and one entry more split at
// the median, two neighbours that fit in one merge. There is always at
// least one (empty, if nothing is left).
func Rechunk(run []Chunk, add []Entry, today uint16) []Chunk {
	if len(run) == 0 {
		return nil
	}
	// The added entries in order, the last of a hash replacing the
	// others; the run's are in order already.
	adds := slices.Clone(add)
	slices.SortStableFunc(adds, func(a, b Entry) int { return a.Hash.compare(b.Hash) })
	kept := adds[:0]
	for _, e := range adds {
		if len(kept) > 0 && kept[len(kept)-1].Hash == e.Hash {
			kept[len(kept)-1] = e
			continue
		}
		kept = append(kept, e)
	}
	adds = kept
	n := len(adds)
	for _, c := range run {
		n += c.Len()
	}
	all := make([]Entry, 0, n)
	keep := func(e Entry) {
		if !e.expired(today) {
			all = append(all, e)
		}
	}
	j := 0
	for _, c := range run {
		for i := range c.Len() {
			e := c.At(i)
			for ; j < len(adds) && adds[j].Hash.compare(e.Hash) < 0; j++ {
				keep(adds[j])
			}
			if j < len(adds) && adds[j].Hash == e.Hash {
				continue // replaced
			}
			keep(e)
		}
	}
	for ; j < len(adds); j++ {
		keep(adds[j])
	}
	return split(run[0].Lo, run[len(run)-1].Hi, all)
}

// split is the chunks of (lo, hi] holding entries (sorted, within it), as
// few as hold them with at most MaxEntries each, of equal sizes give or
// take one.
func split(lo, hi Hash, entries []Entry) []Chunk {
	k := max(1, (len(entries)+MaxEntries-1)/MaxEntries)
	out := make([]Chunk, 0, k)
	from := 0
	for i := range k {
		to := len(entries) * (i + 1) / k
		bound := hi
		if i < k-1 {
			bound = entries[to-1].Hash
		}
		out = append(out, NewChunk(lo, bound, entries[from:to]))
		lo, from = bound, to
	}
	return out
}

// Set is chunks in memory: what a store's chunks are after the same
// entries were added, one at a time and in the same order, by Rechunk.
// The bench's fill and the tests build chunks with it.
type Set struct{ chunks []Chunk }

// NewSet is a set with no entry: one empty chunk covering every hash.
func NewSet() *Set { return &Set{chunks: []Chunk{{Hi: Last}}} }

// Add adds e to the chunk that covers its hash, as a store's removal
// does, on day today.
func (s *Set) Add(e Entry, today uint16) {
	i := s.covering(e.Hash)
	s.chunks = slices.Replace(s.chunks, i, i+1, Rechunk(s.chunks[i:i+1], []Entry{e}, today)...)
}

// covering is the index of the chunk that covers h.
func (s *Set) covering(h Hash) int {
	return sort.Search(len(s.chunks), func(i int) bool { return s.chunks[i].Hi.compare(h) >= 0 })
}

// Find is the entry of hash h, if the set holds one.
func (s *Set) Find(h Hash) (Entry, bool) { return s.chunks[s.covering(h)].Find(h) }

// Chunks is the set's chunks, in order of hash.
func (s *Set) Chunks() []Chunk { return s.chunks }

// Filter is a Bloom filter of a chunk's hashes: a hash it rules out is
// certainly not in the chunk; one it does not is in it, or, for about 6 %
// of the others (FilterBits bits per entry, 4 probes), a false positive.
// A store keeps one per chunk it read, to register a new key without
// reading its chunk first.
type Filter struct{ bits []uint64 }

// FilterBits is a filter's bits per entry.
const FilterBits = 6

const filterProbes = 4

// NewFilter is the filter of c's hashes.
func NewFilter(c Chunk) Filter {
	n := c.Len()
	if n == 0 {
		return Filter{}
	}
	f := Filter{bits: make([]uint64, (n*FilterBits+63)/64)}
	for i := range n {
		f.probe(Hash(c.hashAt(i)), func(w int, bit uint64) bool { f.bits[w] |= bit; return true })
	}
	return f
}

// MayContain reports whether h may be in the filter's chunk.
func (f Filter) MayContain(h Hash) bool {
	if len(f.bits) == 0 {
		return false
	}
	return f.probe(h, func(w int, bit uint64) bool { return f.bits[w]&bit != 0 })
}

// Bytes is what the filter holds.
func (f Filter) Bytes() int { return 8 * len(f.bits) }

// probe calls each with the word and bit of each of h's probes, while it
// returns true, and reports whether all did. The probes are double
// hashing over the hash's second half and middle (its leading bytes are
// much the same within a chunk), reduced to the filter's size by a
// multiply-shift.
func (f Filter) probe(h Hash, each func(w int, bit uint64) bool) bool {
	m := uint64(len(f.bits)) * 64
	a := binary.LittleEndian.Uint64(h[8:16])
	b := binary.LittleEndian.Uint64(h[4:12]) | 1
	for i := range uint64(filterProbes) {
		pos, _ := bits.Mul64(a+i*b, m)
		if !each(int(pos/64), 1<<(pos%64)) {
			return false
		}
	}
	return true
}
