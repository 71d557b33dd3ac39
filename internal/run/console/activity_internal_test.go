package console

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// TestActivityCountsTheCallsTenant: a call is counted in the tenant the
// guard resolved for it (intent.TenantFrom), which a request that names
// none (the caller's only tenant, or "default") does not say itself; a
// call that carries no tenant (DeriveKey) is counted nowhere.
func TestActivityCountsTheCallsTenant(t *testing.T) {
	a := NewActivity(nil)
	reconcile := func(ctx context.Context, _ any) (any, error) {
		return &intentv1.AcquireResponse{Outcome: intentv1.Outcome_OUTCOME_RECONCILE}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/intent.v1.IntentService/Acquire"}
	req := &intentv1.AcquireRequest{Key: "refund-1", SessionId: "ab", RequestId: "r"} // names no tenant
	if _, err := a.Unary()(intent.WithTenant(context.Background(), "acme"), req, info, reconcile); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Unary()(context.Background(), req, info, reconcile); err != nil {
		t.Fatal(err)
	}
	count := func(tenant string) (n int) {
		for _, b := range a.Unknowns(tenant) {
			n += b.Reconcil
		}
		return n
	}
	if got := count("acme"); got != 1 {
		t.Errorf("acme's reconciles: %d, want 1", got)
	}
	if got := count(""); got != 0 {
		t.Errorf("reconciles counted in no tenant: %d, want 0", got)
	}
}
