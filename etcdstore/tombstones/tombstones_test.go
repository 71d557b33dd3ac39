package tombstones

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
)

// The entry's bytes are a format other stores keep too: pinned here.
func TestEntryBytesArePinned(t *testing.T) {
	completed := time.Date(2026, 12, 5, 6, 51, 33, 569257044, time.UTC)
	until := time.Date(2028, 12, 4, 6, 51, 34, 0, time.UTC)
	e := NewEntry("default", "purchase-lamp-1", intent.StateCompleted, completed, until)
	got := hex.EncodeToString(e.Append(nil))
	// printf 'default\0purchase-lamp-1' | sha256sum: 2a0488cad5f3579c6e4ffdcd99d19fc2…;
	// COMPLETED is 4; 2026-12-05T06:51:33Z is 1796453493 s (6b13b475);
	// 2028-12-04T06:51:34Z rounds up to day 21523 (5413).
	const want = "2a0488cad5f3579c6e4ffdcd99d19fc2" + "04" + "6b13b475" + "5413"
	if got != want || len(e.Append(nil)) != EntrySize {
		t.Fatalf("entry %s, want %s", got, want)
	}
	back, err := ParseEntry(e.Append(nil))
	if err != nil || back != e {
		t.Fatalf("ParseEntry = %+v, %v, want %+v", back, err, e)
	}
	if !e.CompletedAt().Equal(completed.Truncate(time.Second)) || e.State != intent.StateCompleted {
		t.Errorf("completed %v, state %v", e.CompletedAt(), e.State)
	}
	if !e.Until().Equal(time.Date(2028, 12, 5, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("until %v, want the start of the next day", e.Until())
	}
}

func TestHashOfKeepsTenantAndKeyApart(t *testing.T) {
	cases := [][2][2]string{
		{{"ab", "c"}, {"a", "bc"}},
		{{"default", "a/b"}, {"default", "a//b"}},
		{{"acme", "k"}, {"default", "k"}},
		{{"t", ""}, {"", "t"}},
	}
	for _, c := range cases {
		if HashOf(c[0][0], c[0][1]) == HashOf(c[1][0], c[1][1]) {
			t.Errorf("%q and %q hash alike", c[0], c[1])
		}
	}
	h := HashOf("default", "k")
	if p, err := ParseHash(h.String()); err != nil || p != h {
		t.Errorf("ParseHash(%s) = %s, %v", h, p, err)
	}
	for _, bad := range []string{"", "00", h.String()[:31] + "G", "ABCDEF0123456789ABCDEF0123456789"} {
		if _, err := ParseHash(bad); err == nil {
			t.Errorf("ParseHash(%q) accepted", bad)
		}
	}
}

func TestNewEntryTimes(t *testing.T) {
	for _, c := range []struct {
		name             string
		completed, until time.Time
		wantCompleted    uint32
		wantDay          uint16
	}{
		{"until at midnight stays that day", time.Unix(100, 5e8), time.Unix(3*day, 0), 100, 3},
		{"until a second past midnight is the next day", time.Unix(100, 0), time.Unix(3*day+1, 0), 100, 4},
		{"completion unknown", time.Time{}, time.Unix(day, 0), 0, 1},
		{"completion before 1970", time.Unix(-5, 0), time.Unix(day, 0), 0, 1},
		{"completion past 2106", time.Unix(1<<33, 0), time.Unix(day, 0), 0, 1},
		{"until past 2149 is the last day", time.Unix(1, 0), time.Unix(1<<40, 0), 1, 65535},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := NewEntry("t", "k", intent.StateFailed, c.completed, c.until)
			if e.Completed != c.wantCompleted || e.UntilDay != c.wantDay {
				t.Errorf("completed %d, until day %d; want %d, %d", e.Completed, e.UntilDay, c.wantCompleted, c.wantDay)
			}
		})
	}
	if !(Entry{}).CompletedAt().IsZero() {
		t.Error("an unknown completion is not the zero time")
	}
	if Today(time.Unix(5*day-1, 0)) != 4 || Today(time.Unix(5*day, 0)) != 5 {
		t.Error("Today counts days wrong")
	}
}

// entry is an entry of a hash given by its first bytes.
func entry(prefix string, untilDay uint16) Entry {
	var h Hash
	copy(h[:], mustHex(prefix))
	return Entry{Hash: h, State: intent.StateCompleted, Completed: 1, UntilDay: untilDay}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func hashOf(prefix string) Hash { return entry(prefix, 0).Hash }

func TestChunkValueRoundTrip(t *testing.T) {
	c := NewChunk(hashOf("10"), hashOf("80"), []Entry{entry("20", 9), entry("30", 9), entry("80", 7)})
	back, err := ParseChunk(c.Hi, c.Value())
	if err != nil {
		t.Fatal(err)
	}
	if back.Lo != c.Lo || back.Len() != 3 || back.At(2) != entry("80", 7) {
		t.Fatalf("read back %+v", back.Entries())
	}
	for _, probe := range []struct {
		h     string
		found bool
	}{{"20", true}, {"30", true}, {"80", true}, {"25", false}, {"10", false}, {"81", false}} {
		if _, ok := back.Find(hashOf(probe.h)); ok != probe.found {
			t.Errorf("Find(%s) = %v, want %v", probe.h, ok, probe.found)
		}
	}
	if !back.Covers(hashOf("80")) || back.Covers(hashOf("10")) || !back.Covers(hashOf("1001")) || back.Covers(hashOf("8001")) {
		t.Error("Covers is not (Lo, Hi]")
	}
	if !(Chunk{Hi: Last}).Covers(Hash{}) {
		t.Error("the first chunk does not cover the zero hash")
	}
	valid := c.Value()
	for name, v := range map[string][]byte{
		"empty":              nil,
		"other format":       append([]byte{0x02}, valid[1:]...),
		"a partial entry":    valid[:len(valid)-1],
		"out of order":       NewChunk(hashOf("10"), hashOf("80"), []Entry{entry("30", 9), entry("20", 9)}).Value(),
		"outside its range":  NewChunk(hashOf("10"), hashOf("80"), []Entry{entry("90", 9)}).Value(),
		"a repeated entry":   NewChunk(hashOf("10"), hashOf("80"), []Entry{entry("30", 9), entry("30", 9)}).Value(),
		"lower above higher": NewChunk(hashOf("90"), hashOf("80"), nil).Value(),
	} {
		if _, err := ParseChunk(hashOf("80"), v); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: ParseChunk = %v, want ErrCorrupt", name, err)
		}
	}
}

// spread is n entries, in order, whose hashes start with b.
func spread(b byte, n int, untilDay uint16) []Entry {
	out := make([]Entry, n)
	for i := range out {
		h := Hash{b, byte(1 + i/256), byte(i % 256)}
		out[i] = Entry{Hash: h, State: intent.StateCancelled, UntilDay: untilDay}
	}
	return out
}

func TestRechunk(t *testing.T) {
	const today = 100
	full := NewChunk(Hash{}, Last, spread(0x10, MaxEntries, today+1))
	cases := []struct {
		name  string
		run   []Chunk
		add   []Entry
		sizes []int
	}{
		{"an entry into an empty chunk", []Chunk{{Hi: Last}}, []Entry{entry("50", today+1)}, []int{1}},
		{"an entry into a full chunk splits it at the median", []Chunk{full}, []Entry{entry("f0", today+1)}, []int{MaxEntries / 2, MaxEntries/2 + 1}},
		{"expired entries go", []Chunk{NewChunk(Hash{}, Last, []Entry{entry("20", today), entry("30", today+1)})}, []Entry{entry("40", today+1)}, []int{2}},
		{"an expired entry is not added", []Chunk{{Hi: Last}}, []Entry{entry("40", today)}, []int{0}},
		{"all expired leaves one empty chunk", []Chunk{NewChunk(Hash{}, hashOf("80"), []Entry{entry("20", 1)}), NewChunk(hashOf("80"), Last, []Entry{entry("90", 1)})}, nil, []int{0}},
		{"two small neighbours merge", []Chunk{NewChunk(Hash{}, hashOf("80"), []Entry{entry("20", today+1)}), NewChunk(hashOf("80"), Last, []Entry{entry("90", today+1)})}, nil, []int{2}},
		{"more than two chunks' worth splits evenly", []Chunk{full}, spread(0xf0, MaxEntries+1, today+1), []int{341, 342, 342}},
		{"an entry of a hash there replaces it", []Chunk{NewChunk(Hash{}, Last, []Entry{entry("20", today+1)})}, []Entry{{Hash: hashOf("20"), State: intent.StateFailed, UntilDay: today + 9}}, []int{1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := Rechunk(c.run, c.add, today)
			var sizes []int
			for _, o := range out {
				sizes = append(sizes, o.Len())
			}
			if fmt.Sprint(sizes) != fmt.Sprint(c.sizes) {
				t.Fatalf("sizes %v, want %v", sizes, c.sizes)
			}
			// The result covers what the run covered, each bound its
			// last entry, every entry in its chunk's range.
			if out[0].Lo != c.run[0].Lo || out[len(out)-1].Hi != c.run[len(c.run)-1].Hi {
				t.Errorf("covers (%s, %s], want (%s, %s]", out[0].Lo, out[len(out)-1].Hi, c.run[0].Lo, c.run[len(c.run)-1].Hi)
			}
			for i, o := range out {
				if i > 0 && o.Lo != out[i-1].Hi {
					t.Errorf("chunk %d starts at %s, its left neighbour ends at %s", i, o.Lo, out[i-1].Hi)
				}
				if i < len(out)-1 && o.Hi != o.At(o.Len()-1).Hash {
					t.Errorf("chunk %d ends at %s, not its last entry", i, o.Hi)
				}
				if _, err := ParseChunk(o.Hi, o.Value()); err != nil {
					t.Errorf("chunk %d: %v", i, err)
				}
			}
		})
	}
	replaced := Rechunk(cases[len(cases)-1].run, cases[len(cases)-1].add, today)[0].At(0)
	if replaced.State != intent.StateFailed || replaced.UntilDay != today+9 {
		t.Errorf("the added entry did not replace the one of its hash: %+v", replaced)
	}
}

// A set built one entry at a time finds exactly what was added, also the
// hashes a chunk ends at, and its chunks stay within their bounds.
func TestSetFindsExactlyWhatWasAdded(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := NewSet()
	added := map[Hash]Entry{}
	for i := range 20 * MaxEntries {
		e := NewEntry("tenant", fmt.Sprintf("key-%d", i), intent.State(4+r.IntN(2)*3), time.Unix(int64(r.Uint32()), 0), time.Unix(100*day, 0))
		s.Add(e, 1)
		added[e.Hash] = e
	}
	chunks := s.Chunks()
	if len(chunks) < 20 || chunks[len(chunks)-1].Hi != Last || chunks[0].Lo != (Hash{}) {
		t.Fatalf("%d chunks from (%s to %s]", len(chunks), chunks[0].Lo, chunks[len(chunks)-1].Hi)
	}
	for i, c := range chunks {
		if c.Len() > MaxEntries || c.Len() < MaxEntries/2-1 || (i > 0 && c.Lo != chunks[i-1].Hi) {
			t.Errorf("chunk %d: %d entries, from %s", i, c.Len(), c.Lo)
		}
	}
	for h, e := range added {
		if got, ok := s.Find(h); !ok || got != e {
			t.Fatalf("added %s not found (%+v, %v)", h, got, ok)
		}
	}
	for _, c := range chunks[:len(chunks)-1] {
		// The bound is an entry, found in its chunk; the hash just above
		// it, in the next chunk, is not there.
		next := c.Hi
		next[15]++
		if _, ok := s.Find(c.Hi); !ok {
			t.Errorf("the entry at bound %s not found", c.Hi)
		}
		if _, ok := s.Find(next); ok {
			t.Errorf("%s found, never added", next)
		}
	}
	for range 10000 {
		var h Hash
		for i := range h {
			h[i] = byte(r.IntN(256))
		}
		if _, ok := s.Find(h); ok != (added[h] != Entry{}) {
			t.Fatalf("Find(%s) = %v", h, ok)
		}
	}
}

// A filter never rules out a hash its chunk holds, and rules out most
// others.
func TestFilter(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := NewSet()
	for i := range 5 * MaxEntries {
		s.Add(NewEntry("t", fmt.Sprint(i), intent.StateCompleted, time.Unix(1, 0), time.Unix(9*day, 0)), 1)
	}
	falsePositives, tries := 0, 0
	for _, c := range s.Chunks() {
		f := NewFilter(c)
		if f.Bytes() > (c.Len()*FilterBits+63)/64*8 {
			t.Errorf("a filter of %d bytes for %d entries", f.Bytes(), c.Len())
		}
		for i := range c.Len() {
			if !f.MayContain(c.At(i).Hash) {
				t.Fatalf("the filter rules out %s, which its chunk holds", c.At(i).Hash)
			}
		}
		for range 2000 {
			h := c.Lo
			for i := 2; i < 16; i++ { // a hash within the chunk's range, most likely
				h[i] = byte(r.IntN(256))
			}
			if _, held := c.Find(h); held {
				continue
			}
			tries++
			if f.MayContain(h) {
				falsePositives++
			}
		}
	}
	rate := float64(falsePositives) / float64(tries)
	t.Logf("false positives: %d of %d (%.2f %%)", falsePositives, tries, 100*rate)
	if rate > 0.08 {
		t.Errorf("false positive rate %.3f, want about 0.06", rate)
	}
	if (Filter{}).MayContain(Hash{}) || NewFilter(Chunk{Hi: Last}).MayContain(Last) {
		t.Error("an empty chunk's filter lets a hash through")
	}
	if !bytes.Equal(NewChunk(Hash{}, Last, nil).Value(), append([]byte{formatChunk}, make([]byte, 16)...)) {
		t.Error("an empty chunk's value is not its header")
	}
}
