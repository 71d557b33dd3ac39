package daemon_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
)

// A poison intent's count of attempts that ended without a report is in
// its record: it survives an intentd restart on the same data directory,
// and so does its limit, fixed at registration even when the restarted
// intentd has another --max-attempts. The attempt that reaches the limit
// sends the intent to NEEDS_REVIEW, visible in the metric too.
func TestPoisonIntentCountSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	const key = "poison-restart"
	cfg := testConfig(dir)
	cfg.Store.MaxAttempts = 3
	first := start(t, cfg)
	c := intentv1.NewIntentServiceClient(first.conn)

	// crash acquires the intent on a fresh session and lets that session
	// end without a report, as a worker that dies does.
	crash := func(c intentv1.IntentServiceClient, n int) *intentv1.AcquireResponse {
		t.Helper()
		sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "crashing-worker", Ttl: durationpb.New(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{
			Key: key, SessionId: sess.GetSessionId(), RequestId: fmt.Sprintf("attempt-%d", n),
			Register: &intentv1.RegisterRequest{Key: key, Params: params(t, 1)},
		})
		if err != nil {
			t.Fatalf("Acquire %d: %v", n, err)
		}
		if _, err := c.CloseSession(call(t), &intentv1.CloseSessionRequest{SessionId: sess.GetSessionId()}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := crash(c, 1); a.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
		t.Fatalf("Acquire 1: %v, want EXECUTE", a.GetOutcome())
	}
	if a := crash(c, 2); a.GetOutcome() != intentv1.Outcome_OUTCOME_RECONCILE || a.GetIntent().GetAttempts() != 1 || a.GetIntent().GetMaxAttempts() != 3 {
		t.Fatalf("Acquire 2: %v, attempts %d of %d; want RECONCILE, 1 of 3", a.GetOutcome(), a.GetIntent().GetAttempts(), a.GetIntent().GetMaxAttempts())
	}
	first.shutdown(t)

	cfg = testConfig(dir)
	cfg.Store.MaxAttempts = 50 // the intent keeps the limit it was registered with
	cfg.MetricsListen = freeport.Addr(t)
	second := start(t, cfg)
	c = intentv1.NewIntentServiceClient(second.conn)
	if a := crash(c, 3); a.GetOutcome() != intentv1.Outcome_OUTCOME_RECONCILE || a.GetIntent().GetAttempts() != 2 || a.GetIntent().GetMaxAttempts() != 3 {
		t.Fatalf("Acquire 3 after the restart: %v, attempts %d of %d; want RECONCILE, 2 of 3 (the count survived)", a.GetOutcome(), a.GetIntent().GetAttempts(), a.GetIntent().GetMaxAttempts())
	}
	a := crash(c, 4)
	if a.GetOutcome() != intentv1.Outcome_OUTCOME_NEEDS_REVIEW || a.GetLease() != nil || !strings.Contains(a.GetStatement().GetText(), "after 3 attempts ended without a report") {
		t.Fatalf("Acquire 4: %v, lease %v, statement %q; want NEEDS_REVIEW after 3 attempts, no lease", a.GetOutcome(), a.GetLease(), a.GetStatement().GetText())
	}
	got, err := c.Get(call(t), &intentv1.GetRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	h := got.GetIntent().GetHistory()
	if last := h[len(h)-1]; last.GetKind() != intentv1.HistoryEntry_KIND_ESCALATED || last.GetPrincipal() != "intentd" || !strings.HasPrefix(last.GetReason(), "3 attempts ended without a report") {
		t.Errorf("last history entry %v, want intentd's escalation after 3 attempts", last)
	}
	if body := scrape(t, cfg.MetricsListen); !strings.Contains(body, "intentd_intents_attempts_exhausted_total 1") {
		t.Errorf("/metrics lacks intentd_intents_attempts_exhausted_total 1")
	}
}
