package bytelru

import (
	"hash/maphash"
	"math/bits"
)

// A cache whose every entry is reached about as often as the others, in
// a round larger than the cache (a fleet retrying more intents than the
// cache holds, each in turn), gets nothing from least-recently-used
// eviction: each entry is evicted before its next use, and every miss
// evicts another that would have been used sooner. Admit keeps such a
// round from churning the cache: a new entry that would evict the least
// recently used one goes in only if its key has been asked for more often
// lately than that one's, as the frequency sketch below estimates (the
// admission policy of TinyLFU: Einziger, Friedman and Manes, "TinyLFU: A
// Highly Efficient Cache Admission Policy", 2017). The entries already
// held then stay, and answer their share of the round.

// sketchRows is the count-min sketch's rows: a key's count is the least
// of its counters, one in each row.
const sketchRows = 4

// sketchMaxCount is where a counter stops counting: the sketch compares
// how often keys were asked for lately, and a few levels are enough.
const sketchMaxCount = 15

// sketch estimates how often each key was asked for lately: a count-min
// sketch of small counters, all halved each time it has counted ten times
// as many requests as a row has counters, so that old counts fade.
type sketch[K comparable] struct {
	seed   maphash.Seed
	counts []uint8 // sketchRows rows of width counters
	mask   uint64  // width-1; width is a power of two
	added  int
}

// sketchLoad is the counters a row the sketch keeps for each entry the
// cache holds (Cache.addSized).
const sketchLoad = 4

// maxSketchWidth bounds a row: 16 MiB of counters in all.
const maxSketchWidth = 1 << 22

// newSketch makes a sketch of width counters a row, rounded up to a power
// of two (at least 64, at most maxSketchWidth).
func newSketch[K comparable](width int) *sketch[K] {
	width = sketchWidth(width)
	return &sketch[K]{
		seed:   maphash.MakeSeed(),
		counts: make([]uint8, sketchRows*width),
		mask:   uint64(width - 1),
	}
}

func sketchWidth(n int) int { return min(maxSketchWidth, max(64, 1<<bits.Len(uint(n-1)))) }

// grow widens the rows to at least n counters (as sketchWidth rounds it),
// keeping every key's count. A sketch with about as many counters a row as
// the cache holds entries, or fewer, counts several keys on most counters:
// a key asked for once then often looks as frequent as one asked for
// often, or, after a halving, more, and the comparison Admit makes becomes
// a coin toss. Widening a row from w to k·w counters copies it k times
// over: a key's counter in the wider row, (h1 + i·h2) mod k·w, is its
// counter in the old one plus a multiple of w, so it starts from the very
// count it had.
func (s *sketch[K]) grow(n int) {
	width := int(s.mask + 1)
	if n <= width || width == maxSketchWidth {
		return
	}
	wider := sketchWidth(n)
	counts := make([]uint8, sketchRows*wider)
	for r := range sketchRows {
		old, row := s.counts[r*width:(r+1)*width], counts[r*wider:(r+1)*wider]
		for at := 0; at < wider; at += width {
			copy(row[at:], old)
		}
	}
	s.counts, s.mask = counts, uint64(wider-1)
}

// halveAt is how many requests the sketch counts before it halves every
// count: ten times as many as a row has counters.
func (s *sketch[K]) halveAt() int { return 10 * int(s.mask+1) }

// slots are the key's counter in each row, from one 64-bit hash split in
// two (h1 + i·h2, as Kirsch and Mitzenmacher index a Bloom filter).
func (s *sketch[K]) slots(key K) [sketchRows]int {
	h := maphash.Comparable(s.seed, key)
	h1, h2 := h&0xffffffff, h>>32|1
	var out [sketchRows]int
	width := int(s.mask + 1)
	for i := range sketchRows {
		out[i] = i*width + int((h1+uint64(i)*h2)&s.mask)
	}
	return out
}

// add counts one request for key. Only the key's least counters grow
// (conservative update): a counter it shares with a key asked for more
// often is left as it is, which keeps colliding keys from inflating each
// other's estimate.
func (s *sketch[K]) add(key K) {
	slots := s.slots(key)
	least := uint8(sketchMaxCount)
	for _, i := range slots {
		least = min(least, s.counts[i])
	}
	if least < sketchMaxCount {
		for _, i := range slots {
			if s.counts[i] == least {
				s.counts[i]++
			}
		}
	}
	s.added++
	if s.added >= s.halveAt() {
		for i := range s.counts {
			s.counts[i] /= 2
		}
		s.added /= 2
	}
}

// count estimates how often key was asked for lately.
func (s *sketch[K]) count(key K) uint8 {
	n := uint8(sketchMaxCount)
	for _, i := range s.slots(key) {
		n = min(n, s.counts[i])
	}
	return n
}
