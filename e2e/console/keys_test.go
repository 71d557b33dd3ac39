package console

import (
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// keyShapes are keys the API accepts whose shapes a path would normalise
// into another key, or into none, or that a query would misread unless
// escaped: dot segments ("a/../b" where "b" exists too), empty segments,
// a trailing '/', a leading '/', "+", "=", "@", ":". Each one's
// normalised form is registered as well, so that a link that opened the
// normalised form would open a real, other intent.
var keyShapes = []string{
	".", "..", "a/../b", "b", "./c", "c", "a/./b", "a/b", "x//y", "x/y", "dir/", "dir", "/lead", "lead",
	"dots-1/../javascript:alert-3-1+a=b@c", "javascript:alert-3-1+a=b@c", "+", "a+b", "a=b", "@c", "x:y",
}

// derivedShapes are registered with an action and identity and no key: the
// key is derived (64 hex digits), and the queue row leads with the summary.
var derivedShapes = []struct{ returnID, summary string }{
	{"RA-20931", "Refund 40.00 USD to Alice for ORD-88412"},
	{"RA-20932", "Refund 12.00 USD to Alice for ORD-88412, second return"},
}

// seedShapes leaves every key shape UNKNOWN in acme and returns, for each
// intent, the text its queue link shows (its key, or its summary) and its
// key.
func (w *world) seedShapes() map[string]string {
	w.t.Helper()
	links := map[string]string{}
	for _, k := range keyShapes {
		w.unknown("acme", k)
		links[k] = k
	}
	for _, d := range derivedShapes {
		key, _ := w.unknownKey("acme", "", func(r *intentv1.RegisterRequest) {
			r.Action = "refund.issue"
			r.Identity, _ = structpb.NewStruct(map[string]any{"order_id": "ORD-88412", "return_id": d.returnID})
			r.Summary = d.summary
		})
		if len(key) != 64 {
			w.t.Fatalf("derived key %q, want 64 hex digits", key)
		}
		links[d.summary] = key
	}
	return links
}

// checkDecided: key is PENDING with exactly one decision, whose reason
// names it, and every key of keys not yet in decided is still UNKNOWN with
// none: a decision landed on its intent and only there.
func (w *world) checkDecided(key string, decided map[string]bool, keys map[string]string) {
	w.t.Helper()
	decided[key] = true
	for _, k := range keys {
		resp, err := w.api.Get(w.ctx(alice), &intentv1.GetRequest{Tenant: "acme", Key: k})
		if err != nil {
			w.t.Fatalf("Get(%q): %v", k, err)
		}
		var reasons []string
		for _, h := range resp.GetIntent().GetHistory() {
			if h.GetKind() == intentv1.HistoryEntry_KIND_RESOLVED {
				reasons = append(reasons, h.GetReason())
			}
		}
		switch st := resp.GetIntent().GetState(); {
		case decided[k] && (st != intentv1.State_STATE_PENDING || len(reasons) != 1 || reasons[0] != "confirmed absent: "+k):
			w.t.Errorf("after deciding %q: %q is %v with decisions %q, want PENDING with one decision naming it", key, k, st, reasons)
		case !decided[k] && (st != intentv1.State_STATE_UNKNOWN || len(reasons) != 0):
			w.t.Errorf("after deciding %q: %q is %v with decisions %q, want it UNKNOWN and undecided", key, k, st, reasons)
		}
	}
}

// webClient is a reviewer's HTTP client: its own cookies, redirects not
// followed (each answer is looked at).
type webClient struct {
	t    *testing.T
	w    *world
	http *http.Client
}

func (w *world) webClient() *webClient {
	jar, _ := cookiejar.New(nil)
	return &webClient{t: w.t, w: w, http: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type answer struct {
	code     int
	body     string
	location string
}

func (c *webClient) do(req *http.Request) answer {
	c.t.Helper()
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, body: string(b), location: resp.Header.Get("Location")}
}

func (c *webClient) get(u *url.URL) answer {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	return c.do(req)
}

// post sends a form as a browser on the console's page would: with its
// Origin.
func (c *webClient) post(u *url.URL, form url.Values) answer {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u.String(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", u.Scheme+"://"+u.Host)
	return c.do(req)
}

var (
	linkRe   = regexp.MustCompile(`<a href="([^"]*)" class="(?:intent-link|key)">(.*?)</a>`)
	tagRe    = regexp.MustCompile(`<[^>]*>`)
	actionRe = regexp.MustCompile(`<form method="post" action="([^"]*)" novalidate>`)
	inputRe  = func(name string) *regexp.Regexp { return regexp.MustCompile(`name="` + name + `" value="([^"]*)"`) }
)

func field(t *testing.T, body, name string) string {
	t.Helper()
	m := inputRe(name).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no input %q in:\n%s", name, body)
	}
	return html.UnescapeString(m[1])
}

// resolve is href (as it stands in the page's HTML) resolved against the
// page's URL, as a browser resolves a link it follows.
func resolve(t *testing.T, page *url.URL, href string) *url.URL {
	t.Helper()
	ref, err := url.Parse(html.UnescapeString(href))
	if err != nil {
		t.Fatalf("href %q: %v", href, err)
	}
	return page.ResolveReference(ref)
}

// TestEveryKeyShapeOpensAndDecides: a reviewer (over HTTP, as a browser
// does: each link and form action resolved against the page it is on)
// follows every queue link and lands on exactly that intent's page and
// decide form, whatever its key holds; the decision lands on that intent
// and on no other (each key's normalised form is another registered
// intent). The paths that once held a key answer the console's 404 page.
func TestEveryKeyShapeOpensAndDecides(t *testing.T) {
	w := newWorld(t)
	keys := w.seedShapes()
	c := w.webClient()
	base, _ := url.Parse(w.console)
	form := c.get(base.JoinPath("signin"))
	if a := c.post(base.JoinPath("signin"), url.Values{"csrf": {field(t, form.body, "csrf")}, "token": {alice.token}}); a.code != http.StatusSeeOther {
		t.Fatalf("sign in: %d:\n%s", a.code, a.body)
	}
	queueURL := base.JoinPath("t", "acme", "queue")
	decided := map[string]bool{}
	for text, key := range keys {
		queue := c.get(queueURL)
		links := map[string]string{}
		for _, m := range linkRe.FindAllStringSubmatch(queue.body, -1) {
			links[html.UnescapeString(tagRe.ReplaceAllString(m[2], ""))] = m[1]
		}
		if len(links)+len(decided) != len(keys) {
			t.Fatalf("the queue links %d intents, %d decided, want %d in all:\n%s", len(links), len(decided), len(keys), queue.body)
		}
		href, ok := links[text]
		if !ok {
			t.Fatalf("no queue link shows %q:\n%s", text, queue.body)
		}
		pageURL := resolve(t, queueURL, href)
		p := c.get(pageURL)
		if p.code != http.StatusOK {
			t.Fatalf("key %q: the queue's link %q resolves to %s: %d, want its page", key, href, pageURL, p.code)
		}
		if want := `id="intent-key"><bdi>` + html.EscapeString(key) + `</bdi>`; !strings.Contains(p.body, want) {
			t.Fatalf("key %q: the queue's link %q opens another page (%s):\n%s", key, href, pageURL, p.body)
		}
		action := actionRe.FindStringSubmatch(p.body)
		if action == nil {
			t.Fatalf("key %q: no decide form:\n%s", key, p.body)
		}
		d := c.post(resolve(t, pageURL, action[1]), url.Values{
			"csrf": {field(t, p.body, "csrf")}, "request_id": {field(t, p.body, "request_id")}, "expected_token": {field(t, p.body, "expected_token")},
			"decision": {"pending"}, "reason": {"confirmed absent: " + key},
		})
		if d.code != http.StatusSeeOther {
			t.Fatalf("key %q: deciding: %d, want 303:\n%s", key, d.code, d.body)
		}
		after := c.get(resolve(t, pageURL, d.location))
		if !strings.Contains(after.body, `id="intent-key"><bdi>`+html.EscapeString(key)+`</bdi>`) || !strings.Contains(after.body, "Decided: PENDING") {
			t.Errorf("key %q: the redirect after deciding, %q, shows another page:\n%s", key, d.location, after.body)
		}
		w.checkDecided(key, decided, keys)

		// The old path of the key, followed as a browser follows
		// redirects, is the console's not-found page.
		old := &url.URL{Scheme: base.Scheme, Host: base.Host, Path: "/console/t/acme/intents/" + key}
		for range 3 {
			a := c.get(old)
			if a.code < 300 || a.code > 399 {
				if a.code != http.StatusNotFound || strings.Contains(a.body, "Record decision") || strings.Contains(a.body, `id="intent-key"`) {
					t.Errorf("key %q: its old path %s: %d, want the console's 404 page:\n%s", key, old, a.code, a.body)
				}
				break
			}
			old = resolve(t, old, a.location)
		}
	}
}

// TestEveryKeyShapeOpensAndDecidesInTheBrowser: the same in Chromium, by
// clicking: each queue row's link opens exactly its intent, whose decide
// form names it, and deciding there lands on it and only on it.
func TestEveryKeyShapeOpensAndDecidesInTheBrowser(t *testing.T) {
	w := newWorld(t)
	keys := w.seedShapes()
	p := w.browser().personFor("alice", 5*time.Minute)
	p.signIn(alice)
	decided := map[string]bool{}
	for text, key := range keys {
		p.open("/console/t/acme/queue", "h1")
		found, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](`(() => {
			const a = [...document.querySelectorAll("table.queue a.intent-link")].find(a => a.textContent === `+jsString(text)+`);
			if (!a) return false;
			a.id = "target-link";
			return true;
		})()`))
		if err != nil || !found {
			p.shot("failed-no-link")
			t.Fatalf("no queue link shows %q (%v)", text, err)
		}
		p.do("open "+key, chromedp.Click(chromedp.CSS("#target-link")), chromedp.WaitVisible(chromedp.CSS("#intent-key")))
		got, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]string](`[document.getElementById("intent-key").textContent,
			new URL(document.querySelector("section.decide form").action).searchParams.get("key"), location.href]`))
		if err != nil || len(got) != 3 || got[0] != key || got[1] != key {
			p.shot("failed-wrong-intent")
			t.Fatalf("clicking the row of %q opened %q (form for %q) at %v (%v)", key, got[0], got[1], got, err)
		}
		p.do("decide "+key, chromedp.Click(chromedp.CSS("#d-pending")), chromedp.SendKeys(chromedp.CSS("#reason"), "confirmed absent: "+key),
			chromedp.Click(chromedp.CSS("section.decide button.primary")), chromedp.WaitVisible(chromedp.CSS(".banner.ok")))
		// The whole key is in the page even where a closed disclosure
		// hides it (a derived key): its textContent, not its visible text.
		k, err := chromedp.Run(p.ctx, chromedp.TextContent(chromedp.CSS("#intent-key")))
		if s := p.text("#intent-state"); err != nil || k != key || s != "PENDING" {
			t.Errorf("after deciding %q the page shows %q in state %s", key, k, s)
		}
		w.checkDecided(key, decided, keys)
	}
	p.shot("all-decided")
}

// jsString quotes s for a JavaScript expression (JSON's string is one).
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
