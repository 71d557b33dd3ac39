package console_test

import (
	"bufio"
	"context"
	"html"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/console"
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
// the UNKNOWN and NEEDS_REVIEW ones oldest first, with age, what each is
// in the approver's words (summary, action and identity), the approved
// params as they are (no amount or action guessed from field names or a
// key's prefix), labels and why each is there; a derived key is shown
// shortened; its filters and paging work.
func TestQueueShowsWhatWaits(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	e.unknown("acme", "refund-2", map[string]any{"amount": "12.50", "currency": "USD"})
	s := e.unknown("acme", "purchase-lamp", map[string]any{"item": "desk lamp", "max_amount": "89.00", "currency": "EUR"})
	described := e.unknown("acme", "", map[string]any{"amount": "40.00", "currency": "USD", "max_eur": 37}, func(r *intentv1.RegisterRequest) {
		r.Action = "refund.issue"
		r.Identity = mustStruct(t, map[string]any{"order_id": "ORD-88412", "return_id": "RA-20931"})
		r.Summary = "Refund 40.00 USD to Alice for ORD-88412"
	})
	if len(described.key) != 64 {
		t.Fatalf("derived key %q, want 64 hex digits", described.key)
	}
	// No summary: the action and identity are what the link says.
	unsummed := e.unknown("acme", "", map[string]any{"amount": "5.00"}, func(r *intentv1.RegisterRequest) {
		r.Action = "refund.issue"
		r.Identity = mustStruct(t, map[string]any{"order_id": "ORD-1"})
	})
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
	contains(t, "queue", q, "refund-1", "refund-2", "purchase-lamp", `<span class="label"><bdi>customer</bdi>=<bdi>c-17</bdi></span>`,
		// The params as they are.
		`<bdi>amount_cents</bdi> <bdi>8900</bdi>`, `<bdi>amount</bdi> <bdi>12.50</bdi>`, `<bdi>max_amount</bdi> <bdi>89.00</bdi>`, `<bdi>max_eur</bdi> <bdi>37</bdi>`,
		// What the approver said it is, leading the row.
		`<a href="`+html.EscapeString(intentURL("acme", described.key))+`" class="intent-link"><span class="summary"><bdi>Refund 40.00 USD to Alice for ORD-88412</bdi></span></a>`,
		`<span class="action"><bdi>refund.issue</bdi></span> · <span class="identity"><bdi>order_id</bdi> <bdi>ORD-88412</bdi></span> · <span class="identity"><bdi>return_id</bdi> <bdi>RA-20931</bdi></span>`,
		`<a href="`+html.EscapeString(intentURL("acme", unsummed.key))+`" class="intent-link"><span class="action"><bdi>refund.issue</bdi></span> · <span class="identity"><bdi>order_id</bdi> <bdi>ORD-1</bdi></span></a>`,
		// The derived key, shortened, whole in its title.
		`<bdi class="key" title="`+described.key+`">`+described.key[:12]+"…"+described.key[58:]+`</bdi>`,
		"Timeout: <bdi>worker-a</bdi> could not tell whether its call took effect: <bdi>payment provider timed out</bdi>",
		"Escalated by <bdi>worker-svc (as reconciler-1)</bdi>: <bdi>merchant shows two orders</bdi>", ">UNKNOWN<", ">NEEDS_REVIEW<")
	// Nothing guessed: no amount made of field names, no action made of
	// a key's first word, no derived key shown whole as text.
	for _, guess := range []string{"89.00 EUR", "12.50 USD", "40.00 USD<", ">refund<", ">purchase<", ">" + described.key + "<"} {
		if strings.Contains(q.body, guess) {
			t.Errorf("queue shows the guess %q", guess)
		}
	}
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
	p := b.get(intentURL("acme", "refund-1"))
	contains(t, "intent page", p, "What was approved", "<dt><bdi>amount_cents</bdi></dt><dd><bdi>8900</bdi></dd>", "<bdi>SO-1042</bdi>",
		"Registered", "Lease issued (execute)", "Marked unknown", "Lease issued (reconcile)",
		"Reported completed — stale, changed nothing", ">STALE<", "<bdi>refund_id</bdi>=<bdi>re_9</bdi>", "“<bdi>provider still silent</bdi>”", "Record decision",
		// What the workers reported, newest first, and what the provider
		// said: the stale report's reference is evidence.
		"What the worker reported", "What the provider said", "<dt><bdi>refund_id</bdi></dt><dd><code class=\"wrap\"><bdi>re_9</bdi></code></dd>",
		"Reported by <bdi>worker-svc</bdi> under a superseded lease: kept as evidence, it changed nothing.",
		// The mechanics are there, under a disclosure.
		`<details class="mechanics card">`, "Current token", "Fingerprint", "Lease holder", "Revision")
	reported := p.body[strings.Index(p.body, "What the worker reported"):strings.Index(p.body, "What the provider said")]
	if i, j := strings.Index(reported, "provider still silent"), strings.Index(reported, "payment provider timed out"); i < 0 || j < 0 || i > j {
		t.Errorf("the workers' reports are not newest first:\n%s", reported)
	}
	if i, j := strings.Index(p.body, "<details class=\"mechanics"), strings.Index(p.body, "Current token"); j < i {
		t.Errorf("the current token shows before the mechanics' disclosure")
	}
	for _, word := range []string{"Approved terms", "Lease and token", "Payload 0 bytes"} {
		if strings.Contains(p.body, word) {
			t.Errorf("intent page still says %q", word)
		}
	}
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
	d := b.post(decideURL("acme", "refund-1"), form)
	if d.code != http.StatusSeeOther {
		t.Fatalf("decide: %d, want 303:\n%s", d.code, d.body)
	}
	if want := intentURL("acme", "refund-1"); d.h.Get("Location") != want {
		t.Errorf("decide redirects to %q, want the intent's page %q", d.h.Get("Location"), want)
	}
	after := b.follow(d.h.Get("Location"))
	contains(t, "intent after deciding", after, "Decided: COMPLETED, recorded as alice via the console.", "Decided by a reviewer: COMPLETED", "via console",
		// The reviewer decided; no worker holds the intent.
		`id="decided-by">Decided by <strong><bdi>alice</bdi></strong> via console`, "<dt>Decided by</dt><dd><bdi>alice</bdi></dd>",
		"<dt><bdi>refund_id</bdi></dt><dd><code class=\"wrap\"><bdi>re_123</bdi></code></dd>", "The intent&#39;s result, as recorded.")
	if strings.Contains(after.body, "Lease holder") || strings.Contains(after.body, "Holder") {
		t.Errorf("after a reviewer's decision the page names a lease holder:\n%s", after.body)
	}

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
	again := b.post(decideURL("acme", "refund-1"), form)
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
			p := b.post(decideURL("acme", "refund-1"), form)
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
	d := b.post(decideURL("acme", "refund-1"), form)
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
	missing := b.get(intentURL("acme", "no-such-intent"))
	if missing.code != http.StatusNotFound {
		t.Fatalf("missing intent: %d, want 404", missing.code)
	}
	mainOf := func(p page) string {
		_, m, _ := strings.Cut(p.body, "<main")
		m, _, _ = strings.Cut(m, "</main>")
		return m
	}
	for _, path := range []string{intentURL("globex", "refund-g"), "/console/t/globex/queue", "/console/t/globex/overview", "/console/t/globex/live"} {
		p := b.get(path)
		if p.code != http.StatusNotFound || mainOf(p) != mainOf(missing) || strings.Contains(p.body, "refund-g") {
			t.Errorf("GET %s as alice (acme): %d, want the not-found page of a missing intent:\n%s\nwant:\n%s", path, p.code, mainOf(p), mainOf(missing))
		}
	}
	d := b.post(decideURL("globex", "refund-g"), url.Values{"csrf": {q.field(t, "csrf")}, "decision": {"cancelled"}, "reason": {"x"}, "request_id": {"r1"}})
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
			return b.post(decideURL("acme", "refund-1"), f)
		}},
		{"with another session's token", func() page {
			f := cloneValues(form)
			f.Set("csrf", otherForm.Get("csrf"))
			return b.post(decideURL("acme", "refund-1"), f)
		}},
		{"from another origin", func() page {
			req, _ := http.NewRequest(http.MethodPost, e.web.URL+decideURL("acme", "refund-1"), strings.NewReader(form.Encode()))
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
	wg.Go(func() { <-start; pa = ba.post(decideURL("acme", "refund-1"), fa) })
	wg.Go(func() { <-start; pb = bb.post(decideURL("acme", "refund-1"), fb) })
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
	contains(t, "the losing reviewer's page", lost, "Not recorded: someone else decided first", "The decision that stands", "by <strong><bdi>"+winner+"</bdi></strong>")
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
	if r := b.post(decideURL("default", "refund-1"), form); r.code != http.StatusUnprocessableEntity || !strings.Contains(r.body, "say who you are") {
		t.Errorf("dev decision without a name: %d, want 422 asking for it", r.code)
	}
	form.Set("actor", "dana")
	if r := b.post(decideURL("default", "refund-1"), form); r.code != http.StatusSeeOther {
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

// TestUnknownPathsAreNotFound: the console answers its own not-found
// page under /console/, and also where a key was once put in the path
// (intents/..., decide/...): such a path names no intent, whatever it
// holds. A key with '/' in it opens from its query.
func TestUnknownPathsAreNotFound(t *testing.T) {
	e := newEnv(t, false)
	e.unknown("default", "orders/2026/refund-1", refund)
	e.unknown("default", "refund-1", refund)
	b := e.browser()
	for _, path := range []string{"/console/nope", "/console/t/default/intents/refund-1", "/console/t/default/intents/orders/2026/refund-1", "/console/t/default/intent/refund-1"} {
		if p := b.follow(path); p.code != http.StatusNotFound || !strings.Contains(p.body, "Not found") || strings.Contains(p.body, "Record decision") {
			t.Errorf("%s: %d, want the console's 404 page:\n%s", path, p.code, p.body)
		}
	}
	form, _ := b.decideForm("default", "refund-1", url.Values{"decision": {"pending"}, "reason": {"absent"}, "actor": {"dana"}})
	if p := b.post("/console/t/default/decide/refund-1", form); p.code != http.StatusNotFound {
		t.Errorf("POST to the old decide path: %d, want 404", p.code)
	}
	if got := e.get("default", "refund-1").GetState(); got != intentv1.State_STATE_UNKNOWN {
		t.Errorf("after posting to the old decide path: %v, want UNKNOWN", got)
	}
	p := b.follow(intentURL("default", "orders/2026/refund-1"))
	if p.code != http.StatusOK {
		t.Fatalf("intent with '/' in its key: %d", p.code)
	}
	contains(t, "slashed key", p, `id="intent-key"><bdi>orders/2026/refund-1</bdi>`, `action="/console/t/default/decide?key=orders%2F2026%2Frefund-1"`)
	if s := b.get("/console/static/console.css"); s.code != http.StatusOK || !strings.Contains(s.h.Get("Content-Type"), "text/css") {
		t.Errorf("stylesheet: %d %q", s.code, s.h.Get("Content-Type"))
	}
}

// TestConsoleRolesAtSignIn: the sign-in page says which roles may use the
// console; a token whose roles may not (worker, approver) is refused there
// with that sentence and no session is stored; reader, reviewer and admin
// sign in. A principal whose roles the tokens file takes away is signed
// out with the same sentence, not sent to a PERMISSION_DENIED page.
func TestConsoleRolesAtSignIn(t *testing.T) {
	var store console.SessionStore
	e := newEnv(t, true, func(c *console.Config) { store = c.Sessions })
	count := func() int64 {
		t.Helper()
		n, err := store.Count(e.ctx(ops))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	const sentence = "The console is for the reviewer role (read and decide), the reader role (read only) and the admin role; a token with only the approver or worker role cannot use it."
	for _, tc := range []struct {
		m  member
		ok bool
	}{
		{worker, false},
		{member{"appr", []string{"acme"}, []access.Role{access.RoleApprover}, "tok-appr"}, false},
		{rita, true},
		{alice, true},
		{ops, true},
	} {
		t.Run(tc.m.name, func(t *testing.T) {
			dir := directory(t, alice, rita, ops, worker)
			if !slices.ContainsFunc([]member{alice, rita, ops, worker}, func(m member) bool { return m.name == tc.m.name }) {
				dir = directory(t, alice, rita, ops, worker, tc.m)
			}
			e.dirMu.Lock()
			e.dir = dir
			e.dirMu.Unlock()
			b := e.browser()
			form := b.get("/console/signin")
			contains(t, "sign-in page", form, `<p id="who-may-use">`+html.EscapeString(sentence)+`</p>`)
			before := count()
			p := b.post("/console/signin", url.Values{"csrf": {form.field(t, "csrf")}, "token": {tc.m.token}})
			if !tc.ok {
				if p.code != http.StatusForbidden {
					t.Fatalf("sign in as %s: %d, want 403 on the sign-in page:\n%s", tc.m.name, p.code, p.body)
				}
				contains(t, "refused sign-in", p, `id="signin-error">That token may not use the console. `+html.EscapeString(sentence), `<input id="token"`)
				if strings.Contains(p.body, "PERMISSION_DENIED") || strings.Contains(p.body, "Signed in as") {
					t.Errorf("refused sign-in shows a signed-in page or a raw refusal:\n%s", p.body)
				}
				if n := count(); n != before {
					t.Errorf("sessions stored: %d before, %d after a refused sign-in", before, n)
				}
				if q := b.get("/console/t/acme/queue"); q.code != http.StatusSeeOther || !strings.HasPrefix(q.h.Get("Location"), "/console/signin") {
					t.Errorf("queue after a refused sign-in: %d %q, want 303 to sign-in", q.code, q.h.Get("Location"))
				}
				return
			}
			if p.code != http.StatusSeeOther {
				t.Fatalf("sign in as %s: %d, want 303:\n%s", tc.m.name, p.code, p.body)
			}
			if n := count(); n != before+1 {
				t.Errorf("sessions stored: %d before, %d after signing in, want one more", before, n)
			}
			if q := b.follow(p.h.Get("Location")); q.code != http.StatusOK || !strings.Contains(q.body, "Review queue") {
				t.Errorf("%s's queue: %d:\n%s", tc.m.name, q.code, q.body)
			}
		})
	}

	// Roles taken away after signing in: signed out, told why.
	b := e.browser()
	b.signIn(alice)
	dir := directory(t, member{alice.name, alice.tenants, []access.Role{access.RoleWorker}, alice.token}, ops, worker)
	e.dirMu.Lock()
	e.dir = dir
	e.dirMu.Unlock()
	p := b.get("/console/t/acme/queue")
	if p.code != http.StatusForbidden {
		t.Fatalf("queue once alice is only a worker: %d, want 403:\n%s", p.code, p.body)
	}
	contains(t, "roles taken away", p, "Signed out: your roles do not allow the console", html.EscapeString(sentence))
	if strings.Contains(p.body, "PERMISSION_DENIED") || strings.Contains(p.body, "Back to the review queue") {
		t.Errorf("roles taken away: a raw refusal, or a link back to it:\n%s", p.body)
	}
	if q := b.get("/console/t/acme/queue"); q.code != http.StatusSeeOther {
		t.Errorf("queue after being signed out for roles: %d, want 303 to sign-in", q.code)
	}
}

// TestProblemPagesOfferSignOut: signed in, every problem page (not found,
// an intent not found, not allowed, a refused form) still offers signing
// out.
func TestProblemPagesOfferSignOut(t *testing.T) {
	e := newEnv(t, true)
	e.unknown("acme", "refund-1", refund)
	b := e.browser()
	b.signIn(rita)
	form, _ := b.decideForm("acme", "refund-1", url.Values{"decision": {"pending"}, "reason": {"absent"}})
	noCSRF := cloneValues(form)
	noCSRF.Del("csrf")
	for name, p := range map[string]page{
		"no such page":             b.get("/console/nope"),
		"an old key path":          b.get("/console/t/acme/intents/refund-1"),
		"no such intent":           b.get(intentURL("acme", "no-such")),
		"another tenant":           b.get("/console/t/globex/queue"),
		"not allowed":              b.post(decideURL("acme", "refund-1"), form),
		"a form without its token": b.post(decideURL("acme", "refund-1"), noCSRF),
	} {
		if p.code < 400 || !strings.Contains(p.body, `<h1 id="problem">`) {
			t.Errorf("%s: %d, want a problem page:\n%s", name, p.code, p.body)
		}
		contains(t, name, p, `<form method="post" action="/console/signout">`, "Signed in as <strong>rita</strong>")
	}
}

// TestNextSurvivesSignIn: a signed-out reviewer who opens an intent's URL
// (its key one a path would normalise into another's) signs in and lands
// on exactly that intent, not the one its normalised form names.
func TestNextSurvivesSignIn(t *testing.T) {
	e := newEnv(t, true)
	const key, other = "dots-1/../javascript:alert-3-1+a=b@c", "javascript:alert-3-1+a=b@c"
	e.unknown("acme", key, refund)
	e.unknown("acme", other, refund)
	b := e.browser()
	first := b.get(intentURL("acme", key))
	if first.code != http.StatusSeeOther || !strings.HasPrefix(first.h.Get("Location"), "/console/signin?next=") {
		t.Fatalf("signed out: %d %q, want 303 to sign-in with next", first.code, first.h.Get("Location"))
	}
	form := b.get(first.h.Get("Location"))
	next := html.UnescapeString(form.field(t, "next"))
	if next != intentURL("acme", key) {
		t.Errorf("the sign-in form's next is %q, want %q", next, intentURL("acme", key))
	}
	p := b.post("/console/signin", url.Values{"csrf": {form.field(t, "csrf")}, "token": {alice.token}, "next": {next}})
	if p.code != http.StatusSeeOther || p.h.Get("Location") != intentURL("acme", key) {
		t.Fatalf("sign in: %d %q, want 303 to %q", p.code, p.h.Get("Location"), intentURL("acme", key))
	}
	in := b.get(p.h.Get("Location"))
	contains(t, "intent after sign-in", in, `id="intent-key"><bdi>`+html.EscapeString(key)+`</bdi>`, `action="`+html.EscapeString(decideURL("acme", key))+`"`)
	// Elsewhere than the console, next is not followed.
	for _, bad := range []string{"//evil.example/", "https://evil.example/console/", "/console/../evil"} {
		b := e.browser()
		form := b.get("/console/signin?next=" + url.QueryEscape(bad))
		p := b.post("/console/signin", url.Values{"csrf": {form.field(t, "csrf")}, "token": {alice.token}, "next": {bad}})
		if p.code != http.StatusSeeOther || p.h.Get("Location") != "/console/t/acme/queue" {
			t.Errorf("sign in with next %q: %d %q, want the queue", bad, p.code, p.h.Get("Location"))
		}
	}
}

// TestOverviewTiers: admins see where the cluster keeps its intents —
// etcd's final intents and database, the archive's rows, size, state and
// filter — as the daemon's Tiers says; a tenant's reviewer does not (the
// figures are across tenants), and without an archive its row is absent.
func TestOverviewTiers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tiers     console.Tiers
		who       member
		want, not []string
	}{
		{"with an archive, admin", console.Tiers{EtcdFinal: 1234, EtcdSize: 64 << 20, EtcdInUse: 20 << 20, EtcdQuota: 2 << 30,
			Archive: &console.ArchiveTier{Intents: 10_000_000, Tombstones: 2_500_000, Bytes: 12 << 30, Moved: 4321, Lag: 90 * time.Second, FilterReady: true, FilterKeys: 12_500_000}}, ops,
			[]string{"Where intents are kept", "1,234 final intents not moved yet", "20 MiB in use of a 64 MiB file, quota 2.0 GiB (3 % used)",
				"10,000,000 finished intents, 2,500,000 tombstones", "12 GiB", "answering, 4,321 moved by this replica", "archive lag: 1m30s behind --archive-after",
				"ready, 12,500,000 keys"}, []string{"NOT ANSWERING", "--archive-dsn"}},
		{"the archive down, filter loading", console.Tiers{Archive: &console.ArchiveTier{Unavailable: true}}, ops,
			[]string{"NOT ANSWERING", "ARCHIVE_UNAVAILABLE", "loading: new keys ask PostgreSQL", "not measured yet", "none overdue"}, []string{"answering,"}},
		{"without an archive", console.Tiers{EtcdFinal: 7, EtcdSize: 1 << 20, EtcdInUse: 1 << 19}, ops,
			[]string{"7 final intents, besides", "no archive configured", "--archive-dsn"}, []string{"archive (PostgreSQL)", "not moved yet"}},
		{"a tenant's reviewer", console.Tiers{EtcdFinal: 1234}, alice, nil, []string{"Where intents are kept", "1,234"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, true, func(c *console.Config) { c.Tiers = func() console.Tiers { return tc.tiers } })
			b := e.browser()
			b.signIn(tc.who)
			p := b.get("/console/t/acme/overview")
			contains(t, "overview", p, tc.want...)
			for _, s := range tc.not {
				if strings.Contains(p.body, s) {
					t.Errorf("the overview says %q:\n%s", s, p.body)
				}
			}
		})
	}
	e := newEnv(t, false)
	if p := e.browser().get("/console/t/default/overview"); strings.Contains(p.body, "Where intents are kept") {
		t.Error("an overview without Config.Tiers shows the storage section")
	}
}
