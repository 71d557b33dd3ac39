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
