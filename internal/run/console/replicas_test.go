package console_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/console"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// replicaSet is intentd's replicas as a load balancer sees them: each its
// own store, API and console, over one etcd, one tokens file and one
// clock.
type replicaSet struct {
	t        *testing.T
	etcd     *clientv3.Client
	clock    *clock
	mu       sync.Mutex
	dir      *access.Directory
	replicas []*env
}

// newReplicaSet starts n replicas (with a tokens file when auth).
func newReplicaSet(t *testing.T, n int, auth bool, configure ...func(*console.Config)) *replicaSet {
	t.Helper()
	etcd := etcdtest.Start(t)
	rs := &replicaSet{t: t, etcd: etcd.Client(t), clock: &clock{}}
	log := slog.New(slog.DiscardHandler)
	var dirFn func() *access.Directory
	if auth {
		rs.dir = directory(t, alice, bob, rita, gina, ops, worker)
		dirFn = func() *access.Directory { rs.mu.Lock(); defer rs.mu.Unlock(); return rs.dir }
	}
	for range n {
		e := &env{t: t, clock: rs.clock, auth: auth}
		e.serve(etcd, dirFn, log, configure...)
		rs.replicas = append(rs.replicas, e)
	}
	return rs
}

// via is b, the same browser (its cookies), sending its next requests to
// replica e, as a load balancer may.
func (b *browser) via(e *env) *browser { return &browser{t: b.t, e: e, http: b.http} }

// signedInAs reports whether p is a page for a signed-in m: served, not a
// redirect to the sign-in form, naming m and offering to sign out.
func signedInAs(p page, m member) bool {
	return p.code == http.StatusOK && strings.Contains(p.body, m.name) && strings.Contains(p.body, `action="/console/signout"`)
}

// signedOut reports whether p sends its browser to sign in.
func signedOut(p page) bool {
	return p.code == http.StatusSeeOther && strings.HasPrefix(p.h.Get("Location"), "/console/signin")
}

// sessionKeys are the console's session keys in etcd.
func (rs *replicaSet) sessionKeys() []string {
	rs.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rs.etcd.Get(ctx, "/intentd/v1/console/s/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		rs.t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

var (
	decideAction = regexp.MustCompile(`<form method="post" action="([^"]+)"[^>]*novalidate>`)
	signoutCSRF  = regexp.MustCompile(`action="/console/signout">\s*<input type="hidden" name="csrf" value="([^"]+)"`)
)

// intentLink is the queue's link to key's intent page, as a browser
// follows it.
func intentLink(t *testing.T, q page, key string) string {
	t.Helper()
	m := regexp.MustCompile(`href="([^"]*` + regexp.QuoteMeta(url.QueryEscape(key)) + `[^"]*)"`).FindStringSubmatch(q.body)
	if m == nil {
		t.Fatalf("the queue has no link to %s:\n%s", key, q.body)
	}
	return html.UnescapeString(m[1])
}

// TestSessionFollowsTheReviewerAcrossReplicas: a reviewer signs in on one
// replica and is served by the other, decides there (with the form the
// first served), reads the decision's message on the first after the
// redirect, and signs out on the second: the first then refuses the
// session at once, a form posted to it included.
func TestSessionFollowsTheReviewerAcrossReplicas(t *testing.T) {
	rs := newReplicaSet(t, 2, true)
	a, b := rs.replicas[0], rs.replicas[1]
	a.unknown("acme", "refund-1", refund)
	onA := a.browser()
	onA.signIn(alice)
	onB := onA.via(b)

	q := onB.get("/console/t/acme/queue")
	if !signedInAs(q, alice) {
		t.Fatalf("the queue on the other replica: %d %q, want it served to alice:\n%s", q.code, q.h.Get("Location"), q.body)
	}
	intentPage := onA.get(intentLink(t, q, "refund-1"))
	action := decideAction.FindStringSubmatch(intentPage.body)
	if intentPage.code != http.StatusOK || action == nil {
		t.Fatalf("intent page on the first replica: %d, want it with its decide form:\n%s", intentPage.code, intentPage.body)
	}
	form := url.Values{"csrf": {intentPage.field(t, "csrf")}, "request_id": {intentPage.field(t, "request_id")},
		"expected_token": {intentPage.field(t, "expected_token")}, "decision": {"pending"}, "reason": {"no refund at the provider"}}
	d := onB.post(html.UnescapeString(action[1]), form)
	if d.code != http.StatusSeeOther {
		t.Fatalf("deciding on the other replica with the first's form: %d, want 303:\n%s", d.code, d.body)
	}
	if got := a.get("acme", "refund-1"); got.GetState() != intentv1.State_STATE_PENDING {
		t.Errorf("after the decision: %v, want PENDING", got.GetState())
	}
	after := onA.get(d.h.Get("Location"))
	contains(t, "the page after the redirect, on the first replica", after, "Decided: PENDING, recorded as alice via the console.")
	if again := onB.get(d.h.Get("Location")); strings.Contains(again.body, "Decided: PENDING") {
		t.Errorf("the decision's message shows twice")
	}

	q = onB.get("/console/t/acme/queue")
	m := signoutCSRF.FindStringSubmatch(q.body)
	if m == nil {
		t.Fatalf("no sign-out form on the queue:\n%s", q.body)
	}
	if out := onB.post("/console/signout", url.Values{"csrf": {m[1]}}); out.code != http.StatusSeeOther {
		t.Fatalf("sign out on the other replica: %d:\n%s", out.code, out.body)
	}
	// A copy of the cookie from before signing out (a second tab's, a
	// stolen one) is as dead as the browser's.
	stolen := a.browser()
	u, _ := url.Parse(a.web.URL)
	stolen.http.Jar.SetCookies(u, onA.http.Jar.Cookies(u))
	for name, p := range map[string]page{
		"queue on the first replica":      onA.get("/console/t/acme/queue"),
		"queue on the second replica":     onB.get("/console/t/acme/queue"),
		"queue with a copy of the cookie": stolen.get("/console/t/acme/queue"),
	} {
		if !signedOut(p) {
			t.Errorf("%s after signing out: %d %q, want a redirect to sign in", name, p.code, p.h.Get("Location"))
		}
	}
	form.Set("decision", "cancelled")
	form.Set("request_id", "after-sign-out")
	if p := stolen.post(html.UnescapeString(action[1]), form); p.code != http.StatusUnauthorized {
		t.Errorf("a decision posted to the first replica after signing out on the other: %d, want 401", p.code)
	}
	if got := a.get("acme", "refund-1"); got.GetState() != intentv1.State_STATE_PENDING {
		t.Errorf("after a refused decision: %v, want PENDING still", got.GetState())
	}
	if keys := rs.sessionKeys(); len(keys) != 0 {
		t.Errorf("session keys left after signing out: %q", keys)
	}
}

// TestRevokedTokenEndsTheSessionEverywhere: once the tokens file no longer
// lists a reviewer's token, the first replica to see the session ends it
// in the store, so that no replica serves it again, even one whose tokens
// file still listed the token.
func TestRevokedTokenEndsTheSessionEverywhere(t *testing.T) {
	rs := newReplicaSet(t, 2, true)
	onA := rs.replicas[0].browser()
	onA.signIn(alice)
	onB := onA.via(rs.replicas[1])
	if p := onB.get("/console/t/acme/queue"); !signedInAs(p, alice) {
		t.Fatalf("queue on the other replica: %d, want it served", p.code)
	}
	rs.mu.Lock()
	full := rs.dir
	rs.dir = directory(t, bob, ops, worker) // alice's token removed
	rs.mu.Unlock()
	if p := onA.get("/console/t/acme/queue"); !signedOut(p) {
		t.Errorf("queue after alice's token left the tokens file: %d, want a redirect to sign in", p.code)
	}
	if keys := rs.sessionKeys(); len(keys) != 0 {
		t.Errorf("alice's revoked session is still stored: %q", keys)
	}
	rs.mu.Lock()
	rs.dir = full // a replica that has not reloaded the file yet
	rs.mu.Unlock()
	if p := onB.get("/console/t/acme/queue"); !signedOut(p) {
		t.Errorf("the other replica serves the ended session: %d", p.code)
	}
}

// TestSessionsEndWhenIdleOrOld: a session ends after IdleTimeout without a
// request and at MaxSessionAge however busy, on every replica: by the
// console's clock (an injected one here), and when nothing asks, by the
// etcd lease alone, which requests keep alive.
func TestSessionsEndWhenIdleOrOld(t *testing.T) {
	t.Run("idle, by the clock", func(t *testing.T) {
		rs := newReplicaSet(t, 2, true)
		b := rs.replicas[0].browser()
		b.signIn(alice)
		rs.clock.advance(console.DefaultConfig().IdleTimeout - 2*time.Minute)
		if p := b.via(rs.replicas[1]).get("/console/t/acme/queue"); !signedInAs(p, alice) {
			t.Fatalf("queue before the idle timeout: %d, want it served", p.code)
		}
		rs.clock.advance(console.DefaultConfig().IdleTimeout - time.Second)
		if p := b.via(rs.replicas[1]).get("/console/t/acme/queue"); !signedInAs(p, alice) {
			t.Fatalf("queue used within the idle timeout: %d, want it served (the last request restarted it)", p.code)
		}
		rs.clock.advance(console.DefaultConfig().IdleTimeout + time.Second)
		if p := b.via(rs.replicas[0]).get("/console/t/acme/queue"); !signedOut(p) {
			t.Errorf("queue after the idle timeout: %d, want a redirect to sign in", p.code)
		}
		if keys := rs.sessionKeys(); len(keys) != 0 {
			t.Errorf("the idle session is still stored: %q", keys)
		}
	})
	t.Run("max age, however busy", func(t *testing.T) {
		rs := newReplicaSet(t, 2, true, func(c *console.Config) { c.IdleTimeout, c.MaxSessionAge = time.Hour, 3*time.Hour })
		b := rs.replicas[0].browser()
		b.signIn(alice)
		for i := range 5 { // 2h30m of use, on both replicas in turn
			rs.clock.advance(30 * time.Minute)
			if p := b.via(rs.replicas[i%2]).get("/console/t/acme/queue"); !signedInAs(p, alice) {
				t.Fatalf("queue after %v: %d, want it served", time.Duration(i+1)*30*time.Minute, p.code)
			}
		}
		rs.clock.advance(31 * time.Minute)
		if p := b.via(rs.replicas[1]).get("/console/t/acme/queue"); !signedOut(p) {
			t.Errorf("queue past the maximum age: %d, want a redirect to sign in", p.code)
		}
	})
	t.Run("idle, by the etcd lease", func(t *testing.T) {
		const idle = 2 * time.Second
		rs := newReplicaSet(t, 2, true, func(c *console.Config) { c.IdleTimeout = idle })
		busy, quiet := rs.replicas[0].browser(), rs.replicas[0].browser()
		busy.signIn(alice)
		quiet.signIn(bob)
		// Busy for twice the ttl, on both replicas: refreshed, it stays.
		for i := range 10 {
			time.Sleep(idle / 5)
			if p := busy.via(rs.replicas[i%2]).get("/console/t/acme/queue"); !signedInAs(p, alice) {
				t.Fatalf("busy session after %v: %d, want it served", time.Duration(i+1)*idle/5, p.code)
			}
		}
		// The quiet one was removed by etcd, the clock never moved.
		if keys := rs.sessionKeys(); len(keys) != 1 {
			t.Errorf("%d session keys after %v, want the busy one only: %q", len(keys), 2*idle, keys)
		}
		if p := quiet.via(rs.replicas[1]).get("/console/t/acme/queue"); !signedOut(p) {
			t.Errorf("queue of the session idle past its lease: %d, want a redirect to sign in", p.code)
		}
	})
}

// TestStoredSessionsRevealNoToken copies every key and value of etcd after
// reviewers signed in on both replicas: no bearer token, cookie or CSRF
// token is in it, in any of the forms they travel in, and neither a key
// nor a value signs anyone in when offered as the cookie.
func TestStoredSessionsRevealNoToken(t *testing.T) {
	rs := newReplicaSet(t, 2, true)
	var secrets []string
	for i, m := range []member{alice, bob} {
		b := rs.replicas[i].browser()
		q := b.signIn(m)
		u, _ := url.Parse(rs.replicas[i].web.URL)
		for _, c := range b.http.Jar.Cookies(u) {
			raw, err := base64.RawURLEncoding.DecodeString(c.Value)
			if err != nil {
				t.Fatalf("cookie %s=%q is not base64url: %v", c.Name, c.Value, err)
			}
			secrets = append(secrets, c.Value, string(raw), hex.EncodeToString(raw), base64.StdEncoding.EncodeToString(raw))
		}
		secrets = append(secrets, m.token, hex.EncodeToString([]byte(m.token)), base64.StdEncoding.EncodeToString([]byte(m.token)),
			access.HashToken(m.token), q.field(t, "csrf"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := rs.etcd.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	var sessions []string
	for _, kv := range all.Kvs {
		for _, s := range secrets {
			if strings.Contains(string(kv.Key), s) || strings.Contains(string(kv.Value), s) {
				t.Errorf("etcd key %q (value of %d bytes) holds %q", kv.Key, len(kv.Value), s)
			}
		}
		if name, ok := strings.CutPrefix(string(kv.Key), "/intentd/v1/console/s/"); ok {
			sessions = append(sessions, name, base64.RawURLEncoding.EncodeToString(kv.Value))
			if raw, err := hex.DecodeString(name); err == nil {
				sessions = append(sessions, base64.RawURLEncoding.EncodeToString(raw))
			}
		}
	}
	if len(sessions) != 2*3 {
		t.Fatalf("%d session values in etcd, want 2 sessions (alice's and bob's)", len(sessions)/3)
	}
	u, _ := url.Parse(rs.replicas[0].web.URL)
	for _, v := range sessions {
		b := rs.replicas[0].browser()
		b.http.Jar.SetCookies(u, []*http.Cookie{{Name: "intentd_console", Value: v, Path: "/console/"}})
		if p := b.get("/console/t/acme/queue"); !signedOut(p) {
			t.Errorf("the stored %q as a cookie: %d, want a redirect to sign in", v, p.code)
		}
	}
}

// TestSignInsAreBoundedAcrossReplicas: visitors who only open the sign-in
// form store nothing, and past the installation's bound of stored
// sessions a sign-in is refused with a page that says why, on every
// replica.
func TestSignInsAreBoundedAcrossReplicas(t *testing.T) {
	rs := newReplicaSet(t, 2, true)
	for range 20 {
		if p := rs.replicas[0].browser().get("/console/signin"); p.code != http.StatusOK {
			t.Fatalf("sign-in form: %d", p.code)
		}
	}
	if keys := rs.sessionKeys(); len(keys) != 0 {
		t.Fatalf("opening the sign-in form stored %d sessions, want none", len(keys))
	}
	signedIn := rs.replicas[0].browser()
	signedIn.signIn(alice)
	// Fill the store to the bound: other browsers' sessions, as opaque
	// values under well-formed names, a hundred to a transaction.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 1; i < 10_000; i += 100 {
		var puts []clientv3.Op
		for j := i; j < min(i+100, 10_000); j++ {
			puts = append(puts, clientv3.OpPut(fmt.Sprintf("/intentd/v1/console/s/%064x", j), "sealed"))
		}
		if _, err := rs.etcd.Txn(ctx).Then(puts...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for i, e := range rs.replicas {
		b := e.browser()
		form := b.get("/console/signin")
		p := b.post("/console/signin", url.Values{"csrf": {form.field(t, "csrf")}, "token": {bob.token}})
		if p.code != http.StatusServiceUnavailable || !strings.Contains(p.body, "Too many sessions") || !strings.Contains(p.body, "10000") {
			t.Errorf("replica %d: sign-in past the bound: %d, want 503 saying there are too many sessions:\n%s", i, p.code, p.body)
		}
	}
	if p := signedIn.via(rs.replicas[1]).get("/console/t/acme/queue"); !signedInAs(p, alice) {
		t.Errorf("a session from before the bound was reached: %d, want it served still", p.code)
	}
}

// TestDevSessionsRememberAcrossReplicas: without authentication, the name
// a reviewer gave and the message after a decision reach the replica the
// next request lands on.
func TestDevSessionsRememberAcrossReplicas(t *testing.T) {
	rs := newReplicaSet(t, 2, false)
	a, b := rs.replicas[0], rs.replicas[1]
	a.unknown("default", "refund-1", refund)
	a.unknown("default", "refund-2", refund)
	onA := a.browser()
	q := onA.follow("/console/")
	p := onA.get(intentLink(t, q, "refund-1"))
	action := decideAction.FindStringSubmatch(p.body)
	if action == nil {
		t.Fatalf("no decide form:\n%s", p.body)
	}
	form := url.Values{"csrf": {p.field(t, "csrf")}, "request_id": {p.field(t, "request_id")}, "expected_token": {p.field(t, "expected_token")},
		"decision": {"pending"}, "reason": {"confirmed absent"}, "actor": {"dana"}}
	d := onA.post(html.UnescapeString(action[1]), form)
	if d.code != http.StatusSeeOther {
		t.Fatalf("dev decision: %d:\n%s", d.code, d.body)
	}
	onB := onA.via(b)
	contains(t, "the page after the redirect, on the other replica", onB.get(d.h.Get("Location")), "Decided: PENDING, recorded as dana via the console.")
	next := onB.get(intentLink(t, onB.follow("/console/"), "refund-2"))
	if got := next.field(t, "actor"); got != "dana" {
		t.Errorf("the other replica's decide form asks for the name %q, want dana remembered", got)
	}
}

// TestDeletingTheSessionKeysSignsEveryoneOut: the runbook's way to end
// every session at once (etcdctl del --prefix <prefix>console/s/) ends
// them on every replica at the next request.
func TestDeletingTheSessionKeysSignsEveryoneOut(t *testing.T) {
	rs := newReplicaSet(t, 2, true)
	browsers := map[string]*browser{}
	for i, m := range []member{alice, bob, rita} {
		browsers[m.name] = rs.replicas[i%2].browser()
		browsers[m.name].signIn(m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rs.etcd.Delete(ctx, "/intentd/v1/console/s/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	for name, b := range browsers {
		for i, e := range rs.replicas {
			if p := b.via(e).get("/console/t/acme/queue"); !signedOut(p) {
				t.Errorf("%s on replica %d after the session keys were deleted: %d, want a redirect to sign in", name, i, p.code)
			}
		}
	}
}
