package daemon

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Counting an answer allocates nothing: its counters are resolved at start.
func TestAnswersAllocateNothing(t *testing.T) {
	a := newAnswers()
	count := a.unary()
	resp := &intentv1.AcquireResponse{Outcome: intentv1.Outcome_OUTCOME_EXECUTE}
	handler := func(context.Context, any) (any, error) { return resp, nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/intent.v1.IntentService/Acquire"}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { _, _ = count(ctx, nil, info, handler) }); n != 0 {
		t.Errorf("counting an Acquire answer: %v allocations, want 0", n)
	}
}

func BenchmarkAnswers(b *testing.B) {
	count := newAnswers().unary()
	resp := &intentv1.AcquireResponse{Outcome: intentv1.Outcome_OUTCOME_COMPLETED}
	handler := func(context.Context, any) (any, error) { return resp, nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/intent.v1.IntentService/Acquire"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = count(ctx, nil, info, handler)
	}
}
