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
	for s.added != 0 && s.added < s.halveAt-1 {
		s.add(2000)
	}
	s.add(3000)
	if got := s.count(1000); got > before/2 {
		t.Errorf("after %d requests, count(1000) = %d, want at most half of %d", s.halveAt, got, before)
	}
}
