package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// readiness is the one answer to "should this replica get calls now?",
// told by gRPC health and by /readyz alike: watchHealth decides it from its
// probe of etcd, and shutdown latches it to not ready before gRPC stops, so
// that load balancers and Kubernetes drain the replica first.
type readiness struct {
	hs *health.Server
	mu sync.Mutex
	// reason is empty while ready, else the one-line reason why not.
	reason string
	// stopping latches: nothing turns a shutting-down replica ready again.
	stopping bool
	// degraded is empty while every optional part answers, else what does
	// not (the archive): the replica stays ready, since calls on live
	// intents do not need it, and /readyz says so.
	degraded string
}

// newReadiness starts not ready: the store answers nothing before the
// first probe.
func newReadiness(hs *health.Server) *readiness {
	return &readiness{hs: hs, reason: "starting: etcd not probed yet"}
}

// set records the outcome of one probe of etcd: nil is ready.
// requestTimeout is what the probe waited, for the reason.
func (r *readiness) set(err error, requestTimeout time.Duration) {
	reason := notReadyReason(err, requestTimeout)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return
	}
	r.reason = reason
	st := healthpb.HealthCheckResponse_SERVING
	if reason != "" {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	r.hs.SetServingStatus("", st)
	r.hs.SetServingStatus(intentv1.IntentService_ServiceDesc.ServiceName, st)
}

// shutdown turns the replica not ready for good: every gRPC health service
// NOT_SERVING and /readyz 503.
func (r *readiness) shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return
	}
	r.stopping = true
	if r.reason == "" {
		r.reason = "shutting down"
	} else {
		r.reason = "shutting down (" + r.reason + ")"
	}
	r.hs.Shutdown()
}

// degrade records what of the replica is degraded ("" for nothing): it
// stays ready (gRPC health SERVING, /readyz 200) and /readyz says what.
func (r *readiness) degrade(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.degraded = reason
}

// degradation returns what degrade last recorded.
func (r *readiness) degradation() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.degraded
}

// state returns the reason the replica is not ready, or "" when it is.
func (r *readiness) state() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reason
}

// notReadyReason is the one line /readyz answers for a failed probe; ""
// for none.
func notReadyReason(err error, requestTimeout time.Duration) string {
	var back *etcdstore.RolledBackError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &back):
		return fmt.Sprintf("etcd revision went back: answered at %d, below %d already seen (restored from an older snapshot?)", back.Revision, back.Floor)
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "deadline exceeded"):
		// The store wraps the client's error by its text: match that too.
		return fmt.Sprintf("etcd: no answer within %v", requestTimeout)
	}
	return "etcd: " + strings.Join(strings.Fields(err.Error()), " ")
}

// healthz answers 200 "ok" while the process serves HTTP at all: a
// liveness probe that restarts intentd only when it is stuck, never
// because etcd is away (a restart would not bring etcd back).
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprintln(w, "ok")
}

// readyz answers 200 "ok" while the replica is ready (the same decision as
// gRPC health's SERVING), else 503 with the reason in one line. A ready
// replica with a degraded part answers 200 "ok, degraded: " and what.
func (r *readiness) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	reason := r.state()
	if reason == "" {
		if d := r.degradation(); d != "" {
			_, _ = fmt.Fprintln(w, "ok, degraded: "+d)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = fmt.Fprintln(w, reason)
}
