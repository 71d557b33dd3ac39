package console_test

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/console"
)

func contains(t *testing.T, what string, p page, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(p.body, w) {
			t.Errorf("%s: page lacks %q:\n%s", what, w, p.body)
		}
	}
}

// TestSignInSetsASecureSession signs in with a bearer token: a wrong token
// is refused on the form, the right one rotates the session (the id from
// before signing in is worth nothing after), the cookie is HttpOnly,
// SameSite=Strict, scoped to the console and expiring, the token is in no
// URL, and signing out ends the session on the server.
func TestSignInSetsASecureSession(t *testing.T) {
	e := newEnv(t, true)
	b := e.browser()
	first := b.get("/console/")
	if first.code != http.StatusSeeOther || first.h.Get("Location") != "/console/signin" {
		t.Fatalf("GET /console/ signed out: %d %q, want 303 to /console/signin", first.code, first.h.Get("Location"))
	}
	form := b.get("/console/signin")
	before := form.h.Get("Set-Cookie")
	for _, want := range []string{"HttpOnly", "SameSite=Strict", "Path=/console/", "Max-Age="} {
		if !strings.Contains(before, want) {
			t.Errorf("session cookie %q lacks %s", before, want)
		}
	}
	for h, want := range map[string]string{"Content-Security-Policy": "script-src 'self'", "X-Frame-Options": "DENY", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
		if got := form.h.Get(h); !strings.Contains(got, want) {
			t.Errorf("header %s = %q, want it to hold %q", h, got, want)
		}
	}
	contains(t, "sign-in form", form, `type="password"`, `<label for="token">`)

	wrong := b.post("/console/signin", url.Values{"csrf": {form.field(t, "csrf")}, "token": {"not-a-token"}})
	if wrong.code != http.StatusUnauthorized {
		t.Errorf("sign in with a wrong token: %d, want 401", wrong.code)
	}
	contains(t, "wrong token", wrong, "not recognized")

	ok := b.post("/console/signin", url.Values{"csrf": {form.field(t, "csrf")}, "token": {alice.token}})
	if ok.code != http.StatusSeeOther || ok.h.Get("Location") != "/console/t/acme/queue" {
		t.Fatalf("sign in as alice: %d %q, want 303 to acme's queue", ok.code, ok.h.Get("Location"))
	}
	if strings.Contains(ok.h.Get("Location"), alice.token) {
		t.Errorf("the token is in the redirect URL %q", ok.h.Get("Location"))
	}
	after := ok.h.Get("Set-Cookie")
	if after == "" || strings.SplitN(after, ";", 2)[0] == strings.SplitN(before, ";", 2)[0] {
		t.Errorf("session id not rotated on sign-in: before %q, after %q", before, after)
	}
	q := b.follow("/console/")
	contains(t, "queue after sign-in", q, "Signed in as <strong>alice</strong>", "reviewer")

	// The pre-sign-in id is dead: a browser that kept it is signed out.
	stale := e.browser()
	u, _ := url.Parse(e.web.URL)
	stale.http.Jar.SetCookies(u, []*http.Cookie{{Name: "intentd_console", Value: strings.TrimPrefix(strings.SplitN(before, ";", 2)[0], "intentd_console="), Path: "/console/"}})
	if p := stale.get("/console/t/acme/queue"); p.code != http.StatusSeeOther {
		t.Errorf("queue with the pre-sign-in session id: %d, want 303 to sign-in", p.code)
	}

	out := b.post("/console/signout", url.Values{"csrf": {q.field(t, "csrf")}})
	if out.code != http.StatusSeeOther {
		t.Fatalf("sign out: %d", out.code)
	}
	if p := b.get("/console/t/acme/queue"); p.code != http.StatusSeeOther || !strings.HasPrefix(p.h.Get("Location"), "/console/signin") {
		t.Errorf("queue after signing out: %d %q, want 303 to sign-in", p.code, p.h.Get("Location"))
	}
}

// TestWrongTokensAreSlowedDown: after five wrong tokens from one address
// the sign-in form refuses even the right one for a while (429), so that
// guessing through the form is slow.
func TestWrongTokensAreSlowedDown(t *testing.T) {
	e := newEnv(t, true)
	b := e.browser()
	form := b.get("/console/signin")
	try := func(token string) page {
		return b.post("/console/signin", url.Values{"csrf": {form.field(t, "csrf")}, "token": {token}})
	}
	for i := range 5 {
		if p := try("wrong-" + itoa(uint64(i))); p.code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i, p.code)
		}
	}
	p := try(alice.token)
	if p.code != http.StatusTooManyRequests || !strings.Contains(p.body, "Too many wrong tokens") {
		t.Errorf("right token after five wrong ones: %d, want 429:\n%s", p.code, p.body)
	}
}

// TestSessionsExpire: a session ends after the idle timeout, and at once
// when the tokens file no longer lists its token.
func TestSessionsExpire(t *testing.T) {
	e := newEnv(t, true)
	b := e.browser()
	b.signIn(alice)
	e.clock.advance(console.DefaultConfig().IdleTimeout + time.Second)
	if p := b.get("/console/t/acme/queue"); p.code != http.StatusSeeOther {
		t.Errorf("queue after the idle timeout: %d, want 303 to sign-in", p.code)
	}

	b = e.browser()
	b.signIn(alice)
	e.dirMu.Lock()
	e.dir = directory(t, bob, worker, ops) // alice's token revoked
	e.dirMu.Unlock()
	if p := b.get("/console/t/acme/queue"); p.code != http.StatusSeeOther {
		t.Errorf("queue after alice's token was revoked: %d, want 303 to sign-in", p.code)
	}
}

// TestQueueShowsWhatWaits seeds intents in several states: the queue shows
// the UNKNOWN and NEEDS_REVIEW ones oldest first, with age, action,
// amount, labels and why each is there; its filters and paging work.
func TestQueueShowsWhatWaits(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	e.unknown("acme", "refund-2", map[string]any{"amount": "12.50", "currency": "USD"})
	s := e.unknown("acme", "purchase-lamp", map[string]any{"item": "desk lamp", "max_amount": "89.00", "currency": "EUR"})
	ctx := e.ctx(worker)
	a, err := e.api.Acquire(ctx, &intentv1.AcquireRequest{Tenant: "acme", Key: "purchase-lamp", SessionId: s.session, RequestId: "reconcile-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.api.Escalate(ctx, &intentv1.EscalateRequest{Tenant: "acme", Key: "purchase-lamp", Token: a.GetLease().GetToken(), Reason: "merchant shows two orders", Actor: "reconciler-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.api.Register(ctx, &intentv1.RegisterRequest{Tenant: "acme", Key: "still-pending", Params: mustStruct(t, map[string]any{"x": 1})}); err != nil {
		t.Fatal(err)
	}

	b := e.browser()
	q := b.signIn(rita)
	contains(t, "queue", q, "refund-1", "refund-2", "purchase-lamp", "89.00 EUR", "12.50 USD", "customer=c-17",
		"Timeout: worker-a could not tell whether its call took effect: payment provider timed out",
		"Escalated by worker-svc (as reconciler-1): merchant shows two orders", ">UNKNOWN<", ">NEEDS_REVIEW<", ">refund<")
	if strings.Contains(q.body, "still-pending") {
		t.Errorf("queue shows a PENDING intent")
	}
	if i, j := strings.Index(q.body, "refund-1"), strings.Index(q.body, "refund-2"); i > j {
		t.Errorf("queue not oldest first: refund-1 at %d, refund-2 at %d", i, j)
	}

	for _, tc := range []struct {
		query      string
		want, dont []string
	}{
		{"state=needs_review", []string{"purchase-lamp"}, []string{"refund-1", "refund-2"}},
		{"state=unknown", []string{"refund-1", "refund-2"}, []string{"purchase-lamp"}},
		{"label=customer%3Dc-99", []string{"Nothing waits for a reviewer with these filters"}, []string{"refund-1"}},
	} {
		p := b.get("/console/t/acme/queue?" + tc.query)
		contains(t, tc.query, p, tc.want...)
		for _, d := range tc.dont {
			if strings.Contains(p.body, `>`+d+`<`) {
				t.Errorf("%s: page shows %s", tc.query, d)
			}
		}
	}
	if p := b.get("/console/t/acme/queue?label=no-equals-sign"); p.code != http.StatusBadRequest || !strings.Contains(p.body, "label") {
		t.Errorf("queue with a bad label filter: %d, want 400 naming the field:\n%s", p.code, p.body)
	}
}

// TestQueuePages lists more intents than fit on a page: the next page
// continues where the first ended, and every intent shows once.
func TestQueuePages(t *testing.T) {
	e := newEnv(t, false)
	var keys []string
	for i := range 27 {
		k := "refund-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		keys = append(keys, k)
		e.unknown("default", k, refund)
	}
	b := e.browser()
	first := b.follow("/console/")
	next := nextPage.FindStringSubmatch(first.body)
	if next == nil {
		t.Fatalf("first page has no next page link:\n%s", first.body)
	}
	second := b.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	for _, k := range keys {
		if n := strings.Count(first.body, ">"+k+"<") + strings.Count(second.body, ">"+k+"<"); n != 1 {
			t.Errorf("%s shows %d times across the two pages, want once", k, n)
		}
	}
}

// TestIntentPageShowsTermsLeaseAndTimeline opens an intent whose first
// worker was fenced: the page shows the approved terms, the current token,
// and the history as a timeline with the stale report marked.
func TestIntentPageShowsTermsLeaseAndTimeline(t *testing.T) {
	e := newEnv(t, true)
	s := e.unknown("acme", "refund-1", refund)
	ctx := e.ctx(worker)
	a, err := e.api.Acquire(ctx, &intentv1.AcquireRequest{Tenant: "acme", Key: "refund-1", SessionId: s.session, RequestId: "reconcile-1"})
	if err != nil || a.GetOutcome() != intentv1.Outcome_OUTCOME_RECONCILE {
		t.Fatalf("Acquire: %v %v, want RECONCILE", a.GetOutcome(), err)
	}
	// The first worker resumes and reports under its old token: fenced.
	_, err = e.api.Complete(ctx, &intentv1.CompleteRequest{Tenant: "acme", Key: "refund-1", Token: s.token, Result: &intentv1.Result{ExternalRefs: map[string]string{"refund_id": "re_9"}}})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("stale Complete: %v, want ABORTED", err)
	}
	if _, err := e.api.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Tenant: "acme", Key: "refund-1", Token: a.GetLease().GetToken(), Reason: "provider still silent"}); err != nil {
		t.Fatal(err)
	}
	b := e.browser()
	b.signIn(alice)
	p := b.get("/console/t/acme/intents/refund-1")
	contains(t, "intent page", p, "Approved terms", "amount_cents", "8900", "SO-1042", "Current token",
		"Registered", "Lease issued (execute)", "Marked unknown", "Lease issued (reconcile)",
		"Reported completed — stale, changed nothing", ">STALE<", "refund_id=re_9", "provider still silent", "Record decision")
	if !strings.Contains(p.body, `name="expected_token" value="`+itoa(a.GetLease().GetToken())+`"`) {
		t.Errorf("decide form not fenced by the current token %d:\n%s", a.GetLease().GetToken(), p.body)
	}
}

// TestDecideIsResolve decides an UNKNOWN intent in the console: the
// decision is Resolve's (who, why, the provider's reference, channel
// "console"), the intent leaves the queue, and the original worker's next
// Acquire replays the result.
func TestDecideIsResolve(t *testing.T) {
	e := newEnv(t, true)
	s := e.unknown("acme", "refund-1", refund)
	b := e.browser()
	q := b.signIn(alice)
	contains(t, "queue", q, ">refund-1<")
	form, _ := b.decideForm("acme", "refund-1", url.Values{"decision": {"completed"}, "ref_name": {"refund_id"}, "ref_value": {"re_123"}, "reason": {"refund re_123 found in the provider dashboard"}})
	d := b.post("/console/t/acme/decide/refund-1", form)
	if d.code != http.StatusSeeOther {
		t.Fatalf("decide: %d, want 303:\n%s", d.code, d.body)
	}
	after := b.follow(d.h.Get("Location"))
	contains(t, "intent after deciding", after, "Decided: COMPLETED, recorded as alice via the console.", "Decided by a reviewer: COMPLETED", "via console")

	in := e.get("acme", "refund-1")
	last := in.GetHistory()[len(in.GetHistory())-1]
	if in.GetState() != intentv1.State_STATE_COMPLETED || last.GetKind() != intentv1.HistoryEntry_KIND_RESOLVED || last.GetChannel() != console.Channel ||
		last.GetPrincipal() != "alice" || last.GetReason() != "refund re_123 found in the provider dashboard" || last.GetResult().GetExternalRefs()["refund_id"] != "re_123" {
		t.Errorf("after deciding: %v, last entry %v; want COMPLETED, RESOLVED by alice via console with the reason and refund_id re_123", in.GetState(), last)
	}
	if q := b.get("/console/t/acme/queue"); strings.Contains(q.body, ">refund-1<") {
		t.Errorf("decided intent still in the queue")
	}
	a, err := e.api.Acquire(e.ctx(worker), &intentv1.AcquireRequest{Tenant: "acme", Key: "refund-1", SessionId: s.session, RequestId: "after-review"})
	if err != nil || a.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED || a.GetIntent().GetResult().GetExternalRefs()["refund_id"] != "re_123" {
		t.Errorf("worker's Acquire after the decision: %v %v result %v, want COMPLETED replaying refund_id re_123", a.GetOutcome(), err, a.GetIntent().GetResult())
	}

	// The same form sent again (a double click, a reload) is recognized.
	again := b.post("/console/t/acme/decide/refund-1", form)
	if again.code != http.StatusSeeOther {
		t.Fatalf("decide again: %d:\n%s", again.code, again.body)
	}
	contains(t, "the same form twice", b.follow(again.h.Get("Location")), "already recorded")
}

// TestDecideNeedsReasonAndEvidence: a decision without a reason, a
// completed one without the provider's reference, a failed one without a
// code are shown again with the field named; nothing is recorded.
func TestDecideNeedsReasonAndEvidence(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	b := e.browser()
	b.signIn(alice)
	for _, tc := range []struct {
		name   string
		fields url.Values
		want   string
	}{
		{"no reason", url.Values{"decision": {"pending"}}, "Say why"},
		{"no decision", url.Values{"reason": {"r"}}, "Choose what happened"},
		{"completed without reference", url.Values{"decision": {"completed"}, "ref_name": {"refund_id"}, "reason": {"found"}}, "needs the provider&#39;s reference"},
		{"failed without code", url.Values{"decision": {"failed"}, "reason": {"declined"}}, "needs a failure code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			form, _ := b.decideForm("acme", "refund-1", tc.fields)
			p := b.post("/console/t/acme/decide/refund-1", form)
			if p.code != http.StatusUnprocessableEntity {
				t.Errorf("decide: %d, want 422", p.code)
			}
			contains(t, tc.name, p, tc.want, `class="field-error"`)
			if got := e.get("acme", "refund-1").GetState(); got != intentv1.State_STATE_UNKNOWN {
				t.Errorf("after a refused form: %v, want UNKNOWN", got)
			}
		})
	}
}

// TestReaderCannotDecide: a reader sees the intent but no decide form,
// and a decision posted anyway is refused by the API's role matrix.
func TestReaderCannotDecide(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	b := e.browser()
	b.signIn(rita)
	form, p := b.decideForm("acme", "refund-1", url.Values{"decision": {"pending"}, "reason": {"looks absent"}})
	contains(t, "reader's intent page", p, "Deciding needs the <strong>reviewer</strong>")
	if strings.Contains(p.body, "Record decision") {
		t.Errorf("a reader is offered the decide button")
	}
	d := b.post("/console/t/acme/decide/refund-1", form)
	if d.code != http.StatusForbidden {
		t.Errorf("reader's decision: %d, want 403:\n%s", d.code, d.body)
	}
	contains(t, "reader's decision", d, "Not allowed", "PERMISSION_DENIED")
	if got := e.get("acme", "refund-1").GetState(); got != intentv1.State_STATE_UNKNOWN {
		t.Errorf("after the reader's decision: %v, want UNKNOWN", got)
	}
}

// TestCrossTenantIsNotFound: another tenant's intent, queue and decide URL
// read exactly like an intent that does not exist.
func TestCrossTenantIsNotFound(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("globex", "refund-g", refund)
	b := e.browser()
	q := b.signIn(alice)
	missing := b.get("/console/t/acme/intents/no-such-intent")
	if missing.code != http.StatusNotFound {
		t.Fatalf("missing intent: %d, want 404", missing.code)
	}
	mainOf := func(p page) string {
		_, m, _ := strings.Cut(p.body, "<main")
		m, _, _ = strings.Cut(m, "</main>")
		return m
	}
	for _, path := range []string{"/console/t/globex/intents/refund-g", "/console/t/globex/queue", "/console/t/globex/overview", "/console/t/globex/live"} {
		p := b.get(path)
		if p.code != http.StatusNotFound || mainOf(p) != mainOf(missing) || strings.Contains(p.body, "refund-g") {
			t.Errorf("GET %s as alice (acme): %d, want the not-found page of a missing intent:\n%s\nwant:\n%s", path, p.code, mainOf(p), mainOf(missing))
		}
	}
	d := b.post("/console/t/globex/decide/refund-g", url.Values{"csrf": {q.field(t, "csrf")}, "decision": {"cancelled"}, "reason": {"x"}, "request_id": {"r1"}})
	if d.code != http.StatusNotFound {
		t.Errorf("decide in globex as alice: %d, want 404", d.code)
	}
	if got := e.get("globex", "refund-g").GetState(); got != intentv1.State_STATE_UNKNOWN {
		t.Errorf("globex's intent after alice's attempt: %v, want UNKNOWN", got)
	}
}

// TestFormsNeedTheCSRFToken: a decision posted without the form's token,
// with another session's token, or from another origin is refused, and
// nothing is decided.
func TestFormsNeedTheCSRFToken(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	b := e.browser()
	b.signIn(alice)
	other := e.browser()
	other.signIn(bob)
	form, _ := b.decideForm("acme", "refund-1", url.Values{"decision": {"pending"}, "reason": {"looks absent"}})
	otherForm, _ := other.decideForm("acme", "refund-1", nil)
	for _, tc := range []struct {
		name string
		send func() page
	}{
		{"without the token", func() page {
			f := cloneValues(form)
			f.Del("csrf")
			return b.post("/console/t/acme/decide/refund-1", f)
		}},
		{"with another session's token", func() page {
			f := cloneValues(form)
			f.Set("csrf", otherForm.Get("csrf"))
			return b.post("/console/t/acme/decide/refund-1", f)
		}},
		{"from another origin", func() page {
			req, _ := http.NewRequest(http.MethodPost, e.web.URL+"/console/t/acme/decide/refund-1", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", "https://evil.example")
			req.Header.Set("Sec-Fetch-Site", "cross-site")
			return b.do(req)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.send()
			if p.code != http.StatusForbidden || !strings.Contains(p.body, "Refused") {
				t.Errorf("decide %s: %d, want 403 Refused:\n%s", tc.name, p.code, p.body)
			}
			if got := e.get("acme", "refund-1").GetState(); got != intentv1.State_STATE_UNKNOWN {
				t.Errorf("after the refused form: %v, want UNKNOWN", got)
			}
		})
	}
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// TestTwoReviewersDecideAtOnce: alice and bob open the same intent and
// decide at the same moment. One decision is recorded; the other reviewer
// is told plainly that someone else decided first, and what.
func TestTwoReviewersDecideAtOnce(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	ba, bb := e.browser(), e.browser()
	ba.signIn(alice)
	bb.signIn(bob)
	fa, _ := ba.decideForm("acme", "refund-1", url.Values{"decision": {"pending"}, "reason": {"alice: no refund at the provider"}})
	fb, _ := bb.decideForm("acme", "refund-1", url.Values{"decision": {"cancelled"}, "reason": {"bob: customer withdrew"}})
	var pa, pb page
	var wg sync.WaitGroup
	start := make(chan struct{})
	wg.Go(func() { <-start; pa = ba.post("/console/t/acme/decide/refund-1", fa) })
	wg.Go(func() { <-start; pb = bb.post("/console/t/acme/decide/refund-1", fb) })
	close(start)
	wg.Wait()
	codes := []int{pa.code, pb.code}
	won, lost := pa, pb
	winner := "alice"
	if pb.code == http.StatusSeeOther {
		won, lost, winner = pb, pa, "bob"
	}
	if won.code != http.StatusSeeOther || lost.code != http.StatusConflict {
		t.Fatalf("two decisions at once: codes %v, want one 303 and one 409", codes)
	}
	contains(t, "the losing reviewer's page", lost, "Not recorded: someone else decided first", "The decision that stands", "by <strong>"+winner+"</strong>")
	in := e.get("acme", "refund-1")
	n := 0
	for _, h := range in.GetHistory() {
		if h.GetKind() == intentv1.HistoryEntry_KIND_RESOLVED {
			n++
			if h.GetPrincipal() != winner {
				t.Errorf("recorded decision by %q, want %q", h.GetPrincipal(), winner)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d decisions recorded, want 1", n)
	}
}

// TestDevModeSaysItIsUnauthenticated: without a tokens file there is no
// sign-in, every page says authentication is off, and a decision asks for
// the reviewer's name and records it.
func TestDevModeSaysItIsUnauthenticated(t *testing.T) {
	e := newEnv(t, false)
	e.unknown("default", "refund-1", refund)
	b := e.browser()
	q := b.follow("/console/")
	contains(t, "dev queue", q, "Authentication is off.", ">refund-1<", "anonymous")
	if p := b.get("/console/signin"); p.code != http.StatusSeeOther {
		t.Errorf("sign-in page without authentication: %d, want a redirect", p.code)
	}
	form, p := b.decideForm("default", "refund-1", url.Values{"decision": {"pending"}, "reason": {"confirmed absent"}})
	contains(t, "dev intent page", p, "Your name")
	if r := b.post("/console/t/default/decide/refund-1", form); r.code != http.StatusUnprocessableEntity || !strings.Contains(r.body, "say who you are") {
		t.Errorf("dev decision without a name: %d, want 422 asking for it", r.code)
	}
	form.Set("actor", "dana")
	if r := b.post("/console/t/default/decide/refund-1", form); r.code != http.StatusSeeOther {
		t.Fatalf("dev decision: %d:\n%s", r.code, r.body)
	}
	h := e.get("default", "refund-1").GetHistory()
	if last := h[len(h)-1]; last.GetPrincipal() != "dana" || last.GetChannel() != console.Channel {
		t.Errorf("dev decision recorded by %q via %q, want dana via console", last.GetPrincipal(), last.GetChannel())
	}
}

// TestLiveCountFollowsWatch reads the queue page's event stream: it
// starts at the queue's size and follows intents entering and leaving it.
func TestLiveCountFollowsWatch(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	b := e.browser()
	b.signIn(alice)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.web.URL+"/console/t/acme/live", nil)
	resp, err := b.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("live: Content-Type %q", ct)
	}
	lines := bufio.NewScanner(resp.Body)
	next := func() string {
		t.Helper()
		for lines.Scan() {
			if l := lines.Text(); strings.HasPrefix(l, "data: ") {
				return strings.TrimPrefix(l, "data: ")
			}
		}
		t.Fatalf("live stream ended: %v", lines.Err())
		return ""
	}
	if got := next(); got != `{"count":1}` {
		t.Errorf("first count %s, want 1", got)
	}
	e.unknown("acme", "refund-2", refund)
	if got := next(); got != `{"count":2}` {
		t.Errorf("after a second UNKNOWN: %s, want 2", got)
	}
	if _, err := e.api.Resolve(e.ctx(alice), &intentv1.ResolveRequest{Tenant: "acme", Key: "refund-1", Decision: intentv1.Decision_DECISION_PENDING, Actor: "alice", Reason: "absent", RequestId: "r-1"}); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != `{"count":1}` {
		t.Errorf("after a decision: %s, want 1", got)
	}
}

// TestOverviewCountsRefusalsAndUnknowns: the overview counts intents by
// state, lists a stale-token refusal, and charts the unknown outcome.
func TestOverviewCountsRefusalsAndUnknowns(t *testing.T) {
	e := newEnv(t, true)
	s := e.unknown("acme", "refund-1", refund)
	e.unknown("globex", "refund-g", refund)
	if _, err := e.api.Acquire(e.ctx(worker), &intentv1.AcquireRequest{Tenant: "acme", Key: "refund-1", SessionId: s.session, RequestId: "reconcile-1"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.api.Complete(e.ctx(worker), &intentv1.CompleteRequest{Tenant: "acme", Key: "refund-1", Token: s.token, Result: &intentv1.Result{ExternalRefs: map[string]string{"refund_id": "re_9"}}})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("stale Complete: %v", err)
	}
	b := e.browser()
	b.signIn(alice)
	p := b.get("/console/t/acme/overview")
	contains(t, "overview", p, "Intents by state", `<span class="n">1</span> <span class="badge state-in-progress">IN_PROGRESS</span>`,
		"STALE_TOKEN", "token "+itoa(s.token)+" is superseded", ">refund-1<", "Total 2", "<svg")
	if strings.Contains(p.body, "refund-g") {
		t.Errorf("acme's overview shows globex's intent")
	}
}

// TestUnknownPathsAreNotFound: the console answers its own not-found page
// under /console/, and a key with '/' in it routes to its intent.
func TestUnknownPathsAreNotFound(t *testing.T) {
	e := newEnv(t, false)
	e.unknown("default", "orders/2026/refund-1", refund)
	b := e.browser()
	if p := b.follow("/console/nope"); p.code != http.StatusNotFound {
		t.Errorf("/console/nope: %d, want 404", p.code)
	}
	p := b.follow("/console/t/default/intents/orders/2026/refund-1")
	if p.code != http.StatusOK {
		t.Fatalf("intent with '/' in its key: %d", p.code)
	}
	contains(t, "slashed key", p, "orders/2026/refund-1", `action="/console/t/default/decide/orders/2026/refund-1"`)
	if s := b.get("/console/static/console.css"); s.code != http.StatusOK || !strings.Contains(s.h.Get("Content-Type"), "text/css") {
		t.Errorf("stylesheet: %d %q", s.code, s.h.Get("Content-Type"))
	}
}
