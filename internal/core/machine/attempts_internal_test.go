package machine

import (
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

// endAttempt is pure: every case of the rule runs without etcd.
func TestEndAttemptRule(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	unknown := func(attempts, maxAttempts int, ended, token fencing.Token) *Record {
		return &Record{
			State: intent.StateUnknown, Attempts: attempts, MaxAttempts: maxAttempts, EndedToken: ended,
			Lease:   &Lease{Token: token},
			History: []intent.Event{{Kind: intent.EventRegistered}},
		}
	}
	for _, tc := range []struct {
		name          string
		rec           *Record
		defaultMax    int
		wantExhausted bool
		wantAttempts  int
		wantState     intent.State
	}{
		{"first end counts", unknown(0, 3, 0, 10), 5, false, 1, intent.StateUnknown},
		{"below the limit stays UNKNOWN", unknown(1, 3, 9, 10), 5, false, 2, intent.StateUnknown},
		{"reaching the limit goes to review", unknown(2, 3, 9, 10), 5, true, 3, intent.StateNeedsReview},
		{"the same lease counts once", unknown(2, 3, 10, 10), 5, false, 2, intent.StateUnknown},
		{"a record without a limit takes the default", unknown(4, 0, 9, 10), 5, true, 5, intent.StateNeedsReview},
		{"the record's limit wins over the default", unknown(4, 8, 9, 10), 5, false, 5, intent.StateUnknown},
		{"a limit of 1 sends the first end to review", unknown(0, 1, 0, 10), 5, true, 1, intent.StateNeedsReview},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := tc.rec.Clone()
			got := endAttempt(next, tc.defaultMax, endedLapsed, now)
			if got != tc.wantExhausted || next.Attempts != tc.wantAttempts || next.State != tc.wantState {
				t.Fatalf("endAttempt = %t, attempts %d, state %v; want %t, %d, %v", got, next.Attempts, next.State, tc.wantExhausted, tc.wantAttempts, tc.wantState)
			}
			if next.EndedToken != 10 {
				t.Errorf("EndedToken = %d, want 10 (the ended lease's)", next.EndedToken)
			}
			last := next.History[len(next.History)-1]
			if escalated := last.Kind == intent.EventEscalated; escalated != tc.wantExhausted {
				t.Fatalf("last history entry %+v: escalation %t, want %t", last, escalated, tc.wantExhausted)
			}
			if tc.wantExhausted && (last.Principal != "intentd" || !strings.Contains(last.Reason, "attempts ended without a report (the last when its lease lapsed under token 10)") || !last.Time.Equal(now)) {
				t.Errorf("escalation entry %+v, want intentd's, with the count, how the last ended and its token", last)
			}
		})
	}
}
