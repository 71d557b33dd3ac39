package client

import (
	"errors"
	"slices"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/internal/core/vocab"
)

// TestEveryReasonHasASentinel: every reason of the proto's ErrorReason has
// a sentinel, and no sentinel is keyed by a reason the proto does not declare.
func TestEveryReasonHasASentinel(t *testing.T) {
	all := vocab.Reasons()
	for _, r := range all {
		if byReason[r] == nil {
			t.Errorf("byReason has no sentinel for %v", r)
		}
	}
	for r := range byReason {
		if !slices.Contains(all, r) {
			t.Errorf("byReason has %v, which the proto's ErrorReason does not declare", r)
		}
	}
}

// TestFinerReasonsMatchTheirCodesSentinelToo: the reasons that once matched
// only their code's sentinel (RATE_LIMITED and ErrResourceExhausted) now
// have their own, and still match the code's.
func TestFinerReasonsMatchTheirCodesSentinelToo(t *testing.T) {
	for _, tc := range []struct {
		code         codes.Code
		reason       string
		fine, coarse error
	}{
		{codes.ResourceExhausted, "RATE_LIMITED", ErrRateLimited, ErrResourceExhausted},
		{codes.ResourceExhausted, "TOO_LARGE", ErrTooLarge, ErrResourceExhausted},
		{codes.ResourceExhausted, "STORE_FULL", ErrStoreFull, ErrResourceExhausted},
		{codes.Unavailable, "STORE_ROLLED_BACK", ErrStoreRolledBack, ErrUnavailable},
	} {
		st, err := status.New(tc.code, "refused").WithDetails(&errdetails.ErrorInfo{Domain: "intentd.dev", Reason: tc.reason})
		if err != nil {
			t.Fatal(err)
		}
		got := convert(st.Err())
		if !errors.Is(got, tc.fine) || !errors.Is(got, tc.coarse) {
			t.Errorf("%s: errors.Is(%v, %v) = %v, errors.Is(.., %v) = %v; want both true",
				tc.reason, got, tc.fine, errors.Is(got, tc.fine), tc.coarse, errors.Is(got, tc.coarse))
		}
		if errors.Is(got, ErrInternal) || errors.Is(got, ErrStaleToken) {
			t.Errorf("%s: %v matches an unrelated sentinel", tc.reason, got)
		}
	}
}
