package server

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// matrix says which roles may make each call; admin may make every call.
// It is the only place roles are enforced. Acquire with a registration
// inside also needs the approver role: a worker can never create approved
// terms.
var matrix = map[string][]access.Role{
	"Register":     {access.RoleApprover},
	"Cancel":       {access.RoleApprover},
	"OpenSession":  {access.RoleWorker},
	"CloseSession": {access.RoleWorker},
	"Heartbeat":    {access.RoleWorker},
	"Acquire":      {access.RoleWorker},
	"Complete":     {access.RoleWorker},
	"MarkUnknown":  {access.RoleWorker},
	"Release":      {access.RoleWorker},
	"Fail":         {access.RoleWorker},
	"Escalate":     {access.RoleWorker, access.RoleReviewer},
	"Resolve":      {access.RoleReviewer},
	"Get":          {access.RoleReviewer, access.RoleReader},
	"List":         {access.RoleReviewer, access.RoleReader},
	"Watch":        {access.RoleReviewer, access.RoleReader},
	"DeriveKey":    access.Roles,
	// The fencing gateway's calls, made with the worker's credentials.
	"BeginSubmission":  {access.RoleWorker},
	"RecordSubmission": {access.RoleWorker},
}

// Matrix returns the roles allowed to make method (a short RPC name), for
// documentation and tests.
func Matrix(method string) []access.Role { return matrix[method] }

// RateLimits bounds request rates per principal and per tenant; zero
// rates mean unlimited.
type RateLimits struct {
	PerPrincipal      rate.Limit
	PrincipalBurst    int
	PerTenant         rate.Limit
	TenantBurst       int
	MaxTrackedCallers int
}

// Guard authenticates, authorizes, scopes to a tenant and rate-limits every
// IntentService call. Health and reflection stay open.
type Guard struct {
	dir   func() *access.Directory // nil: authentication off (loopback development)
	log   *slog.Logger
	rates RateLimits
	byWho *lru.Cache[string, *rate.Limiter]
}

// NewGuard returns a Guard. dir returns the principals in force; nil turns
// authentication off, and every call is made by access.Anonymous.
func NewGuard(dir func() *access.Directory, rates RateLimits, log *slog.Logger) (*Guard, error) {
	size := rates.MaxTrackedCallers
	if size <= 0 {
		size = 10_000
	}
	byWho, err := lru.New[string, *rate.Limiter](size)
	if err != nil {
		return nil, err
	}
	return &Guard{dir: dir, log: log, rates: rates, byWho: byWho}, nil
}

// guarded selects the calls the Guard checks: the IntentService only.
var guarded = selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
	return c.Service == intentv1.IntentService_ServiceDesc.ServiceName
})

// Unary returns the guard's unary interceptors, in order.
func (g *Guard) Unary() []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{
		selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(g.authenticate), guarded),
		selector.UnaryServerInterceptor(g.authorizeUnary, guarded),
	}
}

// Stream returns the guard's stream interceptors, in order.
func (g *Guard) Stream() []grpc.StreamServerInterceptor {
	return []grpc.StreamServerInterceptor{
		selector.StreamServerInterceptor(auth.StreamServerInterceptor(g.authenticate), guarded),
		selector.StreamServerInterceptor(g.authorizeStream, guarded),
	}
}

type principalKey struct{}

// authenticate finds the caller's principal: a bearer token, else a
// verified client certificate. Failures are logged without secrets.
func (g *Guard) authenticate(ctx context.Context) (context.Context, error) {
	p, err := g.principal(ctx)
	if err != nil {
		method, _ := grpc.Method(ctx)
		addr := ""
		if pr, ok := peer.FromContext(ctx); ok {
			addr = pr.Addr.String()
		}
		g.log.Warn("authentication failed", "method", method, "peer", addr, "why", err.Error())
		return nil, toStatus(g.log, &unauthenticatedError{why: err.Error()})
	}
	ctx = context.WithValue(ctx, principalKey{}, p)
	return intent.WithPrincipal(ctx, p.Name), nil
}

func (g *Guard) principal(ctx context.Context) (*access.Principal, error) {
	if g.dir == nil {
		return access.Anonymous, nil
	}
	d := g.dir()
	token, err := auth.AuthFromMD(ctx, "bearer")
	if err == nil {
		if p, ok := d.ByToken(token); ok {
			return p, nil
		}
		return nil, fmt.Errorf("bearer token not recognized")
	}
	if c := verifiedClientCert(ctx); c != nil {
		if p, ok := d.ByCert(c); ok {
			return p, nil
		}
		return nil, fmt.Errorf("client certificate %q maps to no principal", c.Subject.CommonName)
	}
	return nil, fmt.Errorf("no credentials: send \"authorization: Bearer <token>\" or a client certificate")
}

// verifiedClientCert returns the client certificate TLS verified, if any.
func verifiedClientCert(ctx context.Context) *x509.Certificate {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}

func principalFrom(ctx context.Context) *access.Principal {
	p, _ := ctx.Value(principalKey{}).(*access.Principal)
	return p
}

func (g *Guard) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := g.authorize(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *Guard) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &checkedStream{ServerStream: ss, ctx: ss.Context(), g: g, method: info.FullMethod})
}

// checkedStream authorizes a server stream on its (only) request message;
// from then on its context carries the call's tenant.
type checkedStream struct {
	grpc.ServerStream
	ctx     context.Context
	g       *Guard
	method  string
	checked bool
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.checked {
		return nil
	}
	s.checked = true
	ctx, err := s.g.authorize(s.ctx, s.method, m)
	if err != nil {
		return err
	}
	s.ctx = ctx
	return nil
}

// authorize applies the role matrix, resolves the tenant the call acts in
// from the principal and the tenant the request names (resolveTenant),
// and applies the rate limits. It returns ctx carrying that tenant for the
// handler (callTenant), and changes nothing in req.
func (g *Guard) authorize(ctx context.Context, fullMethod string, req any) (context.Context, error) {
	tenant, scoped, err := g.refusal(ctx, fullMethod, req)
	if err != nil {
		return nil, toStatus(g.log, err)
	}
	if scoped {
		ctx = intent.WithTenant(ctx, tenant)
	}
	return ctx, nil
}

// refusal is why authorize refuses the call, or nil and the call's tenant
// (scoped false: a call that names none, DeriveKey).
func (g *Guard) refusal(ctx context.Context, fullMethod string, req any) (tenant string, scoped bool, err error) {
	p := principalFrom(ctx)
	if p == nil {
		return "", false, &unauthenticatedError{}
	}
	method := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	if !p.Has(access.RoleAdmin) && !slices.ContainsFunc(matrix[method], p.Has) {
		return "", false, denied(p, method, fmt.Sprintf("%s needs one of the roles %v", method, matrix[method]))
	}
	if a, ok := req.(*intentv1.AcquireRequest); ok && a.GetRegister() != nil && !p.Has(access.RoleApprover) {
		return "", false, denied(p, method, "registering inside Acquire needs the approver role: a worker cannot create approved terms")
	}
	if r, ok := req.(tenantScoped); ok {
		if tenant, err = resolveTenant(p, r.GetTenant()); err != nil {
			return "", false, err
		}
		scoped = true
	}
	return tenant, scoped, g.limit(p, tenant)
}

func denied(p *access.Principal, method, why string) error {
	return &deniedError{principal: p.Name, method: method, why: why}
}

// tenantScoped is a request that names the tenant it acts in: every
// IntentService request but DeriveKeyRequest.
type tenantScoped interface{ GetTenant() string }

// resolveTenant is the tenant a call of principal p acts in, given the
// tenant its request names, and the one place a tenant is defaulted: empty
// becomes p's only tenant, else "default" when p belongs to it (with
// authentication off, p is access.Anonymous, member of every tenant: empty
// is "default"); a principal of several tenants must name one. A tenant p
// does not belong to is refused. Nested registrations (an Acquire's, a
// Complete's children) act in the same tenant (validate.go).
func resolveTenant(p *access.Principal, named string) (string, error) {
	tenant := named
	if tenant == "" {
		switch {
		case len(p.Tenants) == 1 && p.Tenants[0] != access.AllTenants:
			tenant = p.Tenants[0]
		case p.InTenant(intent.DefaultTenant):
			tenant = intent.DefaultTenant
		default:
			return "", &tenantError{&intent.InvalidError{Field: "tenant", Reason: "required: the principal belongs to several tenants"}}
		}
	}
	if !p.InTenant(tenant) {
		return "", denied(p, "", fmt.Sprintf("not a member of tenant %q", tenant))
	}
	return tenant, nil
}

// callTenant is the tenant a call acts in: the one the guard resolved
// from the caller's credentials, carried in ctx (intent.WithTenant). A
// server run without the
// guard (package server's own tests, intentdtest.Serve) resolves it as the
// guard does with authentication off, for access.Anonymous: named, or
// "default" when empty.
func callTenant(ctx context.Context, named string) string {
	if tenant, ok := intent.TenantFrom(ctx); ok {
		return tenant
	}
	tenant, _ := resolveTenant(access.Anonymous, named)
	return tenant
}

// limit spends one request from the principal's and the tenant's buckets,
// so that one noisy caller or tenant cannot starve the others. A refused
// request spends from neither.
func (g *Guard) limit(p *access.Principal, tenant string) error {
	type bucket struct {
		key   string
		limit rate.Limit
		burst int
	}
	buckets := []bucket{{"principal:" + p.Name, g.rates.PerPrincipal, g.rates.PrincipalBurst}}
	if tenant != "" {
		buckets = append(buckets, bucket{"tenant:" + tenant, g.rates.PerTenant, g.rates.TenantBurst})
	}
	var taken []*rate.Reservation
	for _, b := range buckets {
		if b.limit <= 0 {
			continue
		}
		l, ok := g.byWho.Get(b.key)
		if !ok {
			l = rate.NewLimiter(b.limit, max(b.burst, 1))
			g.byWho.Add(b.key, l)
		}
		res := l.Reserve()
		if d := res.Delay(); d > 0 {
			res.Cancel()
			for _, t := range taken {
				t.Cancel()
			}
			// The delay to the next token is often a fraction of a
			// millisecond: rounded down it read "retry in 0s". Round up to
			// whole milliseconds, the same in the text and the RetryInfo.
			retry := d.Truncate(time.Millisecond)
			if retry < d {
				retry += time.Millisecond
			}
			return &rateLimitedError{limit: b.key, retry: retry}
		}
		taken = append(taken, res)
	}
	return nil
}
