// Package console is intentd's review console: web pages, served on the
// HTTP listener under /console/, for the people who decide what a worker
// could not — an outcome left UNKNOWN, an intent sent to NEEDS_REVIEW.
//
// The console has no state machine and no store of its own: every page is
// made of IntentService calls (List, Get, Resolve, Watch) on intentd's own
// gRPC server, in process, carrying the signed-in principal's bearer token.
// Authentication, roles, tenant isolation, validation, rate limits and the
// error table therefore apply exactly as they do to any API caller, and a
// decision made here differs from one made through Resolve only in its
// history entry's channel ("console").
//
// Sessions live in intentd's store (SessionStore: etcd), not in a
// replica's memory, so behind a load balancer a reviewer stays signed in
// whichever replica answers, a restart signs nobody out, and signing out
// (or a token leaving the tokens file) ends the session on every replica
// at once. The cookie holds a random 256-bit secret; the store holds the
// session sealed (AES-GCM) under a key derived from that secret, named by
// the secret's SHA-256, so a copy of etcd holds no bearer token and
// nothing that signs anyone in (see session.go).
//
// What it does not guarantee: the HTTP listener is plaintext, so a token
// typed into the sign-in form crosses the network in the clear unless the
// listener is on loopback or behind a TLS-terminating proxy; signing in
// with a client certificate is not offered, since the listener does not
// serve TLS. The limit on wrong tokens per address is per replica. The
// overview's refusals and unknown-outcome chart are what this replica saw
// since it started (see Activity).
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// Path is where the console is mounted on the HTTP listener.
const Path = "/console/"

// Channel is what the console's decisions record as their channel.
const Channel = "console"

//go:embed templates/*.html static/*
var files embed.FS

// Config is what the console is built from.
type Config struct {
	// Service is intentd's IntentService, called in process.
	Service intentv1.IntentServiceClient
	// Sessions keeps the sign-in sessions, shared by every replica.
	Sessions SessionStore
	// Directory returns the principals in force (the tokens file); nil
	// means authentication is off, and every visitor acts as the
	// anonymous admin, as every API caller then does.
	Directory func() *access.Directory
	// Activity feeds the overview's refusals and chart; nil: none shown.
	Activity *Activity
	// Tiers feeds the overview's storage section, shown to admins only
	// (its figures are the cluster's, across tenants); nil: not shown.
	Tiers func() Tiers
	// IdleTimeout ends a session after this long without a request;
	// MaxSessionAge ends it this long after it began, however busy.
	IdleTimeout, MaxSessionAge time.Duration
	// CallTimeout bounds each API call a page makes.
	CallTimeout time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	Log *slog.Logger
}

// DefaultConfig returns the defaults: sessions end after 30 minutes idle
// or 8 hours in all, calls time out after 10 seconds.
func DefaultConfig() Config {
	return Config{IdleTimeout: 30 * time.Minute, MaxSessionAge: 8 * time.Hour, CallTimeout: 10 * time.Second}
}

// Validate checks the fields and how they relate.
func (c Config) Validate() error {
	switch {
	case c.Service == nil:
		return errors.New("console: Service is required")
	case c.Sessions == nil:
		return errors.New("console: Sessions is required")
	case c.IdleTimeout <= 0 || c.MaxSessionAge <= 0:
		return fmt.Errorf("console: IdleTimeout %v and MaxSessionAge %v must be positive", c.IdleTimeout, c.MaxSessionAge)
	case c.IdleTimeout > c.MaxSessionAge:
		return fmt.Errorf("console: IdleTimeout %v is longer than MaxSessionAge %v", c.IdleTimeout, c.MaxSessionAge)
	case c.CallTimeout <= 0:
		return fmt.Errorf("console: CallTimeout %v must be positive", c.CallTimeout)
	}
	return nil
}

// Console serves the review console's pages.
type Console struct {
	cfg      Config
	sessions *sessions
	failures *signinFailures
	pages    map[string]*template.Template
	handler  http.Handler
}

// New returns the console for cfg.
func New(cfg Config) (*Console, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, sessions: newSessions(cfg.Sessions, cfg.IdleTimeout, cfg.MaxSessionAge, cfg.Now, cfg.Log), failures: newSigninFailures(), pages: map[string]*template.Template{}}
	for _, p := range []string{"signin", "queue", "intent", "overview", "problem"} {
		t, err := template.New(p).Funcs(funcs(cfg.Now)).ParseFS(files, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", p, err)
		}
		c.pages[p] = t
	}
	static, err := fs.Sub(files, "static")
	if err != nil {
		return nil, err
	}
	mux := c.routes(static)
	// Cross-origin POSTs are refused before any handler (Sec-Fetch-Site
	// and Origin), in addition to each form's CSRF token.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.problem(w, r, c.who(w, r), http.StatusForbidden, "Refused: cross-origin request", "The form was not sent from this console's own pages, so it was not acted on.")
	}))
	c.handler = securityHeaders(cop.Handler(c.withSession(mux)))
	return c, nil
}

// routes are the console's pages. Every path is fixed but a tenant's
// name (whose alphabet has nothing a path would normalise): the key of an
// intent is in the query, never in the path (see keyURL), so a path that
// once held a key (intents/..., decide/...) is not found.
func (c *Console) routes(static fs.FS) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET "+Path+"static/", http.StripPrefix(Path+"static/", cacheFor(time.Hour, http.FileServerFS(static))))
	mux.HandleFunc("GET "+Path+"{$}", c.home)
	mux.HandleFunc("GET "+Path+"signin", c.signinForm)
	mux.HandleFunc("POST "+Path+"signin", c.signin)
	mux.HandleFunc("POST "+Path+"signout", c.signout)
	mux.HandleFunc("GET "+Path+"t/{tenant}/{$}", c.tenantHome)
	mux.HandleFunc("GET "+Path+"t/{tenant}/queue", c.signedIn(c.queue))
	mux.HandleFunc("GET "+Path+"t/{tenant}/overview", c.signedIn(c.overview))
	mux.HandleFunc("GET "+Path+"t/{tenant}/intent", c.signedIn(c.intentPage))
	mux.HandleFunc("POST "+Path+"t/{tenant}/decide", c.signedIn(c.decide))
	mux.HandleFunc("GET "+Path+"t/{tenant}/live", c.signedIn(c.live))
	mux.HandleFunc(Path, func(w http.ResponseWriter, r *http.Request) {
		// Signed in, the page still offers signing out.
		c.problem(w, r, c.who(w, r), http.StatusNotFound, "Not found", "There is no such page in the console.")
	})
	return mux
}

// ServeHTTP serves the console; mount it at Path.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

// securityHeaders sets what every console response carries: no caching of
// pages that show intents, no framing, no inline script or style, no
// referrer leaving the console.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, Path+"static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

func cacheFor(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", fmt.Sprintf("private, max-age=%d", int(d/time.Second)))
		next.ServeHTTP(w, r)
	})
}

// viewer is who is looking: the principal (Anonymous without
// authentication) and the session that carries the token.
type viewer struct {
	p  *access.Principal
	s  *session
	on bool // authentication is on
}

// call returns the context of one API call made for v.
func (c *Console) call(r *http.Request, v *viewer) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.CallTimeout)
	return withToken(ctx, v), cancel
}

// withToken makes ctx's calls carry v's bearer token, if v has one.
func withToken(ctx context.Context, v *viewer) context.Context {
	if v.s.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+v.s.token)
}

// mayDecide reports whether v's roles allow Resolve (the API checks again).
func (v *viewer) mayDecide() bool { return v.p.Has(access.RoleReviewer) }

// mayUse reports whether p's roles let it use the console at all: every
// page is made of Get, List and Watch, which the reviewer and reader roles
// may call (and admin, which may call everything), the approver and worker
// roles may not.
func mayUse(p *access.Principal) bool { return p.Has(access.RoleReviewer) || p.Has(access.RoleReader) }

// whoMayUse is the sentence the sign-in page says, and the refusal of a
// token whose roles may not use the console.
const whoMayUse = "The console is for the reviewer role (read and decide), the reader role (read only) and the admin role; a token with only the approver or worker role cannot use it."

// homeTenant is the tenant v lands in: its only tenant, else "default".
func (v *viewer) homeTenant() string {
	if len(v.p.Tenants) > 0 && v.p.Tenants[0] != access.AllTenants {
		return v.p.Tenants[0]
	}
	return intent.DefaultTenant
}

// tenants are the tenants v may switch between; nil when v may name any.
func (v *viewer) tenants() []string {
	if v.p.InTenant(access.AllTenants) && len(v.p.Tenants) == 1 && v.p.Tenants[0] == access.AllTenants {
		return nil
	}
	return v.p.Tenants
}

// who finds the viewer of r. Without authentication every visitor gets a
// session (for its CSRF token) and acts as access.Anonymous. With it, a
// session without a token, or whose token the tokens file no longer lists
// (revoked since: the session ends on every replica), is not signed in:
// nil.
func (c *Console) who(w http.ResponseWriter, r *http.Request) *viewer {
	ss := c.sessions.get(r)
	if c.cfg.Directory == nil {
		if ss == nil {
			ss = c.sessions.create(w, r, "") // a visitor's: stores nothing, never nil
		}
		return &viewer{p: access.Anonymous, s: ss}
	}
	if ss == nil || ss.token == "" {
		return nil
	}
	p, ok := c.cfg.Directory().ByToken(ss.token)
	if !ok {
		_ = c.sessions.end(w, r, ss)
		return nil
	}
	return &viewer{p: p, s: ss, on: true}
}

// signedIn runs h for a signed-in viewer of a tenant it belongs to;
// others go to the sign-in page (GET) or are refused (POST). A tenant the
// viewer does not belong to is not found, as if it did not exist: the
// console says no more of other tenants than the API does.
func (c *Console) signedIn(h func(http.ResponseWriter, *http.Request, *viewer, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := c.who(w, r)
		if v == nil {
			if r.Method != http.MethodGet || r.URL.Path == Path+"t/"+r.PathValue("tenant")+"/live" {
				c.problem(w, r, nil, http.StatusUnauthorized, "Signed out", "Your session ended. Sign in again; nothing was changed.")
				return
			}
			http.Redirect(w, r, Path+"signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if !mayUse(v.p) {
			// The tokens file took the roles away since signing in: every
			// page would be a refusal, so the session ends here.
			if !c.endSession(w, r, v.s) {
				return
			}
			c.problem(w, r, nil, http.StatusForbidden, "Signed out: your roles do not allow the console", whoMayUse)
			return
		}
		tenant := r.PathValue("tenant")
		if intent.ValidateTenant(tenant) != nil || !v.p.InTenant(tenant) {
			c.notFound(w, r, v)
			return
		}
		h(w, r, v, tenant)
	}
}

// home sends the viewer to a tenant's queue: the one the tenant switch
// names (?tenant=, without script), else its home tenant.
func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	v := c.who(w, r)
	if v == nil {
		http.Redirect(w, r, Path+"signin", http.StatusSeeOther)
		return
	}
	tenant := strings.TrimSpace(r.URL.Query().Get("tenant"))
	if intent.ValidateTenant(tenant) != nil {
		tenant = v.homeTenant()
	}
	http.Redirect(w, r, tenantPath(tenant)+"queue", http.StatusSeeOther)
}

func (c *Console) tenantHome(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, tenantPath(r.PathValue("tenant"))+"queue", http.StatusSeeOther)
}

func tenantPath(tenant string) string { return Path + "t/" + url.PathEscape(tenant) + "/" }

// keyURL is the URL of one of the console's pages about one intent:
// "intent" (its page), "decide" (where its decide form posts) or "live"
// (its event stream). Every link, redirect and form action that names an
// intent is built here. The key is in the query, escaped by
// url.QueryEscape, never in the path: keys are opaque and may be "." or
// "..", or hold "//", "/../" or a trailing "/", and a path is normalised
// on its way (browsers remove dot segments, %2e forms included; ServeMux
// redirects to the clean path), so that a key in the path could name
// another intent or none. Nothing normalises a query value.
func keyURL(tenant, page, key string) string {
	return tenantPath(tenant) + page + "?key=" + url.QueryEscape(key)
}

// intentURL is the intent page of key.
func intentURL(tenant, key string) string { return keyURL(tenant, "intent", key) }

// decideURL is where the decide form of key posts.
func decideURL(tenant, key string) string { return keyURL(tenant, "decide", key) }

// liveURL is the event stream of key's changes after revision from.
func liveURL(tenant, key string, from int64) string {
	return keyURL(tenant, "live", key) + "&from=" + strconv.FormatInt(from, 10)
}

// keyOf is the key a request names: its query's, as keyURL puts it (a
// POST's too: its form's fields are not looked at for it).
func keyOf(r *http.Request) string { return r.URL.Query().Get("key") }

// page is what every template gets.
type page struct {
	Title   string
	Viewer  *viewer
	Tenant  string
	Tenants []string
	Nav     string // which nav entry is current
	Flash   string
	Data    any
}

// Dev reports whether authentication is off.
func (p page) Dev() bool { return p.Viewer != nil && !p.Viewer.on }

// CSRF is the token every form carries.
func (p page) CSRF() string {
	if p.Viewer == nil {
		return ""
	}
	return p.Viewer.s.csrf
}

// Principal names the viewer. The tokens file allows any name: the page
// isolates it (.who strong in the stylesheet) and balanced keeps a stray
// U+2069 in it from ending that isolation.
func (p page) Principal() string {
	if p.Viewer == nil {
		return ""
	}
	return balanced(p.Viewer.p.Name)
}

// Roles lists the viewer's roles.
func (p page) Roles() string {
	if p.Viewer == nil {
		return ""
	}
	var rs []string
	for _, r := range p.Viewer.p.Roles {
		rs = append(rs, string(r))
	}
	return strings.Join(rs, ", ")
}

// AnyTenant reports whether the viewer may name any tenant.
func (p page) AnyTenant() bool { return p.Viewer != nil && p.Viewer.tenants() == nil }

// Base is the tenant's path prefix.
func (p page) Base() string { return tenantPath(p.Tenant) }

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	if p.Viewer != nil && p.Flash == "" {
		p.Flash = c.sessions.takeFlash(p.Viewer.s)
	}
	if p.Viewer != nil && p.Tenant != "" {
		p.Tenants = p.Viewer.tenants()
	}
	var b strings.Builder
	if err := c.pages[name].ExecuteTemplate(&b, "layout", p); err != nil {
		c.cfg.Log.Error("console: rendering a page failed", "page", name, "err", err)
		http.Error(w, "the console could not render this page; see intentd's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// problemData is the problem page's content.
type problemData struct {
	Heading, Text string
	Back          string
}

func (c *Console) problem(w http.ResponseWriter, r *http.Request, v *viewer, status int, heading, text string) {
	// The way back is the viewer's own queue, whatever the URL named: a
	// link that followed the URL's tenant would tell a foreign tenant's
	// not-found from a missing intent's.
	back := ""
	if v != nil && mayUse(v.p) {
		back = tenantPath(v.homeTenant()) + "queue"
	}
	c.render(w, r, status, "problem", page{Title: heading, Viewer: v, Data: problemData{Heading: heading, Text: text, Back: back}})
}

// notFound is the one answer for an intent or tenant that is not there or
// not the viewer's: the two must read the same.
func (c *Console) notFound(w http.ResponseWriter, r *http.Request, v *viewer) {
	c.problem(w, r, v, http.StatusNotFound, "Not found", "There is no such intent or tenant, or it is not yours to see.")
}
