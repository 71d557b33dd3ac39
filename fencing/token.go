package fencing

import (
	"errors"
	"fmt"
	"strconv"
)

// Token is a fencing token: a number that strictly increases over every
// lease intentd ever issues. A larger token was issued later. The zero Token
// is never issued and means "no token".
//
// Tokens are opaque: compare them, never derive meaning from the number.
type Token uint64

// Header is the HTTP header (and, lowercased, the gRPC metadata key) under
// which a worker sends its token to a downstream resource.
const Header = "Intentd-Fencing-Token"

// MetadataKey is Header as gRPC metadata keys are spelled.
const MetadataKey = "intentd-fencing-token"

// ErrMalformed reports text that is not a Token's encoding.
var ErrMalformed = errors.New("fencing: malformed token")

// String returns the token's stable text encoding: base-10 digits, no sign,
// no leading zeros. It is what goes into headers and metadata.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// Parse reads a token from its text encoding. It rejects signs, spaces,
// leading zeros and zero itself, so that one token has exactly one spelling.
func Parse(s string) (Token, error) {
	if s == "" || (s[0] == '0') || s[0] == '+' {
		return 0, fmt.Errorf("%w: %q", ErrMalformed, s)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrMalformed, s)
	}
	return Token(v), nil
}

// MarshalText implements encoding.TextMarshaler with the String encoding.
func (t Token) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with Parse, except that
// it also reads "0" as the zero Token, so that a stored "no token" survives a
// round trip through MarshalText. A token on the wire is read with Parse,
// which refuses zero.
func (t *Token) UnmarshalText(b []byte) error {
	if string(b) == "0" {
		*t = 0
		return nil
	}
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}
