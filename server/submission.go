package server

import (
	"context"
	"fmt"
	"time"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// The fencing gateway's two calls (docs/GATEWAY.md). The gateway makes
// them with the worker's own credentials, so the guard authorizes the
// worker's role and tenant as for any worker call.

// SubmissionStore is what the gateway's calls need from storage, besides
// Store. etcdstore.Store implements it.
type SubmissionStore interface {
	BeginSubmission(ctx context.Context, st intent.SubmissionStart) (*intent.SubmissionBegun, error)
	RecordSubmission(ctx context.Context, e intent.SubmissionEnd) (*intent.SubmissionRecord, error)
}

// BeginSubmission implements IntentService.BeginSubmission.
func (s *Server) BeginSubmission(ctx context.Context, req *intentv1.BeginSubmissionRequest) (*intentv1.BeginSubmissionResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	st, err := submissionStart(callTenant(ctx, req.GetTenant()), req)
	if err != nil {
		return nil, s.fail(err)
	}
	b, err := s.store.BeginSubmission(ctx, *st)
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.BeginSubmissionResponse{
		Verdict:    intentv1.SubmissionVerdict(b.Verdict),
		Submission: submissionToProto(b.Submission),
		Intent:     intentToProto(b.Intent),
		Statement:  submissionStatement(b.Verdict, b.Submission, b.Intent),
	}, nil
}

// RecordSubmission implements IntentService.RecordSubmission.
func (s *Server) RecordSubmission(ctx context.Context, req *intentv1.RecordSubmissionRequest) (*intentv1.RecordSubmissionResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	e, err := submissionEnd(callTenant(ctx, req.GetTenant()), req)
	if err != nil {
		return nil, s.fail(err)
	}
	r, err := s.store.RecordSubmission(ctx, *e)
	if err != nil {
		return nil, s.fail(err)
	}
	out := &intentv1.RecordSubmissionResponse{Submission: submissionToProto(r.Submission), Intent: intentToProto(r.Intent)}
	if r.Submission != nil && r.Submission.State == intent.SubmissionUnknown && r.Intent != nil {
		out.Statement = submissionStatement(intent.VerdictUnknown, r.Submission, r.Intent)
	}
	return out, nil
}

// submissionStart is the domain form of a BeginSubmissionRequest in tenant
// tn: the checks no field's rule makes (the kept body within the body's
// size).
func submissionStart(tn string, r *intentv1.BeginSubmissionRequest) (*intent.SubmissionStart, error) {
	q := r.GetRequest()
	if int64(len(q.GetBodyKept())) > q.GetBodyBytes() {
		return nil, intent.Invalid("request.body_kept", "holds %d bytes, more than the body's %d (body_bytes)", len(q.GetBodyKept()), q.GetBodyBytes())
	}
	return &intent.SubmissionStart{
		Tenant: tn, Key: r.GetKey(), Operation: r.GetOperation(), Token: fencing.Token(r.GetToken()), ID: r.GetSubmissionId(),
		Lookup: r.GetLookup(), HasLookup: r.GetUpstreamHasLookup(), Request: submittedRequest(q), Timeout: r.GetTimeout().AsDuration(),
	}, nil
}

// submissionEnd is the domain form of a RecordSubmissionRequest in tenant
// tn: an answer goes with the outcomes that have one, and keeps no more
// than the body it cuts.
func submissionEnd(tn string, r *intentv1.RecordSubmissionRequest) (*intent.SubmissionEnd, error) {
	o := intent.SubmissionOutcome(r.GetOutcome())
	withAnswer := o == intent.OutcomeAnswered || o == intent.OutcomeRefusedUpstream || o == intent.OutcomeFound
	resp := r.GetResponse()
	switch {
	case withAnswer && resp == nil:
		return nil, intent.Invalid("response", "required with outcome %s: the upstream's answer", r.GetOutcome())
	case !withAnswer && resp != nil:
		return nil, intent.Invalid("response", "must be empty with outcome %s, which has no answer", r.GetOutcome())
	case resp != nil && int64(len(resp.GetBody())) > resp.GetBodyBytes():
		return nil, intent.Invalid("response.body", "holds %d bytes, more than the body's %d (body_bytes)", len(resp.GetBody()), resp.GetBodyBytes())
	}
	e := &intent.SubmissionEnd{
		Tenant: tn, Key: r.GetKey(), Operation: r.GetOperation(), Token: fencing.Token(r.GetToken()), ID: r.GetSubmissionId(),
		Outcome: o, Error: r.GetError(),
	}
	if resp != nil {
		e.Response = upstreamResponse(resp)
	}
	return e, nil
}

func submittedRequest(q *intentv1.SubmittedRequest) intent.SubmittedRequest {
	return intent.SubmittedRequest{Upstream: q.GetUpstream(), Method: q.GetMethod(), Target: q.GetTarget(),
		BodySHA256: q.GetBodySha256(), BodyBytes: q.GetBodyBytes(), Body: q.GetBodyKept()}
}

func upstreamResponse(r *intentv1.UpstreamResponse) *intent.UpstreamResponse {
	out := &intent.UpstreamResponse{Status: int(r.GetStatus()), Body: r.GetBody(), BodyBytes: r.GetBodyBytes()}
	for _, h := range r.GetHeaders() {
		out.Header = append(out.Header, intent.HeaderField{Name: h.GetName(), Value: h.GetValue()})
	}
	return out
}

// UpstreamResponseToProto is an upstream's answer on the wire (the gateway
// sends it in RecordSubmission).
func UpstreamResponseToProto(r *intent.UpstreamResponse) *intentv1.UpstreamResponse {
	if r == nil {
		return nil
	}
	out := &intentv1.UpstreamResponse{Status: int32(r.Status), Body: r.Body, BodyBytes: r.BodyBytes}
	for _, h := range r.Header {
		out.Headers = append(out.Headers, &intentv1.HeaderField{Name: h.Name, Value: h.Value})
	}
	return out
}

func submissionToProto(s *intent.Submission) *intentv1.Submission {
	if s == nil {
		return nil
	}
	q := s.Request
	return &intentv1.Submission{
		Operation: s.Operation, SubmissionId: s.ID, Token: uint64(s.Token), State: intentv1.SubmissionState(s.State),
		Request:   &intentv1.SubmittedRequest{Upstream: q.Upstream, Method: q.Method, Target: q.Target, BodySha256: q.BodySHA256, BodyBytes: q.BodyBytes, BodyKept: q.Body},
		StartedAt: timeToProto(s.StartedAt), Deadline: timeToProto(s.Deadline), EndedAt: timeToProto(s.EndedAt),
		Response: UpstreamResponseToProto(s.Response), LookedUp: s.LookedUp, Error: s.Error, HasLookup: s.HasLookup,
	}
}

// submissionStatement says a verdict that sends nothing and answers nothing
// from upstream (BUSY, UNKNOWN) in words a worker, or the agent behind it,
// can act on; nil for the others.
func submissionStatement(v intent.SubmissionVerdict, s *intent.Submission, in *intent.Intent) *intentv1.Statement {
	if s == nil || in == nil {
		return nil
	}
	name := intentName(in.Key, in)
	which := fmt.Sprintf("submission %q of operation %s on intent %s", s.ID, s.Operation, name)
	var status intentv1.StatementStatus
	var text string
	switch v {
	case intent.VerdictBusy:
		status = intentv1.StatementStatus_STATEMENT_STATUS_IN_PROGRESS
		text = fmt.Sprintf("in_progress: %s, begun at %s under token %d, is in flight until %s; nothing was sent; wait, then send the call again to get its answer",
			which, s.StartedAt.UTC().Format(time.RFC3339), s.Token, s.Deadline.UTC().Format(time.RFC3339))
	case intent.VerdictUnknown:
		lost := fmt.Sprintf("the answer to %s, sent at %s, was lost (%s); it is never sent again", which, s.StartedAt.UTC().Format(time.RFC3339), s.Error)
		switch {
		case in.State == intent.StateNeedsReview:
			status = intentv1.StatementStatus_STATEMENT_STATUS_NEEDS_REVIEW
			text = "needs_review: " + lost + "; the intent waits for a human decision"
		case s.HasLookup:
			status = intentv1.StatementStatus_STATEMENT_STATUS_RECONCILE
			text = "reconcile: " + lost + "; acquire the intent again (RECONCILE) and ask the gateway's lookup whether it took effect"
		default:
			status = intentv1.StatementStatus_STATEMENT_STATUS_REFUSED
			text = "refused: " + lost
		}
	default:
		return nil
	}
	return refusal(status, text, in, uint64(currentToken(in)), false)
}

func currentToken(in *intent.Intent) fencing.Token {
	if in.Lease == nil {
		return 0
	}
	return in.Lease.Token
}
