package etcdsteer

import (
	"slices"
	"testing"
)

func TestJudge(t *testing.T) {
	tests := []struct {
		name      string
		answers   []answer
		floor     uint64
		want      []Health
		wantFloor uint64
	}{
		{"first round: no floor yet", []answer{{Ready, 10}, {Ready, 3}, {Silent, 0}}, 0, []Health{Ready, Ready, Silent}, 10},
		{"all caught up", []answer{{Ready, 120}, {Ready, 118}, {Ready, 121}}, 110, []Health{Ready, Ready, Ready}, 121},
		{"back from a stall, seconds behind", []answer{{Ready, 6594}, {Ready, 3041}, {Ready, 6594}}, 6585, []Health{Ready, Lagging, Ready}, 6594},
		{"leaderless is not judged on its index", []answer{{Leaderless, 5}, {Ready, 200}}, 100, []Health{Leaderless, Ready}, 200},
		{"a restore below the floor: all lag", []answer{{Ready, 40}, {Ready, 40}}, 6594, []Health{Lagging, Lagging}, 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, floor := judge(tc.answers, tc.floor)
			if !slices.Equal(got, tc.want) || floor != tc.wantFloor {
				t.Errorf("judge(%v, %d) = %v, %d; want %v, %d", tc.answers, tc.floor, got, floor, tc.want, tc.wantFloor)
			}
		})
	}
}
