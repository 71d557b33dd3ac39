package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus series (docs/GATEWAY.md,
// "Operations").
type metrics struct {
	submissions     *prometheus.CounterVec
	upstreamSeconds *prometheus.HistogramVec
	intentdSeconds  *prometheus.HistogramVec
}

// outcomes are HeaderOutcome's values, each a series from the start.
var outcomes = []string{OutcomeForwarded, OutcomeReplayed, OutcomeLookedUp, OutcomeAbsent, OutcomeStale, OutcomeBusy,
	OutcomeUnknown, OutcomeNotSent, OutcomeRefused, OutcomeUnavailable, OutcomeLookupError}

func newMetrics(reg prometheus.Registerer, upstreams map[string]*Upstream) (*metrics, error) {
	m := &metrics{
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "intentd_gateway_submissions_total",
			Help: "Calls through the fencing gateway by upstream (- when none was named right) and outcome: forwarded, replayed, looked_up, absent, refused_stale, refused_busy, unknown, not_sent, refused, unavailable, lookup_failed.",
		}, []string{"upstream", "outcome"}),
		upstreamSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "intentd_gateway_upstream_seconds",
			Help:    "Time of the gateway's requests to each upstream, to the end of the answer's body (or the failure).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"upstream"}),
		intentdSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "intentd_gateway_intentd_seconds",
			Help:    "Time of the gateway's calls to intentd (BeginSubmission, RecordSubmission), retries included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12),
		}, []string{"call"}),
	}
	for _, c := range []prometheus.Collector{m.submissions, m.upstreamSeconds, m.intentdSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for name := range upstreams {
		for _, o := range outcomes {
			m.submissions.WithLabelValues(name, o)
		}
		m.upstreamSeconds.WithLabelValues(name)
	}
	for _, c := range []string{"BeginSubmission", "RecordSubmission"} {
		m.intentdSeconds.WithLabelValues(c)
	}
	return m, nil
}
