package daemon

import "testing"

func TestFullStep(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		want  int
	}{
		{0, -1}, {0.5, -1}, {0.7999, -1},
		{0.80, 0}, {0.849, 0}, {0.85, 1}, {0.90, 2}, {0.95, 3}, {0.999, 3}, {1.0, 4}, {1.2, 8},
	} {
		if got := fullStep(tc.ratio); got != tc.want {
			t.Errorf("fullStep(%v) = %d, want %d", tc.ratio, got, tc.want)
		}
	}
	if got := (dbStatus{size: 10}).ratio(); got != 0 {
		t.Errorf("ratio without a quota = %v, want 0 (unknown: no warning)", got)
	}
}
