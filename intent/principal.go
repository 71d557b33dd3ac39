package intent

import "context"

type principalKey struct{}

// WithPrincipal returns a context that carries the name of the
// authenticated caller, so that every history entry a call writes records
// who made it.
func WithPrincipal(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, principalKey{}, name)
}

// PrincipalFrom returns the authenticated caller's name, or "" when the
// call carries none.
func PrincipalFrom(ctx context.Context) string {
	name, _ := ctx.Value(principalKey{}).(string)
	return name
}

type tenantKey struct{}

// WithTenant returns a context that carries the tenant a call acts in, as
// the server's guard resolved it from the caller's credentials and the
// tenant the request names (the request itself is left as it came).
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the tenant a call acts in, and false when the call
// carries none (a call that names no tenant, DeriveKey, or a server run
// without the guard).
func TenantFrom(ctx context.Context) (string, bool) {
	tenant, ok := ctx.Value(tenantKey{}).(string)
	return tenant, ok
}
