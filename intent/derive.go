// Key derivation: what intentd derives from canonical forms, the
// fingerprint of params (Fingerprint), an intent's key from its action and
// identity (DeriveKey, Derive), and a worker's operation keys (OperationKey).

package intent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// Fingerprint returns the lowercase hex SHA-256 of canonical, which should be
// canonical params as Canonical or CanonicalJSON return them. Same key and
// same fingerprint is the same intent; same key and another fingerprint is a
// conflict.
func Fingerprint(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// DeriveKey returns the intent key derived from action and identity, and the
// canonical text it was derived from. The key is the lowercase hex SHA-256 of
//
//	Canonical(map[string]any{"action": action, "identity": identity})
//
// so any language with a JCS implementation and SHA-256 derives the same key
// from the same fields; the canonical text is returned so a caller can show
// or check what was hashed.
//
// action names the operation (1 to MaxActionLen bytes of ASCII letters,
// digits and "-_.:", such as "create-order"); identity holds the fields that
// make one approved action distinct from another (merchant, cart, the
// business's own discriminator for legitimate repeats), never a per-attempt
// id or a timestamp, or every retry would get a new key. identity must be a
// non-empty object; its numbers follow Canonical's rules (magnitude below
// 2^53), so identifiers are best sent as strings. Errors are *InvalidError
// values naming "action", or "identity" followed by the JSON path of the
// offending value (identity.items[2].sku).
func DeriveKey(action string, identity map[string]any) (key string, canonical []byte, err error) {
	d, err := Derive(action, identity)
	if err != nil {
		return "", nil, err
	}
	return d.Key, d.Canonical, nil
}

// Derivation is DeriveKey's answer with the canonical identity alone, as a
// registration keeps it to show a reviewer what a derived key stands for.
type Derivation struct {
	// Key is the derived key: the lowercase hex SHA-256 of Canonical.
	Key string
	// Canonical is the canonical text hashed: action and identity.
	Canonical []byte
	// Identity is the canonical JSON of the identity object alone: what
	// Canonical holds as its "identity" member.
	Identity json.RawMessage
}

// Derive is DeriveKey, with the same rules and errors, also returning the
// canonical identity, so that a server that derives a registration's key
// checks the identity once, in the one place DeriveKey does.
func Derive(action string, identity map[string]any) (Derivation, error) {
	if err := validateAction(action); err != nil {
		return Derivation{}, err
	}
	if len(identity) == 0 {
		return Derivation{}, Invalid("identity", "must be a non-empty object")
	}
	// The path of a value starts at the object hashed, whose "identity"
	// member is the request's field of that name.
	canonical, err := canonicalize(map[string]any{"action": action, "identity": identity}, "", "identity")
	if err != nil {
		return Derivation{}, err
	}
	// The canonical text is {"action":"<action>","identity":<identity>}:
	// "action" sorts before "identity", and an action holds nothing a JSON
	// string escapes (validateAction), so the identity's canonical form is
	// what follows that prefix, up to the closing brace. Cut, not encoded
	// again: the bytes kept are the very bytes hashed.
	prefix := len(`{"action":"`) + len(action) + len(`","identity":`)
	return Derivation{
		Key:       Fingerprint(canonical),
		Canonical: canonical,
		Identity:  bytes.Clone(canonical[prefix : len(canonical)-1]),
	}, nil
}

// OperationKey returns "<key>:<operation>", the idempotency key a worker
// sends to a downstream provider for one kind of call on intent key (for
// example OperationKey(k, "create-order")). It depends on nothing but its
// arguments, so it is the same across retries, workers and reconciliation,
// and a provider that deduplicates on it performs the call at most once per
// intent.
//
// Keys may contain ':', so distinct (key, operation) pairs give distinct
// operation keys only when operation has no ':'; use fixed names such as
// "authorize-payment". The result is not checked against the limits of an
// intent key: it is for the provider, whose own limits apply.
func OperationKey(key, operation string) string {
	return key + ":" + operation
}
