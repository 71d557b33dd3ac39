package gateway_test

import (
	"bytes"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/gateway"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

const op = "create-pickup"

// The seed's paused worker: A holds the intent and is about to submit,
// but pauses past its lease; B takes over under a higher token and
// submits; A resumes and its call is refused at the gateway with intentd's
// STALE_TOKEN statement, kept in the history as evidence. The courier saw
// one request.
func TestPausedWorkerIsRefusedAtTheGateway(t *testing.T) {
	w := newWorld(t, nil)
	w.register("parcel-1")
	_, tokA := w.lease("parcel-1", "A", 2*time.Second, intentv1.Outcome_OUTCOME_EXECUTE)
	// A pauses: no heartbeat, its session lapses.
	deadline := time.Now().Add(30 * time.Second)
	for w.get("parcel-1").GetState() != intentv1.State_STATE_UNKNOWN {
		if time.Now().After(deadline) {
			t.Fatal("A's lease did not lapse")
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, tokB := w.lease("parcel-1", "B", time.Minute, intentv1.Outcome_OUTCOME_RECONCILE)
	b := w.submit("POST", "/u/courier/pickups", "parcel-1", op, tokB, pickup("parcel-1"))
	if b.status != http.StatusCreated || b.header.Get(gateway.HeaderOutcome) != gateway.OutcomeForwarded {
		t.Fatalf("B: %d %s %s, want 201 forwarded", b.status, b.header.Get(gateway.HeaderOutcome), b.body)
	}
	a := w.submit("POST", "/u/courier/pickups", "parcel-1", op, tokA, pickup("parcel-1"))
	if a.status != http.StatusConflict || a.header.Get(gateway.HeaderOutcome) != gateway.OutcomeStale {
		t.Fatalf("A resumed: %d %s %s, want 409 refused_stale", a.status, a.header.Get(gateway.HeaderOutcome), a.body)
	}
	st := a.statement(t)
	if st.GetStatus() != "stale_token" || st.GetCurrentToken() != uint64(tokB) || st.GetIntentKey() != "parcel-1" || st.GetActionTaken() != "evidence_recorded" {
		t.Errorf("A's statement %v, want stale_token naming B's token", st)
	}
	if n := w.courier.count(); n != 1 {
		t.Errorf("the courier booked %d pickups, want 1", n)
	}
	kept := false
	for _, e := range entries(w.get("parcel-1"), intentv1.HistoryEntry_KIND_SUBMISSION_STARTED) {
		kept = kept || (!e.GetAccepted() && e.GetToken() == uint64(tokA))
	}
	if !kept {
		t.Error("A's refused call is not in the history as evidence")
	}
}

// Workers racing one operation under the same lease, through two gateway
// replicas: one upstream request; every other call busy, or the recorded
// answer replayed byte for byte.
func TestRacingCallsMakeOneRequest(t *testing.T) {
	w := newWorld(t, nil)
	w.courier.set(func(c *courier) { c.delay = 300 * time.Millisecond })
	second, err := gateway.New(gateway.Config{Upstreams: map[string]*gateway.Upstream{
		"courier": {URL: mustURL(t, w.courier.srv.URL), IdempotencyHeader: "Idempotency-Key", KeepHeaders: []string{"Content-Type", "Location", "X-Pickup"}},
	}}, w.conn)
	if err != nil {
		t.Fatal(err)
	}
	other := httptestServer(t, second)
	w.register("parcel-2")
	_, tok := w.lease("parcel-2", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	var mu sync.Mutex
	got := map[string]int{}
	var bodies [][]byte
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := w.gw.URL
			if i%2 == 1 {
				base = other.URL
			}
			req, _ := http.NewRequest("POST", base+"/u/courier/pickups", strings.NewReader(pickup("parcel-2")))
			req.Header.Set("Authorization", "Bearer "+workerToken)
			req.Header.Set(gateway.HeaderKey, "parcel-2")
			req.Header.Set(gateway.HeaderOperation, op)
			req.Header.Set(gateway.HeaderToken, tok.String())
			a := w.do(req)
			mu.Lock()
			defer mu.Unlock()
			got[a.header.Get(gateway.HeaderOutcome)]++
			if a.status == http.StatusCreated {
				bodies = append(bodies, a.body)
			}
		}()
	}
	wg.Wait()
	if n := w.courier.count(); n != 1 {
		t.Errorf("the courier booked %d pickups, want 1", n)
	}
	if got[gateway.OutcomeForwarded] != 1 || got[gateway.OutcomeForwarded]+got[gateway.OutcomeBusy]+got[gateway.OutcomeReplayed] != 10 {
		t.Errorf("outcomes %v, want one forwarded, the rest busy or replayed", got)
	}
	for _, b := range bodies {
		if !bytes.Equal(b, bodies[0]) {
			t.Errorf("answers differ: %q and %q", b, bodies[0])
		}
	}
	// Once the answer is in, every call replays it, on either replica.
	first := w.submit("POST", "/u/courier/pickups", "parcel-2", op, tok, pickup("parcel-2"))
	req, _ := http.NewRequest("POST", other.URL+"/u/courier/pickups", strings.NewReader(pickup("parcel-2")))
	req.Header.Set("Authorization", "Bearer "+workerToken)
	req.Header.Set(gateway.HeaderKey, "parcel-2")
	req.Header.Set(gateway.HeaderOperation, op)
	req.Header.Set(gateway.HeaderToken, tok.String())
	for _, a := range []answer{first, w.do(req)} {
		if a.status != http.StatusCreated || a.header.Get(gateway.HeaderReplayed) != "true" || !bytes.Equal(a.body, bodies[0]) ||
			a.header.Get("X-Pickup") != "PU-0001" || a.header.Get("Location") != "/pickups/PU-0001" {
			t.Errorf("replay %d %v %q, want the recorded answer byte for byte", a.status, a.header, a.body)
		}
	}
	if n := w.courier.count(); n != 1 {
		t.Errorf("after the replays the courier booked %d pickups, want 1", n)
	}
}

// The answer lost after the courier committed, with a lookup: the call is
// answered 504 and the intent is UNKNOWN; nothing resends it; the
// reconciler's lookup through the gateway finds the pickup, its answer is
// recorded, and the intent completes with the courier's id.
func TestLostAnswerWithLookupIsReconciled(t *testing.T) {
	cut := &cutReplies{}
	w := newWorld(t, func(c *gateway.Config) { c.Upstreams["courier"].Transport = cut })
	w.register("parcel-3")
	_, tok := w.lease("parcel-3", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	cut.set(true)
	a := w.submit("POST", "/u/courier/pickups", "parcel-3", op, tok, pickup("parcel-3"))
	cut.set(false)
	if a.status != http.StatusGatewayTimeout || a.header.Get(gateway.HeaderOutcome) != gateway.OutcomeUnknown {
		t.Fatalf("lost: %d %s %s, want 504 unknown", a.status, a.header.Get(gateway.HeaderOutcome), a.body)
	}
	if st := a.statement(t); st.GetStatus() != "reconcile" || !strings.Contains(st.GetText(), "connection reset") {
		t.Errorf("statement %v, want reconcile saying what came back", st)
	}
	if s := w.get("parcel-3").GetState(); s != intentv1.State_STATE_UNKNOWN {
		t.Fatalf("intent %v, want UNKNOWN", s)
	}
	again := w.submit("POST", "/u/courier/pickups", "parcel-3", op, tok, pickup("parcel-3"))
	if again.status != http.StatusConflict || again.header.Get(gateway.HeaderOutcome) != gateway.OutcomeUnknown {
		t.Errorf("sent again: %d %s %s, want 409 unknown", again.status, again.header.Get(gateway.HeaderOutcome), again.body)
	}
	_, rtok := w.lease("parcel-3", "R", time.Minute, intentv1.Outcome_OUTCOME_RECONCILE)
	if n := w.courier.count(); n != 1 {
		t.Fatalf("the courier booked %d pickups, want 1", n)
	}
	found := w.submit("POST", "/lookup/courier", "parcel-3", op, rtok, "")
	if found.status != http.StatusOK || found.header.Get(gateway.HeaderOutcome) != gateway.OutcomeLookedUp || !strings.Contains(string(found.body), `"PU-0001"`) {
		t.Fatalf("lookup: %d %s %s, want 200 looked_up with the pickup", found.status, found.header.Get(gateway.HeaderOutcome), found.body)
	}
	if _, err := w.api.Complete(w.as(workerToken), &intentv1.CompleteRequest{Key: "parcel-3", Token: uint64(rtok),
		Result: &intentv1.Result{Payload: found.body, ExternalRefs: map[string]string{"pickup_id": "PU-0001"}}}); err != nil {
		t.Fatal(err)
	}
	in := w.get("parcel-3")
	if in.GetState() != intentv1.State_STATE_COMPLETED || in.GetResult().GetExternalRefs()["pickup_id"] != "PU-0001" {
		t.Errorf("intent %v %v, want COMPLETED with the courier's id", in.GetState(), in.GetResult())
	}
	replay := w.submit("POST", "/u/courier/pickups", "parcel-3", op, rtok, pickup("parcel-3"))
	if replay.header.Get(gateway.HeaderReplayed) != "true" || !bytes.Equal(replay.body, found.body) {
		t.Errorf("after the lookup: %d %s, want the lookup's answer replayed", replay.status, replay.body)
	}
	if n := w.courier.count(); n != 1 || cut.cuts != 1 {
		t.Errorf("the courier booked %d pickups (%d replies cut), want 1", n, cut.cuts)
	}
}

// The answer lost (a timeout after the courier committed) with no lookup:
// 504, and the intent waits in the review queue with what was sent, when,
// and what came back; no call sends it again.
func TestLostAnswerWithoutLookupNeedsReview(t *testing.T) {
	w := newWorld(t, func(c *gateway.Config) {
		c.Upstreams["courier"].Lookup = nil
		c.Upstreams["courier"].Timeout = 300 * time.Millisecond
	})
	w.courier.set(func(c *courier) { c.delay = time.Second })
	w.register("parcel-4")
	_, tok := w.lease("parcel-4", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	sent := time.Now()
	a := w.submit("POST", "/u/courier/pickups", "parcel-4", op, tok, pickup("parcel-4"))
	if a.status != http.StatusGatewayTimeout || a.statement(t).GetStatus() != "needs_review" {
		t.Fatalf("lost: %d %s, want 504 needs_review", a.status, a.body)
	}
	q, err := w.api.List(w.as(adminToken), &intentv1.ListRequest{Tenant: "acme", States: []intentv1.State{intentv1.State_STATE_NEEDS_REVIEW}})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.GetIntents()) != 1 || q.GetIntents()[0].GetKey() != "parcel-4" {
		t.Fatalf("review queue %v, want parcel-4", q.GetIntents())
	}
	esc := entries(w.get("parcel-4"), intentv1.HistoryEntry_KIND_ESCALATED)
	if len(esc) != 1 {
		t.Fatalf("escalations %v", esc)
	}
	for _, want := range []string{"POST /pickups", `"courier"`, "deadline exceeded", sent.UTC().Format("2006-01-02T15:04"), "no lookup"} {
		if !strings.Contains(esc[0].GetReason(), want) {
			t.Errorf("escalation %q does not say %q", esc[0].GetReason(), want)
		}
	}
	if b := w.submit("POST", "/u/courier/pickups", "parcel-4", op, tok, pickup("parcel-4")); b.status != http.StatusConflict {
		t.Errorf("sent again: %d %s, want 409", b.status, b.body)
	}
	time.Sleep(time.Second)
	if n := w.courier.count(); n != 1 {
		t.Errorf("the courier booked %d pickups, want 1", n)
	}
}

// Hostile and malformed calls: each refused with a statement naming what
// is wrong, and nothing reaches the courier.
func TestHostileCallsForwardNothing(t *testing.T) {
	w := newWorld(t, func(c *gateway.Config) { c.Upstreams["courier"].MaxRequestBytes = 1024 })
	w.register("parcel-5")
	_, tok := w.lease("parcel-5", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	tokS := tok.String()
	for _, tc := range []struct {
		name         string
		method, path string
		key, op      string
		body         string
		extra        []string
		status       int
		says         string
	}{
		{"unknown upstream", "POST", "/u/bank/transfers", "parcel-5", op, "{}", nil, 404, `no upstream "bank"`},
		{"no upstream at all", "POST", "/u/", "parcel-5", op, "{}", nil, 404, `no upstream ""`},
		{"not a gateway path", "POST", "/admin", "parcel-5", op, "{}", nil, 404, "not a path of the gateway"},
		{"dot segments", "POST", "/u/courier/../../admin", "parcel-5", op, "{}", nil, 400, "not clean"},
		{"an encoded slash", "POST", "/u/courier/a%2F..%2Fadmin", "parcel-5", op, "{}", nil, 400, "encodes"},
		{"no key", "POST", "/u/courier/pickups", "", op, "{}", nil, 400, "Intentd-Key is missing"},
		{"no operation", "POST", "/u/courier/pickups", "parcel-5", "", "{}", nil, 400, "Intentd-Operation is missing"},
		{"no token", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{gateway.HeaderToken, ""}, 400, "Intentd-Fencing-Token is missing"},
		{"a malformed token", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{gateway.HeaderToken, "", gateway.HeaderToken, "12abc"}, 400, "Intentd-Fencing-Token"},
		{"two keys", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{gateway.HeaderKey, "parcel-6"}, 400, "Intentd-Key is given 2 times"},
		{"a key of the wrong alphabet", "POST", "/u/courier/pickups", "parcel 5!", op, "{}", nil, 400, "Intentd-Key (key)"},
		{"an operation with a colon", "POST", "/u/courier/pickups", "parcel-5", "create:x", "{}", nil, 400, "Intentd-Operation (operation)"},
		{"a token never issued", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{gateway.HeaderToken, "", gateway.HeaderToken, "999999999999"}, 400, "never issued"},
		{"an oversized body", "POST", "/u/courier/pickups", "parcel-5", op, strings.Repeat("x", 2000), nil, 413, "max-request-bytes, 1024"},
		{"CONNECT", "CONNECT", "/u/courier/pickups", "parcel-5", op, "", nil, 405, "never forwarded"},
		{"no credentials", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{"Authorization", ""}, 401, "UNAUTHENTICATED"},
		{"a reader's credentials", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{"Authorization", "", "Authorization", "Bearer " + readerToken}, 403, "PERMISSION_DENIED"},
		{"another tenant's worker, its own tenant", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{"Authorization", "", "Authorization", "Bearer " + otherToken}, 404, "no intent"},
		{"another tenant's worker naming the tenant", "POST", "/u/courier/pickups", "parcel-5", op, "{}", []string{"Authorization", "", "Authorization", "Bearer " + otherToken, gateway.HeaderTenant, "acme"}, 403, "not a member"},
		{"an intent never registered", "POST", "/u/courier/pickups", "parcel-99", op, "{}", nil, 404, "no intent"},
		{"a lookup of an upstream without one", "POST", "/lookup/bank", "parcel-5", op, "", nil, 404, `no upstream "bank"`},
		{"a lookup with nothing in doubt", "POST", "/lookup/courier", "parcel-5", op, "", nil, 409, "nothing left in doubt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := tc.extra
			if tc.method == "CONNECT" {
				extra = nil
			}
			a := w.submit(tc.method, tc.path, tc.key, tc.op, tok, tc.body, extra...)
			if a.status != tc.status {
				t.Errorf("status %d, want %d: %s", a.status, tc.status, a.body)
			}
			if tc.method == "CONNECT" {
				return
			}
			st := a.statement(t)
			if !strings.Contains(st.GetText(), tc.says) || st.GetActionTaken() != "none" {
				t.Errorf("statement %q (action %q), want it to say %q and that nothing was done", st.GetText(), st.GetActionTaken(), tc.says)
			}
			_ = tokS
		})
	}
	if r := w.courier.received(); len(r) != 0 {
		t.Errorf("the courier received %d requests, want none", len(r))
	}
}

// What reaches the upstream: the worker's own headers and body, the
// operation key as its idempotency key, the upstream's credentials from
// the configuration; never intentd's credentials, the gateway's headers or
// hop-by-hop ones. What comes back: the kept headers only.
func TestWhatIsForwarded(t *testing.T) {
	w := newWorld(t, nil)
	w.register("parcel-6")
	_, tok := w.lease("parcel-6", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	a := w.submit("POST", "/u/courier/pickups?express=1", "parcel-6", op, tok, pickup("parcel-6"),
		"X-Trace-Note", "n1", "Connection", "X-Drop-Me", "X-Drop-Me", "secret", "Upgrade", "h2c", "Idempotency-Key", "forged", "X-Courier-Key", "forged",
		"Proxy-Authorization", "Basic Zm9v", "Te", "trailers")
	if a.status != http.StatusCreated {
		t.Fatalf("%d %s", a.status, a.body)
	}
	reqs := w.courier.received()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if r.URL.RawQuery != "express=1" || r.Header.Get("X-Trace-Note") != "n1" || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("the worker's own request did not arrive whole: %v %v", r.URL, r.Header)
	}
	if got := r.Header.Values("Idempotency-Key"); !slices.Equal(got, []string{"parcel-6:" + op}) {
		t.Errorf("Idempotency-Key %q, want the operation key only", got)
	}
	if got := r.Header.Get("X-Courier-Key"); got != "courier-secret" {
		t.Errorf("X-Courier-Key %q, want the configured one", got)
	}
	for _, h := range []string{"Authorization", "Proxy-Authorization", "X-Drop-Me", "Upgrade", "Te", gateway.HeaderKey, gateway.HeaderOperation, gateway.HeaderToken} {
		if v := r.Header.Values(h); len(v) != 0 {
			t.Errorf("%s reached the upstream: %q", h, v)
		}
	}
	if a.header.Get("X-Not-Kept") != "" || a.header.Get("X-Pickup") != "PU-0001" {
		t.Errorf("answer headers %v, want the kept ones only", a.header)
	}
}

// An upstream that redirects elsewhere: not followed by the gateway, and
// its Location not answered (so no client follows it either); the answer
// names it.
func TestRedirectToAnotherHostIsNotFollowed(t *testing.T) {
	w := newWorld(t, nil)
	elsewhere := newCourier(t)
	w.courier.set(func(c *courier) { c.redirect = elsewhere.srv.URL + "/pickups" })
	w.register("parcel-7")
	_, tok := w.lease("parcel-7", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	a := w.submit("POST", "/u/courier/pickups", "parcel-7", op, tok, pickup("parcel-7"))
	if a.status != http.StatusFound || a.header.Get("Location") != "" || a.header.Get(gateway.HeaderNotFollowed) != elsewhere.srv.URL+"/pickups" {
		t.Errorf("%d %v, want 302 without Location, naming it in %s", a.status, a.header, gateway.HeaderNotFollowed)
	}
	if n := len(elsewhere.received()); n != 0 {
		t.Errorf("the other host received %d requests", n)
	}
}

// A definite refusal (a status configured as one) is answered and may be
// sent again; a request that reached nobody is not_sent and may be too;
// a lookup that finds nothing lets the operation be sent again.
func TestWhatMaySendAgain(t *testing.T) {
	w := newWorld(t, func(c *gateway.Config) { c.Upstreams["courier"].RefusalStatuses = []int{429} })
	w.register("parcel-8")
	_, tok := w.lease("parcel-8", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	w.courier.set(func(c *courier) { c.status = http.StatusTooManyRequests })
	if a := w.submit("POST", "/u/courier/pickups", "parcel-8", op, tok, pickup("parcel-8")); a.status != 429 || a.header.Get(gateway.HeaderOutcome) != gateway.OutcomeForwarded {
		t.Fatalf("refused upstream: %d %v", a.status, a.header)
	}
	w.courier.set(func(c *courier) { c.status = 0 })
	if a := w.submit("POST", "/u/courier/pickups", "parcel-8", op, tok, pickup("parcel-8")); a.status != http.StatusCreated || a.header.Get(gateway.HeaderReplayed) != "" {
		t.Fatalf("after a refusal: %d %v, want it sent again", a.status, a.header)
	}

	// Nobody listening: not sent.
	down := newWorld(t, func(c *gateway.Config) { c.Upstreams["courier"].URL = mustURL(t, "http://127.0.0.1:1") })
	down.register("parcel-9")
	_, tok9 := down.lease("parcel-9", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	a := down.submit("POST", "/u/courier/pickups", "parcel-9", op, tok9, pickup("parcel-9"))
	if a.status != http.StatusBadGateway || a.header.Get(gateway.HeaderOutcome) != gateway.OutcomeNotSent || !strings.Contains(a.statement(t).GetText(), "safe") {
		t.Errorf("unreachable: %d %v %s", a.status, a.header, a.body)
	}
	if b := down.submit("POST", "/u/courier/pickups", "parcel-9", op, tok9, pickup("parcel-9")); b.header.Get(gateway.HeaderOutcome) != gateway.OutcomeNotSent {
		t.Errorf("again: %v, want it tried again (not_sent again)", b.header)
	}

	// A lookup that finds nothing: absent, and the reconciler may send.
	cut := &cutReplies{}
	lw := newWorld(t, func(c *gateway.Config) { c.Upstreams["courier"].Transport = cut })
	lw.register("parcel-10")
	_, t1 := lw.lease("parcel-10", "A", time.Minute, intentv1.Outcome_OUTCOME_EXECUTE)
	lw.courier.set(func(c *courier) { c.status = http.StatusServiceUnavailable })
	cut.set(true)
	if a := lw.submit("POST", "/u/courier/pickups", "parcel-10", op, t1, pickup("parcel-10")); a.status != http.StatusGatewayTimeout {
		t.Fatalf("lost: %d %s", a.status, a.body)
	}
	cut.set(false)
	lw.courier.set(func(c *courier) { c.status = 0 })
	_, t2 := lw.lease("parcel-10", "R", time.Minute, intentv1.Outcome_OUTCOME_RECONCILE)
	if a := lw.submit("POST", "/lookup/courier", "parcel-10", op, t2, ""); a.status != http.StatusNotFound || a.header.Get(gateway.HeaderOutcome) != gateway.OutcomeAbsent {
		t.Fatalf("lookup: %d %v %s, want 404 absent", a.status, a.header, a.body)
	}
	if a := lw.submit("POST", "/u/courier/pickups", "parcel-10", op, t2, pickup("parcel-10")); a.status != http.StatusCreated || a.header.Get(gateway.HeaderOutcome) != gateway.OutcomeForwarded {
		t.Errorf("after the absence: %d %v %s", a.status, a.header, a.body)
	}
	if n := lw.courier.count(); n != 1 {
		t.Errorf("the courier booked %d pickups, want 1", n)
	}
}
