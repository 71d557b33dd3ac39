package bytelru_test

import (
	"testing"

	"github.com/intentd/intentd/internal/core/bytelru"
)

// kib is a value of a KiB, about a store's compact record entry (the
// sketch is sized for entries of about that size).
var kib = string(make([]byte, 1024))

// round asks for keys 0 … keys-1 in turn, rounds times, adding each
// missed one (a KiB) as the miss path of a store does (admit: by Admit,
// else by Add), and returns the share of the last round's requests the
// cache answered.
func round(t *testing.T, c *bytelru.Cache[int, string], keys, rounds int, admit bool) float64 {
	t.Helper()
	hits := 0
	for range rounds {
		hits = 0
		for k := range keys {
			if _, ok := c.Ask(k); ok {
				hits++
				continue
			}
			if admit {
				c.Admit(k, kib)
			} else {
				c.Add(k, kib)
			}
		}
	}
	return float64(hits) / float64(keys)
}

// A round of requests larger than the cache: added by Add (least recently
// used alone), every request misses and evicts the entry asked for next;
// added by Admit, the entries already held stay and answer their share.
func TestAdmitKeepsWhatARoundLargerThanTheCacheFinds(t *testing.T) {
	const o = bytelru.EntryOverhead
	const held, keys = 1000, 3000
	budget := int64(held * (o + len(kib)))
	for _, tc := range []struct {
		admit       bool
		least, most float64
	}{
		{admit: false, least: 0, most: 0},
		{admit: true, least: 0.25, most: 1.0 / 3},
	} {
		c, err := bytelru.NewAdmitting[int, string](budget, size, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := round(t, c, keys, 5, tc.admit)
		t.Logf("admit %v: the last round found %.3f of its keys", tc.admit, got)
		if got < tc.least || got > tc.most {
			t.Errorf("admit %v: the last round found %.2f of its keys, want %.2f to %.2f", tc.admit, got, tc.least, tc.most)
		}
		if c.Bytes() > budget {
			t.Errorf("admit %v: %d bytes held, over the budget %d", tc.admit, c.Bytes(), budget)
		}
	}
}

// While the cache has room, Admit adds as Add does; once it is full, a
// key asked for more often than the least recently used entry goes in,
// and one asked for as often does not.
func TestAdmitWhenFullTakesTheMoreFrequentKey(t *testing.T) {
	const o = bytelru.EntryOverhead
	c, err := bytelru.NewAdmitting[int, string](3*(o+1), size, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 3 {
		if !c.Admit(k, "v") {
			t.Fatalf("key %d not admitted into a cache with room", k)
		}
	}
	c.Asked(0)
	c.Asked(10)
	c.Asked(10)
	if c.Admit(10, "v") {
		t.Fatal("a key asked for once before the request that brings it was admitted over one asked for once")
	}
	for range 4 {
		c.Asked(11)
	}
	if !c.Admit(11, "v") {
		t.Fatal("a key asked for four times was not admitted over one asked for once")
	}
	if _, ok := c.Get(0); ok {
		t.Error("the least recently used entry is still held after a key was admitted in its place")
	}
	if _, ok := c.Get(11); !ok {
		t.Error("the admitted key is not held")
	}
	if !c.Admit(1, "w") {
		t.Error("a key the cache holds was not replaced")
	}
}

// Keys counted as one share their count: the store counts a record's two
// forms of entry (whole and compact) as the record.
func TestAdmitCountsKeysAsCountedSays(t *testing.T) {
	const o = bytelru.EntryOverhead
	c, err := bytelru.NewAdmitting[int, string](1*(o+1), size, func(k int) int { return k % 100 })
	if err != nil {
		t.Fatal(err)
	}
	c.Admit(1, "v")
	c.Asked(1)
	for range 3 {
		c.Asked(102)
	}
	if !c.Admit(2, "v") {
		t.Error("key 2, counted with 102 as asked for three times, was not admitted over key 1, asked for once")
	}
}

// A cache made by New has no sketch: its Admit is Add.
func TestAdmitWithoutSketchIsAdd(t *testing.T) {
	const o = bytelru.EntryOverhead
	c, err := bytelru.New[int, string](2*(o+int64(len(kib))), size)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 5 {
		if !c.Admit(k, "v") {
			t.Fatalf("key %d not added", k)
		}
	}
	if got := round(t, c, 10, 3, true); got != 0 {
		t.Errorf("a round larger than a cache without a sketch found %.2f of its keys, want 0", got)
	}
}

// A cache of entries much smaller than a KiB, filled with keys each asked
// for three times, still refuses a key asked for once: its sketch widened
// as it filled, so that collisions did not make every count alike.
func TestAdmitOfSmallEntriesTellsCountsApart(t *testing.T) {
	for try := range 20 {
		c, err := bytelru.NewAdmitting(1<<20, func(int, string) int64 { return 64 }, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; ; k++ {
			before := c.Len()
			c.Add(k, "")
			if c.Len() == before {
				break // it evicted one: full
			}
			for range 3 {
				c.Asked(k)
			}
		}
		c.Asked(-1)
		if c.Admit(-1, "") {
			t.Fatalf("try %d: a key asked for once was admitted over %d entries asked for three times", try, c.Len())
		}
	}
}
