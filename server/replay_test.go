package server_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// TestReplayAnswerFollowsItsRecord replays a COMPLETED intent, lets its
// record gain a version (a stale report's evidence: the state stays
// COMPLETED, the revision moves on), and replays again: each replay must
// be the answer for the record as it is now, the same as a freshly
// converted one. A replay's answer is converted once per version and kept;
// kept by intent instead of by version, the second round would serve the
// first version's answer.
func TestReplayAnswerFollowsItsRecord(t *testing.T) {
	f := newFx(t, newClient(t))
	const key = "replayed-twice"
	p := superseded(f, key)
	f.complete(key, p.newer, &intentv1.Result{Payload: []byte("done"), ExternalRefs: map[string]string{"supplier_order_id": "SO-1"}})
	replayer := f.session("replayer")

	// want is the replay's answer as the record in etcd says it must be.
	check := func(round string) *intentv1.AcquireResponse {
		t.Helper()
		want := f.get(key)
		want.History = nil // Acquire answers without history
		var first *intentv1.AcquireResponse
		for i := range 3 {
			got := f.acquire(key, replayer, "replay")
			if got.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED || got.GetLease() != nil {
				t.Fatalf("%s, replay %d: outcome %v lease %v, want COMPLETED and no lease", round, i, got.GetOutcome(), got.GetLease())
			}
			if !proto.Equal(got.GetIntent(), want) {
				t.Errorf("%s, replay %d: intent\n%v\nwant (Get's, without history)\n%v", round, i, got.GetIntent(), want)
			}
			if first == nil {
				first = got
			} else if !proto.Equal(got, first) {
				t.Errorf("%s, replay %d: %v, want the same answer as the first replay %v", round, i, got, first)
			}
		}
		return first
	}
	before := check("first version")

	if _, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: &intentv1.Result{Payload: []byte("late")}}); err == nil {
		t.Fatal("stale Complete succeeded, want it refused with evidence recorded")
	}
	after := check("after the stale report's evidence")
	if after.GetIntent().GetRevision() == before.GetIntent().GetRevision() {
		t.Errorf("revision %d after the evidence, want it past %d", after.GetIntent().GetRevision(), before.GetIntent().GetRevision())
	}
}
