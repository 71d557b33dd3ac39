package console_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/console"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/internal/testing/intentdtest"
	"github.com/intentd/intentd/server"
)

// member is a principal of the test tokens file.
type member struct {
	name    string
	tenants []string
	roles   []access.Role
	token   string
}

var (
	alice  = member{"alice", []string{"acme"}, []access.Role{access.RoleReviewer}, "tok-alice"}
	bob    = member{"bob", []string{"acme"}, []access.Role{access.RoleReviewer}, "tok-bob"}
	rita   = member{"rita", []string{"acme"}, []access.Role{access.RoleReader}, "tok-rita"}
	gina   = member{"gina", []string{"globex"}, []access.Role{access.RoleReviewer}, "tok-gina"}
	ops    = member{"ops", []string{access.AllTenants}, []access.Role{access.RoleAdmin}, "tok-ops"}
	worker = member{"worker-svc", []string{"acme", "globex"}, []access.Role{access.RoleWorker, access.RoleApprover}, "tok-worker"}
)

func directory(t *testing.T, members ...member) *access.Directory {
	t.Helper()
	var f access.File
	for _, m := range members {
		f.Principals = append(f.Principals, access.Entry{Name: m.name, Tenants: m.tenants, Roles: m.roles, TokenSHA256: []string{access.HashToken(m.token)}})
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	d, err := access.Parse(b)
	if err != nil {
		t.Fatalf("access.Parse: %v", err)
	}
	return d
}

// env is one intentd as the daemon builds it, reduced to what the console
// needs: a store on a real etcd, the IntentService behind the guard (the
// interceptors intentd runs that decide who may do what), the console on a
// client of it, served by httptest.
type env struct {
	t       *testing.T
	api     intentv1.IntentServiceClient
	web     *httptest.Server
	clock   *clock
	dirMu   sync.Mutex
	dir     *access.Directory
	auth    bool
	consCfg console.Config
}

// clock is a settable clock for session expiry.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.off) }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// newEnv starts an environment; auth false runs it without a tokens
// file, as `go run ./cmd/intentd` does.
func newEnv(t *testing.T, auth bool, configure ...func(*console.Config)) *env {
	t.Helper()
	e := &env{t: t, clock: &clock{}, auth: auth}
	log := slog.New(slog.DiscardHandler)
	var dirFn func() *access.Directory
	if auth {
		e.dir = directory(t, alice, bob, rita, gina, ops, worker)
		dirFn = func() *access.Directory { e.dirMu.Lock(); defer e.dirMu.Unlock(); return e.dir }
	}
	e.serve(etcdtest.Start(t), dirFn, log, configure...)
	return e
}

// serve starts e's intentd on etcd: a store, the IntentService behind the
// guard, and the console on a client of it (its sessions in etcd, as
// intentd keeps them), served by httptest. Replicas are envs served on
// one etcd.
func (e *env) serve(etcd *etcdtest.Server, dirFn func() *access.Directory, log *slog.Logger, configure ...func(*console.Config)) {
	t := e.t
	t.Helper()
	guard, err := server.NewGuard(dirFn, server.RateLimits{}, log)
	if err != nil {
		t.Fatal(err)
	}
	activity := console.NewActivity(nil)
	in := intentdtest.Serve(t, etcd, etcdstore.DefaultConfig(),
		grpc.ChainUnaryInterceptor(append(guard.Unary(), activity.Unary())...),
		grpc.ChainStreamInterceptor(guard.Stream()...))
	e.api = intentv1.NewIntentServiceClient(in.Dial(t))
	cfg := console.DefaultConfig()
	cfg.Service, cfg.Sessions, cfg.Directory, cfg.Activity, cfg.Now, cfg.Log = e.api, in.Store.ConsoleSessions(), dirFn, activity, e.clock.Now, log
	for _, f := range configure {
		f(&cfg)
	}
	c, err := console.New(cfg)
	if err != nil {
		t.Fatalf("console.New: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Path, c)
	e.web = httptest.NewServer(mux)
	t.Cleanup(e.web.Close)
}

// ctx is a call context as m (or, without authentication, as anyone).
func (e *env) ctx(m member) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e.t.Cleanup(cancel)
	if e.auth {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.token)
	}
	return ctx
}

// seed is an intent a worker left UNKNOWN: registered, acquired, marked
// unknown. It returns the worker's session and token.
type seeded struct {
	key, session string
	token        uint64
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	p, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

var nextPage = regexp.MustCompile(`href="([^"]*page=[^"]+)" rel="next"`)

// unknown registers key (each of also changes the request first: a
// description, other labels; an empty key with an identity is derived)
// and leaves it UNKNOWN.
func (e *env) unknown(tenant, key string, params map[string]any, also ...func(*intentv1.RegisterRequest)) seeded {
	e.t.Helper()
	ctx := e.ctx(worker)
	req := &intentv1.RegisterRequest{Tenant: tenant, Key: key, Params: mustStruct(e.t, params), Labels: map[string]string{"customer": "c-17"}}
	for _, f := range also {
		f(req)
	}
	reg, err := e.api.Register(ctx, req)
	if err != nil {
		e.t.Fatalf("Register(%s/%s): %v", tenant, key, err)
	}
	key = reg.GetIntent().GetKey()
	s, err := e.api.OpenSession(ctx, &intentv1.OpenSessionRequest{Tenant: tenant, Worker: "worker-a"})
	if err != nil {
		e.t.Fatalf("OpenSession: %v", err)
	}
	a, err := e.api.Acquire(ctx, &intentv1.AcquireRequest{Tenant: tenant, Key: key, SessionId: s.GetSessionId(), RequestId: key + "-1"})
	if err != nil || a.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
		e.t.Fatalf("Acquire(%s): %v %v, want EXECUTE", key, a.GetOutcome(), err)
	}
	if _, err := e.api.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Tenant: tenant, Key: key, Token: a.GetLease().GetToken(), Reason: "payment provider timed out"}); err != nil {
		e.t.Fatalf("MarkUnknown(%s): %v", key, err)
	}
	return seeded{key: key, session: s.GetSessionId(), token: a.GetLease().GetToken()}
}

func (e *env) get(tenant, key string) *intentv1.Intent {
	e.t.Helper()
	resp, err := e.api.Get(e.ctx(ops), &intentv1.GetRequest{Tenant: tenant, Key: key})
	if err != nil {
		e.t.Fatalf("Get(%s/%s): %v", tenant, key, err)
	}
	return resp.GetIntent()
}

var refund = map[string]any{"order": "SO-1042", "amount_cents": 8900, "currency": "EUR"}

// browser is one person's browser: a cookie jar, no automatic redirects
// (tests look at each answer).
type browser struct {
	t    *testing.T
	e    *env
	http *http.Client
}

func (e *env) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: e.t, e: e, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// page is one answer, its body read.
type page struct {
	code int
	body string
	h    http.Header
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	resp, err := b.http.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{code: resp.StatusCode, body: string(body), h: resp.Header}
}

func (b *browser) get(path string) page {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.e.web.URL+path, nil)
	return b.do(req)
}

// follow GETs path and follows redirects within the console.
func (b *browser) follow(path string) page {
	b.t.Helper()
	for range 5 {
		p := b.get(path)
		if p.code != http.StatusSeeOther && p.code != http.StatusFound {
			return p
		}
		path = p.h.Get("Location")
	}
	b.t.Fatalf("too many redirects from %s", path)
	return page{}
}

// post sends a form as a browser on the console's own page would: with
// its Origin.
func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.e.web.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.e.web.URL)
	return b.do(req)
}

var (
	csrfRe  = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	fieldRe = func(name string) *regexp.Regexp { return regexp.MustCompile(`name="` + name + `" value="([^"]*)"`) }
)

// field is the value of the hidden input name in p.
func (p page) field(t *testing.T, name string) string {
	t.Helper()
	m := fieldRe(name).FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no input %q in the page:\n%s", name, p.body)
	}
	return m[1]
}

// intentURL is the intent page of key as a browser asks for it, and
// decideURL where its form posts: the key in the query.
func intentURL(tenant, key string) string {
	return "/console/t/" + tenant + "/intent?key=" + url.QueryEscape(key)
}

func decideURL(tenant, key string) string {
	return "/console/t/" + tenant + "/decide?key=" + url.QueryEscape(key)
}

// signIn signs b in as m and returns the page it lands on.
func (b *browser) signIn(m member) page {
	b.t.Helper()
	form := b.get("/console/signin")
	if form.code != http.StatusOK {
		b.t.Fatalf("GET /console/signin: %d", form.code)
	}
	p := b.post("/console/signin", url.Values{"csrf": {form.field(b.t, "csrf")}, "token": {m.token}})
	if p.code != http.StatusSeeOther {
		b.t.Fatalf("sign in as %s: %d, want 303:\n%s", m.name, p.code, p.body)
	}
	return b.follow(p.h.Get("Location"))
}

// decideForm is the form fields of the intent page of key, as the page
// renders them, with the decision's own fields added.
func (b *browser) decideForm(tenant, key string, fields url.Values) (url.Values, page) {
	b.t.Helper()
	p := b.get(intentURL(tenant, key))
	if p.code != http.StatusOK {
		b.t.Fatalf("intent page of %s: %d\n%s", key, p.code, p.body)
	}
	form := url.Values{"csrf": {p.field(b.t, "csrf")}, "request_id": {"posted-anyway"}}
	if fieldRe("request_id").MatchString(p.body) { // no form for a reader
		form.Set("request_id", p.field(b.t, "request_id"))
		form.Set("expected_token", p.field(b.t, "expected_token"))
	}
	for k, v := range fields {
		form[k] = v
	}
	return form, p
}
