package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// The gateway's calls on the wire: a forward, its answer recorded and
// replayed byte for byte; a superseded token refused with the STALE_TOKEN
// statement and kept as evidence; a racing call told it is busy; a lost
// answer without a lookup in the review queue, said in words.
func TestSubmissionCalls(t *testing.T) {
	c := serve(t, etcdtest.Start(t))
	f := newFx(t, c)
	p := held(f, "pickup-1")
	begin := func(token uint64, id string) *intentv1.BeginSubmissionResponse {
		t.Helper()
		req := submissionOf("pickup-1", token)
		req.SubmissionId = id
		resp, err := c.BeginSubmission(f.ctx, req)
		if err != nil {
			t.Fatalf("BeginSubmission(%s): %v", id, err)
		}
		return resp
	}
	first := begin(p.token, "a")
	if first.GetVerdict() != intentv1.SubmissionVerdict_SUBMISSION_VERDICT_FORWARD || first.GetSubmission().GetState() != intentv1.SubmissionState_SUBMISSION_STATE_IN_FLIGHT {
		t.Fatalf("first: %v", first)
	}
	busy := begin(p.token, "b")
	if busy.GetVerdict() != intentv1.SubmissionVerdict_SUBMISSION_VERDICT_BUSY || busy.GetStatement().GetStatus() != "in_progress" ||
		!strings.Contains(busy.GetStatement().GetText(), `submission "a" of operation create-pickup`) {
		t.Errorf("racing call: %v", busy)
	}
	body := []byte("{\"id\":\"PU-1\"}\n\x00")
	if _, err := c.RecordSubmission(f.ctx, &intentv1.RecordSubmissionRequest{Key: "pickup-1", Operation: "create-pickup", Token: p.token, SubmissionId: "a",
		Outcome:  intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_ANSWERED,
		Response: &intentv1.UpstreamResponse{Status: 201, Headers: []*intentv1.HeaderField{{Name: "Content-Type", Value: "application/json"}}, Body: body, BodyBytes: int64(len(body))}}); err != nil {
		t.Fatal(err)
	}
	replay := begin(p.token, "c")
	if replay.GetVerdict() != intentv1.SubmissionVerdict_SUBMISSION_VERDICT_REPLAY || string(replay.GetSubmission().GetResponse().GetBody()) != string(body) {
		t.Errorf("replay: %v", replay)
	}

	// Superseded: the first holder marks unknown, a reconciler takes over.
	f.markUnknown("pickup-1", p.token)
	_, newer := f.lease("pickup-1", "w2", intentv1.Outcome_OUTCOME_RECONCILE)
	_, err := c.BeginSubmission(f.ctx, submissionOf("pickup-1", p.token))
	checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
	if st := statementOf(err); st.GetStatus() != "stale_token" || st.GetCurrentToken() != newer || st.GetActionTaken() != "evidence_recorded" {
		t.Errorf("stale statement %v", st)
	}
	if !hasEntry(f.get("pickup-1"), func(h *intentv1.HistoryEntry) bool {
		return h.GetKind() == intentv1.HistoryEntry_KIND_SUBMISSION_STARTED && !h.GetAccepted() && h.GetToken() == p.token
	}) {
		t.Error("the stale attempt is not in the history")
	}
	if r := begin(newer, "d"); r.GetVerdict() != intentv1.SubmissionVerdict_SUBMISSION_VERDICT_REPLAY {
		t.Errorf("the newer holder: %v, want the replay", r.GetVerdict())
	}

	// Lost without a lookup: NEEDS_REVIEW, said in words.
	q := held(f, "pickup-2")
	if r, err := c.BeginSubmission(f.ctx, submissionOf("pickup-2", q.token)); err != nil || r.GetVerdict() != intentv1.SubmissionVerdict_SUBMISSION_VERDICT_FORWARD {
		t.Fatalf("pickup-2: %v %v", r, err)
	}
	lost, err := c.RecordSubmission(f.ctx, &intentv1.RecordSubmissionRequest{Key: "pickup-2", Operation: "create-pickup", Token: q.token, SubmissionId: "sub-pickup-2",
		Outcome: intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_LOST, Error: "timeout after 10s"})
	if err != nil {
		t.Fatal(err)
	}
	if lost.GetIntent().GetState() != intentv1.State_STATE_NEEDS_REVIEW || lost.GetStatement().GetStatus() != "needs_review" || !strings.Contains(lost.GetStatement().GetText(), "timeout after 10s") {
		t.Errorf("lost: %v", lost)
	}

	// The pairing of an outcome with its answer.
	_, err = c.RecordSubmission(f.ctx, &intentv1.RecordSubmissionRequest{Key: "pickup-2", Operation: "create-pickup", Token: q.token, SubmissionId: "sub-pickup-2",
		Outcome: intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_ANSWERED})
	checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "response")
}
