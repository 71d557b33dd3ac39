// Package access knows who may call intentd: principals, their tenants and
// roles, and how a caller proves to be one — a bearer token, whose SHA-256
// is all the tokens file stores, or a client certificate whose identity the
// same file maps to a principal.
//
// Recognizing a caller is not authority to spend: roles say what a
// principal may do (server/auth.go enforces the matrix), and tenants say
// which intents it may see at all.
package access

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/intentd/intentd/intent"
)

// Role is a set of calls a principal may make.
type Role string

// The roles. A worker can never create or change approved terms; an
// approver cannot act on them.
const (
	RoleApprover Role = "approver" // Register, Cancel
	RoleWorker   Role = "worker"   // sessions, Acquire, reports, Escalate
	RoleReviewer Role = "reviewer" // Resolve, Escalate, Get, List, Watch
	RoleReader   Role = "reader"   // Get, List, Watch, DeriveKey
	RoleAdmin    Role = "admin"    // everything
)

// Roles lists every role.
var Roles = []Role{RoleApprover, RoleWorker, RoleReviewer, RoleReader, RoleAdmin}

// AllTenants, as a principal's only tenant, lets it name any tenant: for
// operators, and for intentd running without authentication.
const AllTenants = "*"

// Principal is an authenticated caller.
type Principal struct {
	Name    string
	Tenants []string
	Roles   []Role
}

// Anonymous is the principal of every call when authentication is off:
// intentd on loopback for development.
var Anonymous = &Principal{Name: "anonymous", Tenants: []string{AllTenants}, Roles: []Role{RoleAdmin}}

// Has reports whether p holds role r (admin holds every role).
func (p *Principal) Has(r Role) bool {
	return slices.Contains(p.Roles, r) || slices.Contains(p.Roles, RoleAdmin)
}

// InTenant reports whether p may act in tenant t.
func (p *Principal) InTenant(t string) bool {
	return slices.Contains(p.Tenants, AllTenants) || slices.Contains(p.Tenants, t)
}

// Entry is one principal in the tokens file.
type Entry struct {
	// Name identifies the principal in logs and history.
	Name string `json:"name"`
	// Tenants it may act in; ["*"] for all.
	Tenants []string `json:"tenants"`
	// Roles it holds.
	Roles []Role `json:"roles"`
	// TokenSHA256 lists the lowercase hex SHA-256 of each bearer token that
	// authenticates it (several, so that tokens can be rotated). The
	// tokens themselves are never stored.
	TokenSHA256 []string `json:"token_sha256,omitempty"`
	// CertNames lists client-certificate identities that authenticate it:
	// a URI SAN (e.g. "intentd://principal/ops-1"), a DNS SAN, an email
	// SAN, or the subject common name.
	CertNames []string `json:"cert_names,omitempty"`
}

// File is the tokens file:
//
//	{"principals": [
//	  {"name": "checkout-approver", "tenants": ["acme"], "roles": ["approver"],
//	   "token_sha256": ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]},
//	  {"name": "ops-1", "tenants": ["*"], "roles": ["reviewer"],
//	   "cert_names": ["intentd://principal/ops-1"]}
//	]}
type File struct {
	Principals []Entry `json:"principals"`
}

// Directory finds principals by token hash and certificate identity. It is
// immutable; reloading builds a new one.
type Directory struct {
	byToken map[[sha256.Size]byte]*Principal
	byCert  map[string]*Principal
	size    int
}

// ErrBadFile marks a tokens file that does not parse or is inconsistent.
var ErrBadFile = errors.New("access: bad tokens file")

// Parse reads a tokens file. It refuses unknown fields (a misspelled
// "token" would otherwise store a secret in plain text unnoticed), unknown
// roles, malformed tenants and hashes, and a token or certificate name
// that maps to two principals.
func Parse(b []byte) (*Directory, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadFile, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrBadFile)
	}
	if len(f.Principals) == 0 {
		return nil, fmt.Errorf("%w: no principals: nobody could call intentd", ErrBadFile)
	}
	d := &Directory{byToken: map[[sha256.Size]byte]*Principal{}, byCert: map[string]*Principal{}}
	names := map[string]bool{}
	for i, e := range f.Principals {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: principals[%d] (%q): %s", ErrBadFile, i, e.Name, fmt.Sprintf(format, args...))
		}
		if e.Name == "" || len(e.Name) > 128 {
			return nil, bad("name must be 1..128 bytes")
		}
		if names[e.Name] {
			return nil, bad("name used twice")
		}
		names[e.Name] = true
		if len(e.Tenants) == 0 {
			return nil, bad("no tenants")
		}
		for _, t := range e.Tenants {
			if t != AllTenants && intent.ValidateTenant(t) != nil {
				return nil, bad("tenant %q is not a valid tenant name", t)
			}
		}
		if len(e.Roles) == 0 {
			return nil, bad("no roles")
		}
		for _, r := range e.Roles {
			if !slices.Contains(Roles, r) {
				return nil, bad("unknown role %q", r)
			}
		}
		if len(e.TokenSHA256) == 0 && len(e.CertNames) == 0 {
			return nil, bad("neither token_sha256 nor cert_names: it could never authenticate")
		}
		p := &Principal{Name: e.Name, Tenants: slices.Clone(e.Tenants), Roles: slices.Clone(e.Roles)}
		for _, h := range e.TokenSHA256 {
			raw, err := hex.DecodeString(h)
			if err != nil || len(raw) != sha256.Size || h != hex.EncodeToString(raw) {
				// The value is not quoted: it may be a token pasted by mistake.
				return nil, bad("a token_sha256 entry is not 64 lowercase hex digits (store the hash, never the token)")
			}
			k := [sha256.Size]byte(raw)
			if _, dup := d.byToken[k]; dup {
				return nil, bad("a token hash belongs to two principals")
			}
			d.byToken[k] = p
		}
		for _, n := range e.CertNames {
			if n == "" {
				return nil, bad("empty cert name")
			}
			if _, dup := d.byCert[n]; dup {
				return nil, bad("cert name %q belongs to two principals", n)
			}
			d.byCert[n] = p
		}
	}
	d.size = len(f.Principals)
	return d, nil
}

// Len is the number of principals.
func (d *Directory) Len() int { return d.size }

// HashToken returns the lowercase hex SHA-256 of a bearer token, as the
// tokens file stores it.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// ByToken finds the principal a bearer token authenticates. Only the
// token's hash is compared, so the lookup leaks nothing usable about
// stored tokens.
func (d *Directory) ByToken(token string) (*Principal, bool) {
	p, ok := d.byToken[sha256.Sum256([]byte(token))]
	return p, ok
}

// ByCert finds the principal a verified client certificate identifies, by
// its URI SANs, DNS SANs, email SANs, then subject common name.
func (d *Directory) ByCert(c *x509.Certificate) (*Principal, bool) {
	var names []string
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	names = append(names, c.DNSNames...)
	names = append(names, c.EmailAddresses...)
	if c.Subject.CommonName != "" {
		names = append(names, c.Subject.CommonName)
	}
	for _, n := range names {
		if p, ok := d.byCert[n]; ok {
			return p, true
		}
	}
	return nil, false
}
