// Package bytelru is a least-recently-used cache bounded by the bytes its
// entries occupy, not by how many there are: entries of very different
// sizes (a record with a long history, a small session) share one budget
// that says what the cache may cost in memory.
package bytelru

import (
	"fmt"
	"math"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// EntryOverhead is what the cache itself spends on one entry besides the
// key and value the size function counts: its list element, its map slot
// and the bookkeeping of its size. TestEntryOverheadIsWhatAnEntryCosts holds
// it to the heap an entry takes (measured in docs/PERFORMANCE.md, "intentd's
// memory, in short").
const EntryOverhead = 128

// Cache is an LRU cache whose entries' estimated sizes, each plus
// EntryOverhead, add up to at most its budget. It is safe for concurrent
// use.
type Cache[K comparable, V any] struct {
	mu     sync.Mutex
	lru    *simplelru.LRU[K, entry[V]]
	size   func(K, V) int64
	budget int64
	used   int64
	// freq counts the keys asked for (Asked), for Admit, each under the
	// key counted maps it to; nil in a cache made by New, whose Admit is
	// Add.
	freq    *sketch[K]
	counted func(K) K
}

type entry[V any] struct {
	v     V
	bytes int64
}

// New returns a cache of at most budget bytes; size estimates the bytes a
// key and its value occupy (their headers and what they point to).
func New[K comparable, V any](budget int64, size func(K, V) int64) (*Cache[K, V], error) {
	if budget < 1 {
		return nil, fmt.Errorf("bytelru: budget %d: must be at least 1 byte", budget)
	}
	c := &Cache[K, V]{size: size, budget: budget}
	// The entry count is unbounded: the budget evicts (see Add).
	lru, err := simplelru.NewLRU[K, entry[V]](math.MaxInt, func(_ K, e entry[V]) { c.used -= e.bytes })
	if err != nil {
		return nil, err
	}
	c.lru = lru
	return c, nil
}

// NewAdmitting is New, with Admit's policy on: the cache also counts how
// often each key is asked for (Asked), in a frequency sketch of four rows
// of one-byte counters, besides the budget: a counter a row for each KiB
// of budget (1/256 of it), and, once the cache holds more than a quarter
// as many entries (entries under 4 KiB), four counters a row for each
// entry, a row rounded up to a power of two: at most 32 bytes an entry, a
// quarter of the budget if every entry cost no more than EntryOverhead. A
// key is counted under counted(key), so that keys that stand for one
// thing (two forms of one record's entry) share a count; nil counts each
// key as itself.
func NewAdmitting[K comparable, V any](budget int64, size func(K, V) int64, counted func(K) K) (*Cache[K, V], error) {
	c, err := New(budget, size)
	if err != nil {
		return nil, err
	}
	c.freq = newSketch[K](int(min(budget/(256*sketchRows), maxSketchWidth)))
	c.counted = counted
	if c.counted == nil {
		c.counted = func(k K) K { return k }
	}
	return c, nil
}

// Add sets key's value, most recently used, and evicts the least recently
// used entries until the cache is within its budget again. A value larger
// than the whole budget is not kept (and any older value of key is
// dropped).
func (c *Cache[K, V]) Add(key K, value V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.add(key, value)
}

// Admit is Add for a value the caller would do without: when the cache
// is full, so that adding it would evict the least recently used entry,
// it is added only if its key was asked for (Asked, Ask) more often
// lately than that entry's, the request that brought it aside (see
// sketch.go); otherwise the cache is left as it is. It reports whether
// the value was added. A key the cache holds already is replaced, as by
// Add.
func (c *Cache[K, V]) Admit(key K, value V) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.size(key, value) + EntryOverhead
	if c.freq != nil && !c.lru.Contains(key) && c.used+n > c.budget {
		// The key's count holds the request that brought it here, which
		// the victim's does not yet: in a round through more keys than the
		// cache holds, every key is asked for as often, and the one asked
		// for just now would always look the more frequent.
		if victim, _, ok := c.lru.GetOldest(); ok && c.freq.count(c.counted(key)) <= c.freq.count(c.counted(victim))+1 {
			return false
		}
	}
	c.addSized(key, value, n)
	return c.lru.Contains(key)
}

// Asked counts a request for key, for Admit: the caller says what a
// request is (for a store, an Acquire), and counts each once, whether the
// cache answered it or not. A cache made by New counts nothing.
func (c *Cache[K, V]) Asked(key K) {
	if c.freq == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.freq.add(c.counted(key))
}

// Ask is Asked and then Get, under one lock.
func (c *Cache[K, V]) Ask(key K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.freq != nil {
		c.freq.add(c.counted(key))
	}
	e, ok := c.lru.Get(key)
	return e.v, ok
}

func (c *Cache[K, V]) add(key K, value V) { c.addSized(key, value, c.size(key, value)+EntryOverhead) }

// addSized is add of a value whose entry costs n bytes.
func (c *Cache[K, V]) addSized(key K, value V, n int64) {
	c.lru.Remove(key)
	if n > c.budget {
		return
	}
	for c.used+n > c.budget {
		c.lru.RemoveOldest()
	}
	c.lru.Add(key, entry[V]{v: value, bytes: n})
	c.used += n
	if c.freq != nil {
		// Four counters a row for each entry: with fewer, a count
		// that collided in every row is common enough to make a key
		// asked for once look like one asked for often.
		c.freq.grow(sketchLoad * c.lru.Len())
	}
}

// Update replaces key's value, if it holds one, by what f returns when f
// says so, and accounts for its new size (evicting others if it grew), in
// one step: no Add in between can be overwritten by an older value.
func (c *Cache[K, V]) Update(key K, f func(V) (V, bool)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.lru.Peek(key)
	if !ok {
		return
	}
	v, ok := f(e.v)
	if !ok {
		return
	}
	c.add(key, v)
}

// Get returns key's value and marks it most recently used.
func (c *Cache[K, V]) Get(key K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.lru.Get(key)
	return e.v, ok
}

// Peek returns key's value, without marking it used or counting a
// request for it.
func (c *Cache[K, V]) Peek(key K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.lru.Peek(key)
	return e.v, ok
}

// Remove drops key's value, if any.
func (c *Cache[K, V]) Remove(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Remove(key)
}

// Len is how many entries the cache holds.
func (c *Cache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Bytes is the estimated size of what the cache holds, EntryOverhead
// included: never more than its budget.
func (c *Cache[K, V]) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}
