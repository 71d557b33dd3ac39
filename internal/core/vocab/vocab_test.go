package vocab_test

import (
	"testing"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/vocab"
)

func TestStringIsTheWireReason(t *testing.T) {
	for _, tc := range []struct {
		reason intentv1.ErrorReason
		want   string
	}{
		{intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN, "STALE_TOKEN"},
		{intentv1.ErrorReason_ERROR_REASON_INVALID_FIELD, "INVALID_FIELD"},
		{intentv1.ErrorReason_ERROR_REASON_RATE_LIMITED, "RATE_LIMITED"},
		{intentv1.ErrorReason_ERROR_REASON_INTERNAL, "INTERNAL"},
	} {
		if got := vocab.Reason(tc.reason); got != tc.want {
			t.Errorf("String(%v) = %q, want %q", tc.reason, got, tc.want)
		}
	}
}

func TestParseInvertsString(t *testing.T) {
	all := vocab.Reasons()
	if len(all) == 0 {
		t.Fatal("All() is empty")
	}
	for _, r := range all {
		got, ok := vocab.ParseReason(vocab.Reason(r))
		if !ok || got != r {
			t.Errorf("Parse(%q) = %v, %v; want %v, true", vocab.Reason(r), got, ok, r)
		}
	}
	for _, s := range []string{"", "UNSPECIFIED", "ERROR_REASON_STALE_TOKEN", "stale_token", "NO_SUCH_REASON"} {
		if got, ok := vocab.ParseReason(s); ok {
			t.Errorf("Parse(%q) = %v, true; want false", s, got)
		}
	}
}

func TestActionsAndStatusesAreTheWireWords(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE), "none"},
		{vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_LEASE_ISSUED), "lease_issued"},
		{vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_RECORDED), "recorded"},
		{vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_EVIDENCE_RECORDED), "evidence_recorded"},
		{vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_EXECUTE), "execute"},
		{vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_ALREADY_COMPLETED), "already_completed"},
		{vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_STALE_TOKEN), "stale_token"},
		{vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_REFUSED), "refused"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if got, want := len(vocab.Actions()), 4; got != want {
		t.Errorf("len(Actions()) = %d, want %d", got, want)
	}
	if got, want := len(vocab.Statuses()), 10; got != want {
		t.Errorf("len(Statuses()) = %d, want %d", got, want)
	}
}
