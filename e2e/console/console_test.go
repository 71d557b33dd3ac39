// Package console holds the review console's browser tests: a headless
// Chromium (Debian's chromium package, driven over the DevTools protocol
// by chromedp) against the built intentd, signed in with the tokens file's
// principals. Screenshots of every step are kept in $CONSOLE_ARTIFACTS
// (default: artifacts/console at the repository's root).
package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
)

// TestMain builds cmd/intentd once (see harness.Main).
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Want{}, nil))
}

// member is a principal of the tokens file.
type member struct {
	name    string
	tenants []string
	roles   []access.Role
	token   string
}

var (
	alice  = member{"alice", []string{"acme"}, []access.Role{access.RoleReviewer}, "e2e-alice-token"}
	bob    = member{"bob", []string{"acme"}, []access.Role{access.RoleReviewer}, "e2e-bob-token"}
	rita   = member{"rita", []string{"acme"}, []access.Role{access.RoleReader}, "e2e-rita-token"}
	worker = member{"worker-svc", []string{"acme", "globex"}, []access.Role{access.RoleWorker, access.RoleApprover}, "e2e-worker-token"}
)

// world is one intentd with a tokens file, its console's URL, and an API
// client.
type world struct {
	t       *testing.T
	console string
	api     intentv1.IntentServiceClient
	shots   string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	bins := harness.Bins(t)
	browserPath(t)
	var f access.File
	for _, m := range []member{alice, bob, rita, worker} {
		f.Principals = append(f.Principals, access.Entry{Name: m.name, Tenants: m.tenants, Roles: m.roles, TokenSHA256: []string{access.HashToken(m.token)}})
	}
	b, _ := json.Marshal(f)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(tokens, b, 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", port)
	d := harness.StartIntentd(t, bins, "intentd", harness.IntentdConfig{Flags: []string{"--tokens-file", tokens, "--metrics-listen", httpAddr}})
	conn, err := harness.Dial(d.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &world{t: t, console: "http://" + httpAddr + "/console/", api: intentv1.NewIntentServiceClient(conn), shots: artifacts(t)}
}

// artifacts is where screenshots go: $CONSOLE_ARTIFACTS, else
// artifacts/console at the repository's root; kept after the test.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CONSOLE_ARTIFACTS")
	if dir == "" {
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "artifacts", "console")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browserPath finds Debian's chromium (scripts/install-tools.sh installs
// it). Missing, the test fails in CI and is skipped elsewhere.
func browserPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chromium missing in CI: scripts/install-tools.sh must install it: %v", err)
		}
		t.Skip("chromium not installed; run ./scripts/install-tools.sh as root")
	}
	return p
}

func (w *world) ctx(m member) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	w.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.token)
}

// unknown leaves key UNKNOWN in tenant, as a worker whose payment call
// timed out does; it returns the worker's session. Each of also changes
// the registration first (a summary, labels; an empty key with an
// identity is derived: unknownKey returns it).
func (w *world) unknown(tenant, key string, also ...func(*intentv1.RegisterRequest)) string {
	w.t.Helper()
	_, session := w.unknownKey(tenant, key, also...)
	return session
}

// unknownKey is unknown returning the registered key too.
func (w *world) unknownKey(tenant, key string, also ...func(*intentv1.RegisterRequest)) (string, string) {
	w.t.Helper()
	ctx := w.ctx(worker)
	p, _ := structpb.NewStruct(map[string]any{"order": "SO-1042", "amount_cents": 8900, "currency": "EUR"})
	req := &intentv1.RegisterRequest{Tenant: tenant, Key: key, Params: p, Labels: map[string]string{"customer": "c-17"}}
	for _, f := range also {
		f(req)
	}
	reg, err := w.api.Register(ctx, req)
	if err != nil {
		w.t.Fatalf("Register(%s): %v", key, err)
	}
	key = reg.GetIntent().GetKey()
	s, err := w.api.OpenSession(ctx, &intentv1.OpenSessionRequest{Tenant: tenant, Worker: "worker-a"})
	if err != nil {
		w.t.Fatalf("OpenSession: %v", err)
	}
	a, err := w.api.Acquire(ctx, &intentv1.AcquireRequest{Tenant: tenant, Key: key, SessionId: s.GetSessionId(), RequestId: key + "-1"})
	if err != nil {
		w.t.Fatalf("Acquire(%s): %v", key, err)
	}
	if _, err := w.api.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Tenant: tenant, Key: key, Token: a.GetLease().GetToken(), Reason: "payment provider timed out"}); err != nil {
		w.t.Fatalf("MarkUnknown(%s): %v", key, err)
	}
	return key, s.GetSessionId()
}

// intentPath is the console's page of key, as the console links it: the
// key in the query.
func intentPath(tenant, key string) string {
	return "/console/t/" + tenant + "/intent?key=" + url.QueryEscape(key)
}

func (w *world) state(tenant, key string) intentv1.State {
	w.t.Helper()
	resp, err := w.api.Get(w.ctx(alice), &intentv1.GetRequest{Tenant: tenant, Key: key})
	if err != nil {
		w.t.Fatalf("Get(%s): %v", key, err)
	}
	return resp.GetIntent().GetState()
}

// browser is one headless Chromium, laptop-sized (1366×900), with a fresh
// profile; person opens an isolated context in it (its own cookies).
type browser struct {
	t   *testing.T
	w   *world
	ctx context.Context
}

func (w *world) browser() *browser {
	w.t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserPath(w.t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(w.t.TempDir()),
		chromedp.WindowSize(1366, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	w.t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		w.t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: w.t, w: w, ctx: ctx}
}

// person is one reviewer's window: an isolated browser context.
type person struct {
	t    *testing.T
	w    *world
	name string
	ctx  context.Context
}

func (b *browser) person(name string) *person { return b.personFor(name, 60*time.Second) }

// personFor is person for a test that takes longer than a minute.
func (b *browser) personFor(name string, d time.Duration) *person {
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	ctx, cancelTimeout := context.WithTimeout(ctx, d)
	b.t.Cleanup(func() { cancelTimeout(); cancel() })
	return &person{t: b.t, w: b.w, name: name, ctx: ctx}
}

func (p *person) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		p.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
		p.t.Fatalf("%s, %s: %v", p.name, what, err)
	}
}

// poll waits until the JavaScript expression is true.
func (p *person) poll(what, expr string) {
	p.t.Helper()
	if _, err := chromedp.Run(p.ctx, chromedp.Poll[bool](expr)); err != nil {
		p.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
		p.t.Fatalf("%s, %s: %v", p.name, what, err)
	}
}

func (p *person) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		p.t.Fatalf("%s: text of %s: %v", p.name, sel, err)
	}
	return s
}

// accessible checks what a keyboard or screen-reader user relies on in
// the current page: a language, one h1, a label for every control, a name
// for every chart, and the skip link first in the tab order.
func (p *person) accessible(what string) {
	p.t.Helper()
	problems, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]string](`(() => {
		const out = [];
		if (!document.documentElement.lang) out.push("no lang on <html>");
		if (document.querySelectorAll("h1").length !== 1) out.push(document.querySelectorAll("h1").length + " h1 elements");
		for (const el of document.querySelectorAll("input:not([type=hidden]), select, textarea")) {
			if (el.labels.length === 0 && !el.getAttribute("aria-label")) out.push("no label for " + (el.id || el.name));
		}
		for (const svg of document.querySelectorAll("svg")) {
			if (svg.getAttribute("role") !== "img" || !svg.querySelector("title")) out.push("svg without role=img and a title");
		}
		const first = document.querySelector("a[href], button, input:not([type=hidden]), select, textarea");
		if (!first || !first.classList.contains("skip")) out.push("the skip link is not first in the tab order");
		return out;
	})()`))
	if err != nil {
		p.t.Fatalf("%s: accessibility checks on %s: %v", p.name, what, err)
	}
	for _, pr := range problems {
		p.t.Errorf("%s page: %s", what, pr)
	}
}

// shot saves a full-page screenshot as <test>-<name>.png.
func (p *person) shot(name string) {
	p.t.Helper()
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Errorf("%s: screenshot %s: %v", p.name, name, err)
		return
	}
	path := filepath.Join(p.w.shots, p.t.Name()+"-"+name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Errorf("write %s: %v", path, err)
		return
	}
	p.t.Logf("screenshot %s", path)
}

// signIn opens the console, is sent to the sign-in page, and signs in.
func (p *person) signIn(m member) {
	p.t.Helper()
	p.do("open the console", chromedp.Navigate(p.w.console), chromedp.WaitVisible(chromedp.CSS("#token")))
	p.accessible("sign-in")
	p.shot("0-sign-in")
	p.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), m.token), chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS("div.who")))
	if who := p.text("div.who strong"); who != m.name {
		p.t.Fatalf("signed in as %q, want %q", who, m.name)
	}
}

func (p *person) open(path string, waitFor string) {
	p.t.Helper()
	p.do("open "+path, chromedp.Navigate(strings.TrimSuffix(p.w.console, "/console/")+path), chromedp.WaitVisible(chromedp.CSS(waitFor)))
}

// TestReviewerDecidesInTheBrowser: a reviewer signs in, finds the seeded
// UNKNOWN intent in the queue, opens it, reads its timeline, decides it
// completed with the provider's reference and a reason, sees it leave the
// queue (the live count drops to 0), and the original worker's next
// Acquire replays the decided result.
func TestReviewerDecidesInTheBrowser(t *testing.T) {
	w := newWorld(t)
	session := w.unknown("acme", "refund-1")
	p := w.browser().person("alice")
	p.signIn(alice)
	p.do("see the queue", chromedp.WaitVisible(chromedp.CSS(`table.queue a.intent-link`)))
	if got := p.text(`table.queue tbody tr`); !strings.Contains(got, "refund-1") || !strings.Contains(got, "payment provider timed out") || !strings.Contains(got, "amount_cents 8900") {
		t.Errorf("queue row %q, want refund-1 with its approved terms and why", got)
	}
	p.poll("live count 1", `document.getElementById("live-count").textContent === "1"`)
	p.accessible("queue")
	p.shot("1-queue")

	p.do("open the intent", chromedp.Click(chromedp.CSS(`table.queue a.intent-link`)), chromedp.WaitVisible(chromedp.CSS("ol.timeline")))
	timeline := p.text("ol.timeline")
	for _, want := range []string{"Registered", "Lease issued (execute)", "Marked unknown", "payment provider timed out"} {
		if !strings.Contains(timeline, want) {
			t.Errorf("timeline lacks %q:\n%s", want, timeline)
		}
	}
	p.accessible("intent")
	p.shot("2-intent")

	p.do("decide", chromedp.Click(chromedp.CSS("#d-completed")), chromedp.WaitVisible(chromedp.CSS("#ref-value")))
	p.do("fill the form",
		chromedp.SetValue(chromedp.CSS("#ref-name"), "refund_id"),
		chromedp.SendKeys(chromedp.CSS("#ref-value"), "re_123"),
		chromedp.SendKeys(chromedp.CSS("#reason"), "refund re_123 found in the provider dashboard"))
	p.shot("3-decide-form")
	p.do("record the decision", chromedp.Click(chromedp.CSS("section.decide button.primary")), chromedp.WaitVisible(chromedp.CSS(`.banner.ok`)))
	if got := p.text(".banner.ok"); !strings.Contains(got, "Decided: COMPLETED, recorded as alice via the console.") {
		t.Errorf("after deciding: %q", got)
	}
	if got := p.text("#intent-state"); got != "COMPLETED" {
		t.Errorf("state after deciding: %q, want COMPLETED", got)
	}
	if got := p.text("ol.timeline li:last-child"); !strings.Contains(got, "Decided by a reviewer: COMPLETED") || !strings.Contains(got, "alice via console") || !strings.Contains(got, "refund_id=re_123") {
		t.Errorf("last timeline entry %q, want alice's decision via console with refund_id re_123", got)
	}
	p.shot("4-decided")

	p.open("/console/t/acme/queue", "h1")
	p.do("empty queue", chromedp.WaitVisible(chromedp.CSS(".empty")))
	p.poll("live count 0", `document.getElementById("live-count").textContent === "0"`)
	p.shot("5-queue-empty")
	p.open("/console/t/acme/overview", "svg.chart")
	if got := strings.Join(strings.Fields(p.text("ul.counts")), " "); !strings.Contains(got, "1 COMPLETED") {
		t.Errorf("overview counts %q, want 1 COMPLETED", got)
	}
	p.accessible("overview")
	p.shot("6-overview")

	a, err := w.api.Acquire(w.ctx(worker), &intentv1.AcquireRequest{Tenant: "acme", Key: "refund-1", SessionId: session, RequestId: "after-review"})
	if err != nil || a.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED || a.GetIntent().GetResult().GetExternalRefs()["refund_id"] != "re_123" {
		t.Errorf("worker's next Acquire: %v %v result %v, want COMPLETED replaying refund_id re_123", a.GetOutcome(), err, a.GetIntent().GetResult())
	}
}

// TestReaderCannotDecideInTheBrowser: a reader sees the intent and its
// history, is told deciding needs the reviewer role, and has no button.
func TestReaderCannotDecideInTheBrowser(t *testing.T) {
	w := newWorld(t)
	w.unknown("acme", "refund-1")
	p := w.browser().person("rita")
	p.signIn(rita)
	p.open(intentPath("acme", "refund-1"), "#reader-note")
	if got := p.text("#reader-note"); !strings.Contains(got, "Deciding needs the reviewer or admin role") {
		t.Errorf("reader note %q", got)
	}
	n, err := chromedp.Run(p.ctx, chromedp.Evaluate[int](`document.querySelectorAll("section.decide button").length`))
	if err != nil || n != 0 {
		t.Errorf("decide buttons for a reader: %d (%v), want 0", n, err)
	}
	p.shot("reader")
}

// TestCrossTenantURLIsNotFoundInTheBrowser: a reviewer of acme who opens a
// globex intent's URL reads the same not-found page as for an intent that
// does not exist.
func TestCrossTenantURLIsNotFoundInTheBrowser(t *testing.T) {
	w := newWorld(t)
	w.unknown("globex", "refund-g")
	p := w.browser().person("alice")
	p.signIn(alice)
	p.open(intentPath("globex", "refund-g"), "h1")
	other := p.text("main")
	p.shot("cross-tenant")
	p.open(intentPath("acme", "no-such-intent"), "h1")
	if missing := p.text("main"); other != missing || !strings.Contains(other, "Not found") {
		t.Errorf("cross-tenant page %q, want the same as a missing intent's %q", other, missing)
	}
}

// TestFormWithoutCSRFTokenIsRefusedInTheBrowser: the decide form, its CSRF
// token removed in the page, is refused and nothing is decided.
func TestFormWithoutCSRFTokenIsRefusedInTheBrowser(t *testing.T) {
	w := newWorld(t)
	w.unknown("acme", "refund-1")
	p := w.browser().person("alice")
	p.signIn(alice)
	p.open(intentPath("acme", "refund-1"), "section.decide form")
	p.do("tamper and submit",
		chromedp.Click(chromedp.CSS("#d-pending")),
		chromedp.SendKeys(chromedp.CSS("#reason"), "no refund at the provider"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector("section.decide input[name=csrf]").remove()`),
		chromedp.Click(chromedp.CSS("section.decide button.primary")),
		chromedp.WaitVisible(chromedp.CSS("h1#problem")))
	if got := p.text("h1#problem"); !strings.Contains(got, "Refused") {
		t.Errorf("page after a form without its CSRF token: %q, want Refused", got)
	}
	p.shot("csrf-refused")
	if got := w.state("acme", "refund-1"); got != intentv1.State_STATE_UNKNOWN {
		t.Errorf("after the refused form: %v, want UNKNOWN", got)
	}
}

// TestTwoReviewersAtOnceInTheBrowser: alice and bob have the same intent
// open. Alice decides; bob's page says at once that the intent changed; bob
// decides anyway and is told plainly that someone else decided first, and
// what. One decision is recorded.
func TestTwoReviewersAtOnceInTheBrowser(t *testing.T) {
	w := newWorld(t)
	w.unknown("acme", "refund-1")
	b := w.browser()
	pa, pb := b.person("alice"), b.person("bob")
	pa.signIn(alice)
	pb.signIn(bob)
	for _, p := range []*person{pa, pb} {
		p.open(intentPath("acme", "refund-1"), "section.decide form")
	}
	pb.do("bob fills the form", chromedp.Click(chromedp.CSS("#d-cancelled")), chromedp.SendKeys(chromedp.CSS("#reason"), "customer withdrew"))
	pa.do("alice decides", chromedp.Click(chromedp.CSS("#d-pending")), chromedp.SendKeys(chromedp.CSS("#reason"), "no refund at the provider"),
		chromedp.Click(chromedp.CSS("section.decide button.primary")), chromedp.WaitVisible(chromedp.CSS(".banner.ok")))
	pb.do("bob is told the intent changed", chromedp.WaitVisible(chromedp.CSS("#intent-changed")))
	pb.shot("1-bob-told-it-changed")
	pb.do("bob decides anyway", chromedp.Click(chromedp.CSS("section.decide button.primary")), chromedp.WaitVisible(chromedp.CSS("section.outcome")))
	got := pb.text("section.outcome")
	if !strings.Contains(got, "Not recorded: someone else decided first") || !strings.Contains(got, "PENDING by alice") {
		t.Errorf("bob's page: %q, want that alice decided PENDING first", got)
	}
	pb.shot("2-bob-refused")
	if s := w.state("acme", "refund-1"); s != intentv1.State_STATE_PENDING {
		t.Errorf("after both: %v, want alice's PENDING", s)
	}
}
