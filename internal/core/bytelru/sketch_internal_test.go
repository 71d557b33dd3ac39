package bytelru

import "testing"

// The sketch never counts a key below the requests for it (a count-min
// sketch only errs upward), up to its cap, and halves every count once it
// has counted ten times its width.
func TestSketchCountsAndFades(t *testing.T) {
	s := newSketch[int](64)
	for k := range 200 {
		for range k % 7 {
			s.add(k)
		}
	}
	for k := range 200 {
		if got, want := s.count(k), uint8(k%7); got < want {
			t.Errorf("count(%d) = %d, below the %d requests for it", k, got, want)
		}
	}
	for range 40 {
		s.add(1000)
	}
	if got := s.count(1000); got != sketchMaxCount {
		t.Errorf("count of a key asked for 40 times = %d, want the cap %d", got, sketchMaxCount)
	}
	before := s.count(1000)
	for s.added != 0 && s.added < s.halveAt()-1 {
		s.add(2000)
	}
	s.add(3000)
	if got := s.count(1000); got > before/2 {
		t.Errorf("after %d requests, count(1000) = %d, want at most half of %d", s.halveAt(), got, before)
	}
}

// Widening the rows keeps every key's count, and counts on from there.
func TestSketchGrowsWithoutForgetting(t *testing.T) {
	s := newSketch[int](64)
	for k := range 500 {
		for range k % 9 {
			s.add(k)
		}
	}
	before := make([]uint8, 500)
	for k := range before {
		before[k] = s.count(k)
	}
	for _, n := range []int{64, 65, 1000, 5000} {
		s.grow(n)
		if w := int(s.mask + 1); w < n || w != sketchWidth(n) || len(s.counts) != sketchRows*w || s.halveAt() != 10*w {
			t.Fatalf("grow(%d): width %d, %d counters, halving at %d", n, w, len(s.counts), s.halveAt())
		}
		for k, want := range before {
			if got := s.count(k); got != want {
				t.Fatalf("after grow(%d), count(%d) = %d, was %d", n, k, got, want)
			}
		}
	}
	s.grow(10) // never narrower
	if w := int(s.mask + 1); w != sketchWidth(5000) {
		t.Errorf("grow(10) made the rows %d wide, want them left at %d", w, sketchWidth(5000))
	}
	s.add(7)
	if got := s.count(7); got != before[7]+1 {
		t.Errorf("count(7) after one more request = %d, want %d", got, before[7]+1)
	}
}
