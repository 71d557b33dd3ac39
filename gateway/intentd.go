package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	grpccodes "google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// The gateway's calls to intentd, with the worker's credentials, and how
// their refusals become HTTP answers.

// begin asks intentd to begin a submission, retrying while intentd is
// unavailable: the same submission id makes a retry safe.
func (g *Gateway) begin(ctx context.Context, c *call, req *intentv1.BeginSubmissionRequest) (*intentv1.BeginSubmissionResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	start := time.Now()
	defer func() { g.m.intentdSeconds.WithLabelValues("BeginSubmission").Observe(time.Since(start).Seconds()) }()
	return retried(ctx, func(ctx context.Context) (*intentv1.BeginSubmissionResponse, error) {
		return g.api.BeginSubmission(c.outgoing(ctx), req)
	})
}

// record asks intentd to record a submission's outcome, retrying while
// intentd is unavailable until the submission's deadline (and for
// CallTimeout at least): the answer is answered only once it is recorded.
func (g *Gateway) record(ctx context.Context, c *call, deadline time.Time, req *intentv1.RecordSubmissionRequest) (*intentv1.RecordSubmissionResponse, error) {
	if d := time.Now().Add(g.cfg.CallTimeout); deadline.Before(d) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	start := time.Now()
	defer func() { g.m.intentdSeconds.WithLabelValues("RecordSubmission").Observe(time.Since(start).Seconds()) }()
	return retried(ctx, func(ctx context.Context) (*intentv1.RecordSubmissionResponse, error) {
		return g.api.RecordSubmission(c.outgoing(ctx), req)
	})
}

// retried calls f until it succeeds, fails with anything but
// UNAVAILABLE (or an attempt's own deadline), or ctx ends.
func retried[R any](ctx context.Context, f func(context.Context) (R, error)) (R, error) {
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := f(actx)
		cancel()
		code := status.Code(err)
		if err == nil || (code != grpccodes.Unavailable && (code != grpccodes.DeadlineExceeded || ctx.Err() != nil)) {
			return r, err
		}
		d := min(20*time.Millisecond<<min(attempt, 5), 500*time.Millisecond)
		d = d/2 + rand.N(d/2+1)
		select {
		case <-ctx.Done():
			return r, err
		case <-time.After(d):
		}
	}
}

// refuseCall answers a refusal of intentd's as HTTP: its status code from
// the reason, and its statement (the STALE_TOKEN statement intentd sends,
// as it sends it), or one saying the refusal in words, naming the header
// a refused field came from.
func (g *Gateway) refuseCall(w http.ResponseWriter, r *http.Request, up *Upstream, span trace.Span, err error) {
	st := status.Convert(err)
	span.SetStatus(codes.Error, st.Message())
	var reason string
	var statement *intentv1.Statement
	var field string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
			field = d.GetMetadata()["field"]
		case *intentv1.Statement:
			statement = d
		}
	}
	key := r.Header.Get(HeaderKey)
	code, outcome := http.StatusBadGateway, OutcomeRefused
	switch {
	case reason == "STALE_TOKEN":
		code, outcome = http.StatusConflict, OutcomeStale
	case reason == "INVALID_FIELD":
		code = http.StatusBadRequest
	case reason == "INTENT_NOT_FOUND" || reason == "INTENT_EXPIRED":
		code = http.StatusNotFound
	case reason == "INVALID_TRANSITION" || reason == "FINGERPRINT_MISMATCH":
		code = http.StatusConflict
	case reason == "UNAUTHENTICATED":
		code = http.StatusUnauthorized
	case reason == "PERMISSION_DENIED":
		code = http.StatusForbidden
	case reason == "RATE_LIMITED":
		code = http.StatusTooManyRequests
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				w.Header().Set("Retry-After", fmt.Sprint(int(ri.GetRetryDelay().AsDuration().Seconds()+0.999)))
			}
		}
	case reason == "TOO_LARGE":
		code = http.StatusRequestEntityTooLarge
	case st.Code() == grpccodes.Unavailable || st.Code() == grpccodes.DeadlineExceeded || reason == "STORE_UNAVAILABLE" || reason == "STORE_ROLLED_BACK":
		code, outcome = http.StatusServiceUnavailable, OutcomeUnavailable
	}
	if statement == nil {
		msg := st.Message()
		if h, ok := fieldHeaders[field]; ok {
			msg = h + " (" + field + "): " + strings.TrimPrefix(msg, "intent: invalid "+field+": ")
		}
		statement = refusedText(key, "intentd answered %s: %s", nonEmpty(reason, st.Code().String()), msg)
	}
	g.refuse(w, r, up, code, outcome, statement)
}

// fieldHeaders are the headers a worker sent each request field in.
var fieldHeaders = map[string]string{
	"key": HeaderKey, "operation": HeaderOperation, "token": HeaderToken, "tenant": HeaderTenant,
	"request.target": "the path", "request.method": "the method",
}

// refuse answers status with a statement as its JSON body: what became of
// the call, in the shape intentd's statements have.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, up *Upstream, code int, outcome string, st *intentv1.Statement) {
	name := "-"
	if up != nil {
		name = up.Name
	}
	g.m.submissions.WithLabelValues(name, outcome).Inc()
	g.log.Debug("gateway: refused", "method", r.Method, "path", r.URL.Path, "upstream", name, "status", code, "outcome", outcome, "text", st.GetText())
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(st)
	if err != nil {
		b = []byte(`{"status":"refused"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set(HeaderOutcome, outcome)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// refusedText is the statement of a call refused with nothing sent.
func refusedText(key, format string, args ...any) *intentv1.Statement {
	return &intentv1.Statement{Status: "refused", IntentKey: key, ActionTaken: "none",
		Text: "refused: " + fmt.Sprintf(format, args...) + "; nothing was sent; action_taken: none"}
}

// serveReady answers 200 while intentd answers its health check as
// serving, 503 otherwise.
func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	resp, err := g.health.Check(ctx, &healthpb.HealthCheckRequest{Service: intentv1.IntentService_ServiceDesc.ServiceName})
	switch {
	case err != nil:
		http.Error(w, "not ready: intentd does not answer: "+status.Convert(err).Message(), http.StatusServiceUnavailable)
	case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING:
		http.Error(w, "not ready: intentd is "+resp.GetStatus().String(), http.StatusServiceUnavailable)
	default:
		_, _ = fmt.Fprintln(w, "ready")
	}
}

func nonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
