// The field validators: the limits on what callers may send, and the checks
// of a tenant name and of DeriveKey's action.

package intent

import "fmt"

// Limits on what callers may send. They bound the work and the etcd space one
// request can cost, and they are part of the contract: a value within them is
// accepted by every intentd. The limits of request fields are stated once,
// as the protovalidate rules of intent.proto; the two here that are also
// such a limit (MaxTenantLen, MaxActionLen) are needed where no request is
// at hand (a tokens file's tenants, DeriveKey called in a client), and a
// test in package server holds them equal to the rules.
const (
	// MaxTenantLen is the longest tenant name, in bytes.
	MaxTenantLen = 64
	// MaxActionLen is the longest action accepted by DeriveKey, in bytes.
	MaxActionLen = 128
	// MaxParamsBytes is the largest canonical JSON text Canonical and
	// CanonicalJSON produce, in bytes: params and derived-key identities
	// larger than this are refused.
	MaxParamsBytes = 64 << 10
	// MaxDepth is the deepest nesting of objects and arrays Canonical and
	// CanonicalJSON accept. A top-level object or array is at depth 1.
	// Approved terms are shallow; the limit keeps recursion bounded.
	MaxDepth = 32
)

// ValidateTenant checks a tenant name: 1 to MaxTenantLen bytes of lowercase
// ASCII letters, digits, '-' and '_', starting with a letter or digit. One
// spelling per tenant keeps one tenant from appearing as two. The error is an
// *InvalidError naming the field "tenant".
func ValidateTenant(tenant string) error {
	if tenant == "" {
		return Invalid("tenant", "must not be empty")
	}
	if len(tenant) > MaxTenantLen {
		return Invalid("tenant", "is %d bytes, more than the limit of %d", len(tenant), MaxTenantLen)
	}
	for i := 0; i < len(tenant); i++ {
		c := tenant[i]
		lowerAlnum := ('a' <= c && c <= 'z') || ('0' <= c && c <= '9')
		switch {
		case i == 0 && !lowerAlnum:
			return Invalid("tenant", "must start with a lowercase ASCII letter or a digit, not %s", describeByte(c))
		case !lowerAlnum && c != '-' && c != '_':
			return Invalid("tenant", "%s at offset %d is not allowed: use lowercase ASCII letters, digits, '-' and '_'", describeByte(c), i)
		}
	}
	return nil
}

// validateAction checks DeriveKey's action.
func validateAction(action string) error {
	if action == "" {
		return Invalid("action", "must not be empty")
	}
	if len(action) > MaxActionLen {
		return Invalid("action", "is %d bytes, more than the limit of %d", len(action), MaxActionLen)
	}
	for i := 0; i < len(action); i++ {
		if c := action[i]; !isASCIIAlnum(c) && c != '-' && c != '_' && c != '.' && c != ':' {
			return Invalid("action", "%s at offset %d is not allowed: use ASCII letters, digits and \"-_.:\"", describeByte(c), i)
		}
	}
	return nil
}

func isASCIIAlnum(c byte) bool {
	return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

// describeByte names c for an error message: quoted when printable ASCII,
// in hex otherwise, so that the message itself stays printable.
func describeByte(c byte) string {
	if 0x20 < c && c < 0x7f {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}
