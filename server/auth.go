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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

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
	if err := g.authorize(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *Guard) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &checkedStream{ServerStream: ss, g: g, method: info.FullMethod})
}

// checkedStream authorizes a server stream on its (only) request message.
type checkedStream struct {
	grpc.ServerStream
	g       *Guard
	method  string
	checked bool
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.checked {
		return nil
	}
	s.checked = true
	return s.g.authorize(s.Context(), s.method, m)
}

// authorize applies the role matrix, scopes the request to a tenant the
// principal belongs to (filling in the tenant when the principal has one),
// and applies the rate limits.
func (g *Guard) authorize(ctx context.Context, fullMethod string, req any) error {
	return toStatus(g.log, g.refusal(ctx, fullMethod, req))
}

// refusal is why authorize refuses the call, or nil.
func (g *Guard) refusal(ctx context.Context, fullMethod string, req any) error {
	p := principalFrom(ctx)
	if p == nil {
		return &unauthenticatedError{}
	}
	method := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	if !p.Has(access.RoleAdmin) && !slices.ContainsFunc(matrix[method], p.Has) {
		return denied(p, method, fmt.Sprintf("%s needs one of the roles %v", method, matrix[method]))
	}
	if a, ok := req.(*intentv1.AcquireRequest); ok && a.GetRegister() != nil && !p.Has(access.RoleApprover) {
		return denied(p, method, "registering inside Acquire needs the approver role: a worker cannot create approved terms")
	}
	tenant, err := scope(p, req)
	if err != nil {
		return err
	}
	return g.limit(p, tenant)
}

func denied(p *access.Principal, method, why string) error {
	return &deniedError{principal: p.Name, method: method, why: why}
}

// scope resolves the request's tenant from the principal: empty becomes
// the principal's only tenant (with several, the request must name one);
// a tenant the principal does not belong to is refused. Nested tenants
// (an Acquire's registration, a Complete's children) follow.
func scope(p *access.Principal, req any) (string, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", nil
	}
	msg := m.ProtoReflect()
	fd := msg.Descriptor().Fields().ByName("tenant")
	if fd == nil {
		return "", nil // DeriveKey: no tenant involved
	}
	tenant := msg.Get(fd).String()
	if tenant == "" {
		switch {
		case len(p.Tenants) == 1 && p.Tenants[0] != access.AllTenants:
			tenant = p.Tenants[0]
		case p.InTenant(intent.DefaultTenant):
			tenant = intent.DefaultTenant
		default:
			return "", &tenantError{&intent.InvalidError{Field: "tenant", Reason: "required: the principal belongs to several tenants"}}
		}
		msg.Set(fd, protoreflect.ValueOfString(tenant))
	}
	if !p.InTenant(tenant) {
		return "", denied(p, "", fmt.Sprintf("not a member of tenant %q", tenant))
	}
	switch r := req.(type) {
	case *intentv1.AcquireRequest:
		if r.GetRegister() != nil && r.GetRegister().GetTenant() == "" {
			r.Register.Tenant = tenant
		}
	case *intentv1.CompleteRequest:
		for _, c := range r.GetChildren() {
			if c.GetTenant() == "" {
				c.Tenant = tenant
			}
		}
	}
	return tenant, nil
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
