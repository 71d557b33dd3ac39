package intent

import (
	"crypto/sha256"
	"encoding/hex"
)

// KeyHash names an intent in traces and other telemetry without carrying
// its key: a caller-supplied key may hold business data (a customer's
// e-mail in an order reference), and telemetry leaves the trust boundary
// of the store. It is the first 16 hex digits of SHA-256 over tenant, a NUL
// byte and key; an operator who knows an intent finds its spans with
//
//	printf '%s\0%s' "$TENANT" "$KEY" | sha256sum | cut -c1-16
func KeyHash(tenant, key string) string {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:8])
}
