package fencing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
)

// Checker is what a downstream resource embeds to refuse superseded
// workers. Admit accepts t for resource only if t is not older than the
// highest token it has admitted for that resource, and then remembers t as
// the highest. Equal tokens are admitted: they are the same lease retrying.
//
// A resource name is whatever the resource guards as one unit (an order, an
// account, a file); tokens of different resources never meet.
//
// Admit alone is a check, not a guarded write: the resource must make the
// check and its write one step (see the package documentation).
//
// Admit returns an error matching ErrStale (a *StaleError) when t is older
// than the highest admitted, and an error matching ErrMalformed for the zero
// Token. Other errors (a cancelled context, an unreachable store) mean t was
// not admitted and the write must not happen.
type Checker interface {
	Admit(ctx context.Context, resource string, t Token) error
}

// ErrStale reports a token older than one a resource has already admitted:
// its lease was superseded, and the write it carries must be refused.
var ErrStale = errors.New("fencing: stale token")

// ErrMissing reports a request that carries no token where one is required.
var ErrMissing = errors.New("fencing: missing token")

// StaleError is the error a Checker returns for a stale token. It matches
// ErrStale with errors.Is, and it carries Highest so that the refused worker
// (or the operator reading the log) learns which token superseded it.
type StaleError struct {
	// Resource is the resource the write was for.
	Resource string
	// Token is the refused token.
	Token Token
	// Highest is the highest token the resource had admitted when it refused
	// Token; always larger than Token.
	Highest Token
}

// Error reports the refused and the current token.
func (e *StaleError) Error() string {
	return fmt.Sprintf("fencing: stale token %s for resource %q: highest admitted is %s",
		e.Token, e.Resource, e.Highest)
}

// Is reports whether target is ErrStale, so that errors.Is(err, ErrStale)
// holds for every *StaleError however it is wrapped.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// errZero is returned for an Admit of the zero Token, which no lease carries.
var errZero = fmt.Errorf("%w: zero token is never issued", ErrMalformed)

// MemoryChecker is an in-memory, goroutine-safe Checker for a resource that
// lives in a single process. It keeps one Token per resource name it has
// seen, and forgets them all when the process exits: a restarted resource
// will admit a stale token until it sees a newer one again. Its memory grows
// with the number of resource names and is never trimmed.
//
// The zero MemoryChecker is not usable; call NewMemoryChecker.
type MemoryChecker struct {
	mu      sync.Mutex
	highest map[string]Token
}

// NewMemoryChecker returns an empty MemoryChecker: every resource starts
// with no token admitted, so the first non-zero token is admitted.
func NewMemoryChecker() *MemoryChecker {
	return &MemoryChecker{highest: make(map[string]Token)}
}

var _ Checker = (*MemoryChecker)(nil)

// Admit admits t for resource if t is at least the highest token admitted
// for it so far, and records t as the new highest. It returns a *StaleError
// if t is older, an ErrMalformed error for the zero Token, and ctx.Err()
// without admitting if ctx is already done.
//
// A resource that wants its write guarded must hold its own lock across
// Admit and the write; MemoryChecker's lock covers the check only.
func (c *MemoryChecker) Admit(ctx context.Context, resource string, t Token) error {
	if t == 0 {
		return errZero
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.highest[resource]
	if t < h {
		return &StaleError{Resource: resource, Token: t, Highest: h}
	}
	c.highest[resource] = t
	return nil
}

// Highest returns the highest token admitted for resource, or the zero
// Token if none was.
func (c *MemoryChecker) Highest(resource string) Token {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.highest[resource]
}

// FromHeader reads the token a worker sent in h under Header. It returns an
// error matching ErrMissing if there is none, and one matching ErrMalformed
// if the value is not exactly one token's encoding; a request carrying the
// header more than once is malformed, since a resource must not pick one.
func FromHeader(h http.Header) (Token, error) {
	vs := h.Values(Header)
	switch len(vs) {
	case 0:
		return 0, fmt.Errorf("%w: no %s header", ErrMissing, Header)
	case 1:
		return Parse(vs[0])
	default:
		return 0, fmt.Errorf("%w: %d %s headers", ErrMalformed, len(vs), Header)
	}
}

// SetHeader puts t into h under Header, replacing any token already there.
// The zero Token means "no token", so SetHeader(h, 0) removes the header
// instead of sending a value every resource would refuse.
func SetHeader(h http.Header, t Token) {
	if t == 0 {
		h.Del(Header)
		return
	}
	h.Set(Header, t.String())
}
