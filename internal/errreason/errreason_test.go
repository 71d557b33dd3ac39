package errreason_test

import (
	"testing"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/errreason"
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
		if got := errreason.String(tc.reason); got != tc.want {
			t.Errorf("String(%v) = %q, want %q", tc.reason, got, tc.want)
		}
	}
}

func TestParseInvertsString(t *testing.T) {
	all := errreason.All()
	if len(all) == 0 {
		t.Fatal("All() is empty")
	}
	for _, r := range all {
		got, ok := errreason.Parse(errreason.String(r))
		if !ok || got != r {
			t.Errorf("Parse(%q) = %v, %v; want %v, true", errreason.String(r), got, ok, r)
		}
	}
	for _, s := range []string{"", "UNSPECIFIED", "ERROR_REASON_STALE_TOKEN", "stale_token", "NO_SUCH_REASON"} {
		if got, ok := errreason.Parse(s); ok {
			t.Errorf("Parse(%q) = %v, true; want false", s, got)
		}
	}
}
