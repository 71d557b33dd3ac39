package daemon_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// webClient is one browser: cookies (which, as RFC 6265 has it, go to
// every port of a host, so to both replicas here, as behind one load
// balancer), no automatic redirects.
type webClient struct {
	t    *testing.T
	http *http.Client
}

func newWebClient(t *testing.T) *webClient {
	jar, _ := cookiejar.New(nil)
	return &webClient{t: t, http: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *webClient) do(method, u string, form url.Values) (int, string, http.Header) {
	c.t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(form.Encode()))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://"+req.URL.Host)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// waitServing waits until url answers at all.
func waitServing(t *testing.T, u string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer: %v", u, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	formCSRF   = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	formAction = regexp.MustCompile(`<form method="post" action="([^"]+)"[^>]*novalidate>`)
	formField  = func(name string) *regexp.Regexp { return regexp.MustCompile(`name="` + name + `" value="([^"]*)"`) }
)

// TestConsoleAcrossTwoIntentds runs two intentd replicas on one external
// etcd, as the deployment files do: one with the console on a listener of
// its own (--console-listen), one on its metrics listener. A reviewer
// signs in on the first, is served and decides on the second, and signs
// out on the second; the first then refuses the session at once. The
// console's own listener serves neither /metrics nor the health
// endpoints, and the metrics listener beside it no console.
func TestConsoleAcrossTwoIntentds(t *testing.T) {
	dir := t.TempDir()
	etcd := etcdtest.Start(t)
	const reviewer, approver, worker = "replicas-reviewer-token-1", "replicas-approver-token-1", "replicas-worker-token-1"
	tokens := filepath.Join(dir, "tokens.json")
	writeTokensFile(t, tokens, tokenEntry("rev-1", "reviewer", reviewer), tokenEntry("appr-1", "approver", approver), tokenEntry("w-1", "worker", worker))
	replica := func(name string, ownListener bool) daemon.Config {
		cfg := testConfig(filepath.Join(dir, name))
		cfg.EtcdEndpoints = etcd.Endpoints
		cfg.TokensFile = tokens
		cfg.MetricsListen = freeport.Addr(t)
		if ownListener {
			cfg.ConsoleListen = freeport.Addr(t)
		}
		return cfg
	}
	c1, c2 := replica("one", true), replica("two", false)
	one, two := start(t, c1), start(t, c2)
	console1, console2 := "http://"+c1.ConsoleListen, "http://"+c2.MetricsListen
	waitServing(t, console1+"/console/")
	waitServing(t, console2+"/console/")

	api := intentv1.NewIntentServiceClient(one.conn)
	if _, err := api.Register(bearerCall(t, approver), &intentv1.RegisterRequest{Tenant: "acme", Key: "refund-7", Params: params(t, 1)}); err != nil {
		t.Fatalf("Register: %v", err)
	}
	s, err := api.OpenSession(bearerCall(t, worker), &intentv1.OpenSessionRequest{Tenant: "acme", Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := api.Acquire(bearerCall(t, worker), &intentv1.AcquireRequest{Tenant: "acme", Key: "refund-7", SessionId: s.GetSessionId(), RequestId: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.MarkUnknown(bearerCall(t, worker), &intentv1.MarkUnknownRequest{Tenant: "acme", Key: "refund-7", Token: a.GetLease().GetToken(), Reason: "timed out"}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		url  string
		want int
	}{
		{console1 + "/metrics", http.StatusNotFound},
		{console1 + "/healthz", http.StatusNotFound},
		{console1 + "/readyz", http.StatusNotFound},
		{console1 + "/", http.StatusFound},
		{"http://" + c1.MetricsListen + "/console/", http.StatusNotFound},
		{"http://" + c1.MetricsListen + "/metrics", http.StatusOK},
		{console2 + "/metrics", http.StatusOK},
	} {
		if code, _, _ := newWebClient(t).do(http.MethodGet, tc.url, nil); code != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.url, code, tc.want)
		}
	}

	b := newWebClient(t)
	_, form, _ := b.do(http.MethodGet, console1+"/console/signin", nil)
	csrf := formCSRF.FindStringSubmatch(form)
	if csrf == nil {
		t.Fatalf("no sign-in form on the first replica:\n%s", form)
	}
	if code, body, _ := b.do(http.MethodPost, console1+"/console/signin", url.Values{"csrf": {csrf[1]}, "token": {reviewer}}); code != http.StatusSeeOther {
		t.Fatalf("sign in on the first replica: %d:\n%s", code, body)
	}
	code, queue, _ := b.do(http.MethodGet, console2+"/console/t/acme/queue", nil)
	if code != http.StatusOK || !strings.Contains(queue, "rev-1") || !strings.Contains(queue, "refund-7") {
		t.Fatalf("the queue on the second replica: %d, want rev-1's, with refund-7:\n%s", code, queue)
	}
	link := regexp.MustCompile(`href="([^"]*refund-7[^"]*)"`).FindStringSubmatch(queue)
	if link == nil {
		t.Fatalf("no link to refund-7 in the queue:\n%s", queue)
	}
	_, page, _ := b.do(http.MethodGet, console2+strings.ReplaceAll(link[1], "&amp;", "&"), nil)
	action := formAction.FindStringSubmatch(page)
	if action == nil {
		t.Fatalf("no decide form on the second replica:\n%s", page)
	}
	decide := url.Values{"csrf": {formCSRF.FindStringSubmatch(page)[1]}, "request_id": {formField("request_id").FindStringSubmatch(page)[1]},
		"expected_token": {formField("expected_token").FindStringSubmatch(page)[1]}, "decision": {"pending"}, "reason": {"absent at the provider"}}
	if code, body, _ := b.do(http.MethodPost, console2+strings.ReplaceAll(action[1], "&amp;", "&"), decide); code != http.StatusSeeOther {
		t.Fatalf("decide on the second replica: %d:\n%s", code, body)
	}
	got, err := api.Get(bearerCall(t, reviewer), &intentv1.GetRequest{Tenant: "acme", Key: "refund-7"})
	if err != nil || got.GetIntent().GetState() != intentv1.State_STATE_PENDING {
		t.Fatalf("after the decision: %v %v, want PENDING", got.GetIntent().GetState(), err)
	}

	_, queue, _ = b.do(http.MethodGet, console2+"/console/t/acme/queue", nil)
	if code, body, _ := b.do(http.MethodPost, console2+"/console/signout", url.Values{"csrf": {formCSRF.FindStringSubmatch(queue)[1]}}); code != http.StatusSeeOther {
		t.Fatalf("sign out on the second replica: %d:\n%s", code, body)
	}
	for _, base := range []string{console1, console2} {
		if code, _, h := b.do(http.MethodGet, base+"/console/t/acme/queue", nil); code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), "/console/signin") {
			t.Errorf("the queue on %s after signing out: %d %q, want a redirect to sign in", base, code, h.Get("Location"))
		}
	}
	_ = two
}

// TestListenAddressesValidate: each listener is an address; a port out of
// range, or two listeners on one address, is a bad flag at start, named,
// before anything listens. The console may leave its own empty, to be
// served on the metrics listener.
func TestListenAddressesValidate(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		listen, metr, console string
		want                  string // "" valid
	}{
		{"each its own", "127.0.0.1:7650", "127.0.0.1:7651", "127.0.0.1:7652", ""},
		{"the console on the metrics listener", "127.0.0.1:7650", "127.0.0.1:7651", "", ""},
		{"the console on all interfaces", "127.0.0.1:7650", "127.0.0.1:7651", "0.0.0.0:7653", ""},
		{"the console alone, metrics off", "127.0.0.1:7650", "", "127.0.0.1:7653", ""},
		{"the console without a port", "127.0.0.1:7650", "127.0.0.1:7651", "127.0.0.1", `--console-listen "127.0.0.1"`},
		{"the console on the metrics listener's address", "127.0.0.1:7650", "127.0.0.1:7651", "127.0.0.1:7651", "--console-listen 127.0.0.1:7651: the address of --metrics-listen"},
		{"a service name", "127.0.0.1:7650", "127.0.0.1:http", "", ""},
		{"all on port 0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", ""},
		{"--listen's port out of range", "127.0.0.1:99999", "127.0.0.1:7651", "", `--listen "127.0.0.1:99999": port "99999": want 0 to 65535`},
		{"--metrics-listen's port out of range", "127.0.0.1:7650", "127.0.0.1:70000", "", `--metrics-listen "127.0.0.1:70000": port "70000"`},
		{"metrics on the gRPC address", "127.0.0.1:7650", "127.0.0.1:7650", "", "--metrics-listen 127.0.0.1:7650: the address of --listen"},
		{"the console on the gRPC address", "127.0.0.1:7650", "127.0.0.1:7651", "127.0.0.1:7650", "--console-listen 127.0.0.1:7650: the address of --listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.Listen, cfg.MetricsListen, cfg.ConsoleListen = tc.listen, tc.metr, tc.console
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want it to hold %q", err, tc.want)
			}
		})
	}
}
