package daemon

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/vocab"
	"github.com/intentd/intentd/server"
)

// answers counts what workers and approvers were told, as they were told
// it: Acquire outcomes, and the refusals that tell a story of their own
// (a superseded token, a changed fingerprint). Every child is resolved
// when intentd starts, so a call costs a type switch and an atomic add; a
// refusal's ErrorInfo is read only for the two codes that can carry those
// reasons.
type answers struct {
	outcomes, stale, fingerprint *prometheus.CounterVec
	// byOutcome is indexed by intentv1.Outcome.
	byOutcome []prometheus.Counter
	// staleBy and fingerprintBy are keyed by full method name
	// (/intent.v1.IntentService/Complete).
	staleBy, fingerprintBy map[string]prometheus.Counter
}

// staleCalls are the calls fenced by a token; fingerprintCalls those that
// compare a fingerprint.
var (
	staleCalls       = []string{"Heartbeat", "Complete", "MarkUnknown", "Release", "Fail", "Escalate"}
	fingerprintCalls = []string{"Register", "Acquire"}
)

func newAnswers() answers {
	a := answers{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "intentd_acquire_outcomes_total",
			Help: "Acquire answers by outcome (EXECUTE, RECONCILE, COMPLETED, FAILED, CANCELLED, IN_PROGRESS, NEEDS_REVIEW, EXPIRED); a retried Acquire counts again.",
		}, []string{"outcome"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "intentd_stale_token_refusals_total",
			Help: "Calls refused because they named a superseded fencing token (ABORTED, STALE_TOKEN), by method: a worker resumed after another took over.",
		}, []string{"method"}),
		fingerprint: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "intentd_fingerprint_conflicts_total",
			Help: "Calls refused because the key is registered with other params (FAILED_PRECONDITION, FINGERPRINT_MISMATCH), by method: a changed decision sent as a retry.",
		}, []string{"method"}),
		staleBy:       map[string]prometheus.Counter{},
		fingerprintBy: map[string]prometheus.Counter{},
	}
	a.byOutcome = make([]prometheus.Counter, len(intentv1.Outcome_name))
	for v, name := range intentv1.Outcome_name {
		if v != int32(intentv1.Outcome_OUTCOME_UNSPECIFIED) {
			a.byOutcome[v] = a.outcomes.WithLabelValues(name[len("OUTCOME_"):])
		}
	}
	full := func(method string) string {
		return "/" + intentv1.IntentService_ServiceDesc.ServiceName + "/" + method
	}
	for _, m := range staleCalls {
		a.staleBy[full(m)] = a.stale.WithLabelValues(m)
	}
	for _, m := range fingerprintCalls {
		a.fingerprintBy[full(m)] = a.fingerprint.WithLabelValues(m)
	}
	return a
}

// unary counts the answer of one unary call.
func (a answers) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			a.refused(info.FullMethod, err)
			return resp, err
		}
		if r, ok := resp.(*intentv1.AcquireResponse); ok {
			if o := int(r.GetOutcome()); o > 0 && o < len(a.byOutcome) {
				a.byOutcome[o].Inc()
			}
		}
		return resp, nil
	}
}

// refused counts a refusal whose reason has a counter of its own.
func (a answers) refused(method string, err error) {
	var by map[string]prometheus.Counter
	var reason string
	switch status.Code(err) {
	case codes.Aborted:
		by, reason = a.staleBy, vocab.Reason(intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN)
	case codes.FailedPrecondition:
		by, reason = a.fingerprintBy, vocab.Reason(intentv1.ErrorReason_ERROR_REASON_FINGERPRINT_MISMATCH)
	default:
		return
	}
	c, ok := by[method]
	if !ok {
		return
	}
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reason && info.GetDomain() == server.ErrorDomain {
			c.Inc()
			return
		}
	}
}
