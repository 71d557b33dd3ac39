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

// Add sets key's value, most recently used, and evicts the least recently
// used entries until the cache is within its budget again. A value larger
// than the whole budget is not kept (and any older value of key is
// dropped).
func (c *Cache[K, V]) Add(key K, value V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.add(key, value)
}

func (c *Cache[K, V]) add(key K, value V) {
	n := c.size(key, value) + EntryOverhead
	c.lru.Remove(key)
	if n > c.budget {
		return
	}
	for c.used+n > c.budget {
		c.lru.RemoveOldest()
	}
	c.lru.Add(key, entry[V]{v: value, bytes: n})
	c.used += n
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
