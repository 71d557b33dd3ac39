package bytelru_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/intentd/intentd/internal/core/bytelru"
)

// size counts a string value's bytes; keys are small ints.
func size(_ int, v string) int64 { return int64(len(v)) }

func TestBudgetBoundsTheBytesHeld(t *testing.T) {
	const o = bytelru.EntryOverhead
	for _, tc := range []struct {
		name     string
		budget   int64
		values   []int // sizes of the values added, keys 0, 1, 2 …
		wantKeys []int // keys still held
	}{
		{"all fit", 3 * (o + 10), []int{10, 10, 10}, []int{0, 1, 2}},
		{"the oldest goes", 3 * (o + 10), []int{10, 10, 10, 10}, []int{1, 2, 3}},
		{"a large one evicts several", 3 * (o + 10), []int{10, 10, 10, o + 20}, []int{2, 3}},
		{"one larger than the budget is not kept", 2 * (o + 10), []int{10, 10, 3 * o}, []int{0, 1}},
		{"small entries many", 10 * (o + 1), []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, []int{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := bytelru.New[int, string](tc.budget, size)
			if err != nil {
				t.Fatal(err)
			}
			for k, n := range tc.values {
				c.Add(k, string(make([]byte, n)))
				if got := c.Bytes(); got > tc.budget {
					t.Fatalf("after adding key %d: Bytes() = %d, over the budget %d", k, got, tc.budget)
				}
			}
			var held []int
			var bytes int64
			for k, n := range tc.values {
				if _, ok := c.Get(k); ok {
					held = append(held, k)
					bytes += int64(n) + o
				}
			}
			if !equal(held, tc.wantKeys) {
				t.Errorf("held keys %v, want %v", held, tc.wantKeys)
			}
			if got := c.Bytes(); got != bytes {
				t.Errorf("Bytes() = %d, want %d (the held entries' sizes)", got, bytes)
			}
			if got := c.Len(); got != len(tc.wantKeys) {
				t.Errorf("Len() = %d, want %d", got, len(tc.wantKeys))
			}
		})
	}
}

func TestGetKeepsAnEntryAndReplacingOrRemovingReleasesItsBytes(t *testing.T) {
	const o = bytelru.EntryOverhead
	c, err := bytelru.New[int, string](3*(o+10), size)
	if err != nil {
		t.Fatal(err)
	}
	c.Add(0, "0123456789")
	c.Add(1, "0123456789")
	c.Add(2, "0123456789")
	c.Get(0) // 1 is now the least recently used
	c.Add(3, "0123456789")
	if _, ok := c.Get(1); ok {
		t.Error("key 1 still held, want it evicted (least recently used)")
	}
	if v, ok := c.Get(0); !ok || v != "0123456789" {
		t.Errorf("Get(0) = %q, %v; want it held (used recently)", v, ok)
	}
	c.Add(0, "01234")
	if got, want := c.Bytes(), 3*o+25; got != int64(want) {
		t.Errorf("after replacing a value: Bytes() = %d, want %d", got, want)
	}
	c.Remove(0)
	if got, want := c.Bytes(), 2*o+20; got != int64(want) {
		t.Errorf("after Remove: Bytes() = %d, want %d", got, want)
	}
	c.Add(2, string(make([]byte, 4*o)))
	if _, ok := c.Get(2); ok {
		t.Error("a value over the budget replaced key 2's, want neither kept")
	}
	if got, want := c.Bytes(), o+10; got != int64(want) {
		t.Errorf("after an oversized value: Bytes() = %d, want %d", got, want)
	}
}

func TestUpdateResizesAnEntryInPlace(t *testing.T) {
	const o = bytelru.EntryOverhead
	c, err := bytelru.New[int, string](3*(o+10), size)
	if err != nil {
		t.Fatal(err)
	}
	c.Add(0, "0123456789")
	c.Add(1, "0123456789")
	c.Update(2, func(string) (string, bool) { t.Error("f called for a key not held"); return "", true })
	c.Update(1, func(v string) (string, bool) { return v + v, false })
	if got, want := c.Bytes(), 2*(o+10); got != int64(want) {
		t.Errorf("after an Update that keeps the value: Bytes() = %d, want %d", got, want)
	}
	c.Update(0, func(v string) (string, bool) { return v + v, true })
	if got, want := c.Bytes(), 2*o+30; got != int64(want) {
		t.Errorf("after an Update that grew a value: Bytes() = %d, want %d", got, want)
	}
	c.Update(1, func(v string) (string, bool) { return strings.Repeat(v, 16), true }) // 160 bytes: 0 must go
	if _, ok := c.Get(0); ok {
		t.Error("key 0 still held after key 1 grew past the budget")
	}
	if v, _ := c.Get(1); len(v) != 160 {
		t.Errorf("key 1 = %d bytes, want the updated 160", len(v))
	}
	if got, want := c.Bytes(), o+160; got != int64(want) {
		t.Errorf("Bytes() = %d, want %d", got, want)
	}
}

func TestNewRefusesAnEmptyBudget(t *testing.T) {
	if _, err := bytelru.New[int, string](0, size); err == nil {
		t.Error("New(0) succeeded, want an error")
	}
}

// EntryOverhead is what an entry costs the cache beyond its key and value:
// measured on the heap with values that occupy nothing.
func TestEntryOverheadIsWhatAnEntryCosts(t *testing.T) {
	const n = 100_000
	before := heapInUse()
	c, err := bytelru.New[string, struct{}](1<<40, func(string, struct{}) int64 { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	keysOnly := heapInUse()
	for _, k := range keys {
		c.Add(k, struct{}{})
	}
	perEntry := float64(heapInUse()-keysOnly) / n
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys)
	t.Logf("%.0f bytes per entry besides its key (keys: %.0f bytes each)", perEntry, float64(keysOnly-before)/n)
	if lo, hi := 0.7*perEntry, 1.3*perEntry; bytelru.EntryOverhead < lo || bytelru.EntryOverhead > hi {
		t.Errorf("EntryOverhead = %d, measured %.0f bytes per entry: want within 30%%", bytelru.EntryOverhead, perEntry)
	}
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
