package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// emptySHA256 is the digest of an empty body: a lookup sends none.
var emptySHA256 = func() string { s := sha256.Sum256(nil); return hex.EncodeToString(s[:]) }()

// serveLookup is POST /lookup/<upstream>: a reconciler, holding the
// intent's current lease (RECONCILE, after a lost answer), asks the
// upstream's lookup whether the operation's submission in doubt took
// effect. Found: the lookup's answer is recorded as the submission's and
// answered (every later call of the operation replays it). Absent: the
// submission is recorded absent, and the operation may be sent again.
func (g *Gateway) serveLookup(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("upstream")
	up := g.cfg.Upstreams[name]
	switch {
	case up == nil:
		g.refuse(w, r, nil, http.StatusNotFound, OutcomeRefused, refusedText(r.Header.Get(HeaderKey), "no upstream %s is configured; the gateway forwards only to its upstreams (%s)", quoted(name), joinNames(g.names())))
		return
	case up.Lookup == nil:
		g.refuse(w, r, up, http.StatusNotFound, OutcomeRefused, refusedText(r.Header.Get(HeaderKey), "upstream %s has no lookup configured: a lost answer of it waits in the review queue", name))
		return
	}
	c, err := parseCall(r)
	if err != nil {
		g.refuse(w, r, up, http.StatusBadRequest, OutcomeRefused, refusedText(r.Header.Get(HeaderKey), "%v", err))
		return
	}
	l := up.Lookup
	ctx := context.WithoutCancel(g.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	ctx, span := g.tracer.Start(ctx, "gateway lookup "+name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("intentd.upstream", name), attribute.String("intentd.operation", c.operation)))
	defer span.End()
	var begun *intentv1.BeginSubmissionResponse
	for try := 0; try < 2; try++ {
		begun, err = g.begin(ctx, c, &intentv1.BeginSubmissionRequest{
			Tenant: c.tenant, Key: c.key, Operation: c.operation, Token: uint64(c.token), SubmissionId: newID(),
			Lookup: true, UpstreamHasLookup: true, Timeout: durationpb.New(up.Timeout + g.cfg.RecordGrace),
			Request: &intentv1.SubmittedRequest{Upstream: name, Method: l.Method, Target: l.Path, BodySha256: emptySHA256},
		})
		// A submission found past its deadline is given up as unknown by
		// this very call: ask again, and the lookup may go ahead.
		if err != nil || begun.GetVerdict() != intentv1.SubmissionVerdict_SUBMISSION_VERDICT_UNKNOWN {
			break
		}
	}
	if err != nil {
		g.refuseCall(w, r, up, span, err)
		return
	}
	switch begun.GetVerdict() {
	case intentv1.SubmissionVerdict_SUBMISSION_VERDICT_LOOKUP:
	case intentv1.SubmissionVerdict_SUBMISSION_VERDICT_REPLAY:
		g.answer(w, up, begun.GetSubmission(), OutcomeReplayed, true)
		return
	case intentv1.SubmissionVerdict_SUBMISSION_VERDICT_BUSY:
		g.refuse(w, r, up, http.StatusConflict, OutcomeBusy, begun.GetStatement())
		return
	default:
		g.refuse(w, r, up, http.StatusConflict, OutcomeUnknown, begun.GetStatement())
		return
	}
	sub := begun.GetSubmission()
	tenant := begun.GetIntent().GetTenant()
	out, err := http.NewRequest(l.Method, up.URL.Scheme+"://"+up.URL.Host+up.URL.EscapedPath()+l.lookupPath(tenant, c.key, c.operation), nil)
	if err != nil {
		g.refuse(w, r, up, http.StatusBadGateway, OutcomeLookupError, refusedText(c.key, "the lookup request could not be built: %v", err))
		return
	}
	for k, v := range up.SetHeaders {
		out.Header.Set(k, v)
	}
	resp, _, err := g.send(ctx, up, out, nil)
	switch {
	case err != nil:
		g.refuse(w, r, up, http.StatusBadGateway, OutcomeLookupError, refusedText(c.key, "the lookup of submission %q at %s failed (%v); nothing was recorded; ask again", sub.GetSubmissionId(), name, err))
		return
	case statusIn(int(resp.GetStatus()), l.Found):
		rec, err := g.record(ctx, c, sub.GetDeadline().AsTime(), &intentv1.RecordSubmissionRequest{
			Tenant: c.tenant, Key: c.key, Operation: c.operation, Token: uint64(c.token), SubmissionId: sub.GetSubmissionId(),
			Outcome: intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_FOUND, Response: resp,
		})
		if err != nil {
			g.refuseCall(w, r, up, span, err)
			return
		}
		g.answer(w, up, rec.GetSubmission(), OutcomeLookedUp, false)
	case statusIn(int(resp.GetStatus()), l.Absent):
		_, err := g.record(ctx, c, sub.GetDeadline().AsTime(), &intentv1.RecordSubmissionRequest{
			Tenant: c.tenant, Key: c.key, Operation: c.operation, Token: uint64(c.token), SubmissionId: sub.GetSubmissionId(),
			Outcome: intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_NOT_FOUND, Error: fmt.Sprintf("%s's lookup answered %d", name, resp.GetStatus()),
		})
		if err != nil {
			g.refuseCall(w, r, up, span, err)
			return
		}
		g.refuse(w, r, up, http.StatusNotFound, OutcomeAbsent, &intentv1.Statement{Status: "refused", IntentKey: c.key, ActionTaken: "recorded",
			Text: fmt.Sprintf("absent: %s's lookup found no trace of submission %q of operation %s (it answered %d); the operation may be sent again under your lease, or Release the intent as confirmed absent; action_taken: recorded",
				name, sub.GetSubmissionId(), c.operation, resp.GetStatus())})
	default:
		g.refuse(w, r, up, http.StatusBadGateway, OutcomeLookupError, refusedText(c.key, "%s's lookup answered %d, neither found (%v) nor absent (%v); nothing was recorded", name, resp.GetStatus(), l.Found, l.Absent))
	}
}

func joinNames(names []string) string {
	s := ""
	for i, n := range names {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}
