package console

import (
	"html"
	"html/template"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"
	"time"
)

// keyShapes are keys the API accepts (1-256 bytes of [A-Za-z0-9._:/=@+-])
// whose shapes a path would normalise or a query would misread: dot
// segments, empty segments, a trailing '/', '+' (a space in a query
// unless escaped), '=', '@', ':', and pairs where one key is the other's
// normalised form.
var keyShapes = []string{
	".", "..", "...", "./c", "c", "a/../b", "b", "a/./b", "a/b", "x//y", "x/y", "dir/", "dir", "/lead", "lead",
	"dots-1/../javascript:alert-3-1+a=b@c", "javascript:alert-3-1+a=b@c",
	"+", "a+b", "a b", "a=b", "@x", "x:y", "mailto:x@y", "../../../../signout", "-",
	strings.Repeat("0123456789abcdef", 4), // a derived key's shape
	strings.Repeat("a/..", 64),            // 256 bytes
}

// TestKeyURLsRoundTrip: for every key shape, the URL keyURL builds, as the
// template puts it into an href, resolved against the page it is on the way
// a browser does (url.Parse, ResolveReference), reaches the route of its
// page through the console's ServeMux, with no redirect, and names exactly
// that key. A key in the path (as the console once put it) fails this:
// "a/../b" resolves to "b", "x//y" is redirected.
func TestKeyURLsRoundTrip(t *testing.T) {
	static, err := fs.Sub(files, "static")
	if err != nil {
		t.Fatal(err)
	}
	mux := (&Console{}).routes(static)
	href := template.Must(template.New("a").Parse(`<a href="{{.}}">`))
	hrefRe := regexp.MustCompile(`href="([^"]*)"`)
	for _, page := range []string{"/console/t/acme/queue?state=unknown&label=customer%3Dc-17", "/console/t/acme/intent?key=x%2F..%2Fy", "/console/t/acme/overview"} {
		base, err := url.Parse("http://console.example:8080" + page)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range keyShapes {
			for _, tc := range []struct {
				method, u, pattern, path string
			}{
				{http.MethodGet, intentURL("acme", key), "GET /console/t/{tenant}/intent", "/console/t/acme/intent"},
				{http.MethodPost, decideURL("acme", key), "POST /console/t/{tenant}/decide", "/console/t/acme/decide"},
				{http.MethodGet, liveURL("acme", key, 42), "GET /console/t/{tenant}/live", "/console/t/acme/live"},
			} {
				var b strings.Builder
				if err := href.Execute(&b, tc.u); err != nil {
					t.Fatal(err)
				}
				m := hrefRe.FindStringSubmatch(b.String())
				if m == nil || html.UnescapeString(m[1]) != tc.u {
					t.Errorf("key %q: the template renders %s, want the href %q", key, b.String(), tc.u)
					continue
				}
				ref, err := url.Parse(html.UnescapeString(m[1]))
				if err != nil {
					t.Errorf("key %q: url.Parse(%q): %v", key, m[1], err)
					continue
				}
				got := base.ResolveReference(ref)
				if got.Host != base.Host || got.Path != tc.path {
					t.Errorf("key %q on %s: %s resolves to %s, want %s on the same host", key, page, tc.u, got, tc.path)
				}
				// As the server receives it.
				req := httptest.NewRequest(tc.method, got.RequestURI(), nil)
				_, pattern := mux.Handler(req)
				if pattern != tc.pattern {
					t.Errorf("key %q: %s %s routes to %q, want %q", key, tc.method, got.RequestURI(), pattern, tc.pattern)
				}
				if k := keyOf(req); k != key {
					t.Errorf("key %q: %s %s names the key %q", key, tc.method, got.RequestURI(), k)
				}
			}
		}
	}
}

// TestKeyPathsAreGone: the paths that once carried a key (intents/...,
// decide/...) reach the console's not-found handler, or ServeMux's
// redirect to the clean path, which names no key (intentPage and decide
// answer not found without one): never an intent's page.
func TestKeyPathsAreGone(t *testing.T) {
	static, err := fs.Sub(files, "static")
	if err != nil {
		t.Fatal(err)
	}
	mux := (&Console{}).routes(static)
	for _, key := range keyShapes {
		for _, p := range []struct{ method, path string }{
			{http.MethodGet, "/console/t/acme/intents/" + key},
			{http.MethodPost, "/console/t/acme/decide/" + key},
			{http.MethodGet, "/console/t/acme/intent/" + key},
		} {
			u := &url.URL{Path: p.path}
			req := httptest.NewRequest(p.method, u.RequestURI(), nil)
			_, pattern := mux.Handler(req)
			if pattern == "/console/" {
				continue
			}
			if clean := path.Clean(p.path); clean == p.path || keyOf(httptest.NewRequest(p.method, clean, nil)) != "" {
				t.Errorf("%s %s routes to %q, want the not-found page", p.method, u.RequestURI(), pattern)
			}
		}
	}
}

// TestBidiIsolatesSuppliedText: a supplied string is escaped and isolated
// in a <bdi>, and a U+2069 that would close that isolation (Chromium lets
// it) is dropped, while one that closes an isolate the string opened is
// kept; plain text outside elements is isolated with FSI/PDI unless it is
// ASCII.
func TestBidiIsolatesSuppliedText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want template.HTML
	}{
		{"c-17", "<bdi>c-17</bdi>"},
		{"<b>&'\"", "<bdi>&lt;b&gt;&amp;&#39;&#34;</bdi>"},
		{"\u202eevil", "<bdi>\u202eevil</bdi>"},
		{"x\u2069\u202eevil", "<bdi>x\u202eevil</bdi>"},
		{"\u2067abc\u2069\u2069\u202e", "<bdi>\u2067abc\u2069\u202e</bdi>"},
		{"\u2069\u2069", "<bdi></bdi>"},
	} {
		if got := bidi(tc.in); got != tc.want {
			t.Errorf("bidi(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := phrase("Escalated by %s: it's %s", "w\u202e", "<x>"); got != "Escalated by <bdi>w\u202e</bdi>: it&#39;s <bdi>&lt;x&gt;</bdi>" {
		t.Errorf("phrase: %q", got)
	}
	for in, want := range map[string]string{"alice": "alice", "dana\u202e": "\u2068dana\u202e\u2069", "x\u2069\u202e": "\u2068x\u202e\u2069", "محمد": "\u2068محمد\u2069"} {
		if got := isolated(in); got != want {
			t.Errorf("isolated(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDerivedKeysAreShortened: a 64-hex key shows as its first 12 and last
// 6 digits, the whole key in its title; other keys whole.
func TestDerivedKeysAreShortened(t *testing.T) {
	hex := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	for key, want := range map[string]template.HTML{
		hex:                      `<bdi class="key" title="` + template.HTML(hex) + `">9f86d081884c…f00a08</bdi>`,
		strings.ToUpper(hex):     `<bdi class="key">` + template.HTML(strings.ToUpper(hex)) + `</bdi>`,
		hex[:63]:                 `<bdi class="key">` + template.HTML(hex[:63]) + `</bdi>`,
		"refund-1":               `<bdi class="key">refund-1</bdi>`,
		"a/../b\u202e<x>":        "<bdi class=\"key\">a/../b\u202e&lt;x&gt;</bdi>",
		strings.Repeat("g", 64):  `<bdi class="key">` + template.HTML(strings.Repeat("g", 64)) + `</bdi>`,
		strings.Repeat("0a", 32): `<bdi class="key" title="` + template.HTML(strings.Repeat("0a", 32)) + `">0a0a0a0a0a0a…0a0a0a</bdi>`,
	} {
		if got := keyHTML(newKeyView(key)); got != want {
			t.Errorf("key %q shows as %s, want %s", key, got, want)
		}
	}
}

// TestSafeNext: a sign-in's next stays on the console, on this origin, and
// comes back byte for byte (an intent's escaped key included).
func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		intentURL("acme", "dots-1/../javascript:alert-3-1+a=b@c"): intentURL("acme", "dots-1/../javascript:alert-3-1+a=b@c"),
		intentURL("acme", "x//y"):                                 intentURL("acme", "x//y"),
		"/console/t/acme/queue?state=unknown":                     "/console/t/acme/queue?state=unknown",
		"/console/":                                               "/console/",
		"//evil.example/console/":                                 "fallback",
		"/\\evil.example":                                         "fallback",
		"/console/\\..\\..\\evil":                                 "fallback",
		"https://evil.example/console/":                           "fallback",
		"/console/../evil":                                        "fallback",
		"/console/%2e%2e/evil":                                    "fallback",
		"/console/\t/evil":                                        "fallback",
		"/consolex":                                               "fallback",
		"javascript:alert(1)":                                     "fallback",
		"":                                                        "fallback",
	} {
		if got := safeNext(next, "fallback"); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}

// TestChartEndsNow: the unknown-outcomes chart's last time label is "now",
// at the right edge, and the one before it names the bin an hour before
// the current one, whatever minute it is. Counted from the oldest bin, as
// the labels were, the last one named a time 50 minutes before the
// current bin and nothing marked the bar that is now.
func TestChartEndsNow(t *testing.T) {
	for _, at := range []string{"2026-03-01T15:47:12Z", "2026-03-01T15:40:00Z", "2026-03-01T00:09:59Z", "2026-03-01T23:59:59Z"} {
		now, err := time.Parse(time.RFC3339, at)
		if err != nil {
			t.Fatal(err)
		}
		a := NewActivity(func() time.Time { return now })
		c := newChart(a.Unknowns("acme"))
		if len(c.Ticks) < 2 {
			t.Fatalf("at %s: ticks %v", at, c.Ticks)
		}
		last, before := c.Ticks[len(c.Ticks)-1], c.Ticks[len(c.Ticks)-2]
		if last.Label != "now" || !last.End || last.X < c.Bars[len(c.Bars)-1].X {
			t.Errorf("at %s: last tick %+v, want \"now\" at the right edge (the last bar is at %d)", at, last, c.Bars[len(c.Bars)-1].X)
		}
		current := now.Truncate(activityBin)
		if want := current.Add(-time.Hour).Format("15:04"); before.Label != want {
			t.Errorf("at %s: the tick before now reads %q, want %q (an hour before the current bin)", at, before.Label, want)
		}
		if lastBar := c.Bars[len(c.Bars)-1].Label; !strings.HasPrefix(lastBar, current.Format("15:04")+" (now):") {
			t.Errorf("at %s: the last bar is labelled %q, want the current bin's start, marked now", at, lastBar)
		}
	}
}
