package intent

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
)

func TestFingerprint(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	}
	for _, tt := range tests {
		if got := Fingerprint([]byte(tt.in)); got != tt.want {
			t.Errorf("Fingerprint(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestDeriveKeyVector pins one derivation so that clients in other languages
// can check theirs against it: SHA-256 of the UTF-8 canonical text, in
// lowercase hex. The canonical text shows number normalization (7.0 is 7),
// key sorting and raw non-ASCII UTF-8.
func TestDeriveKeyVector(t *testing.T) {
	const (
		action    = "create-order"
		canonical = `{"action":"create-order","identity":{"approval_seq":7,"cart":"C-1001","merchant":"möbel-haus"}}`
		key       = "fb51b6bc6b219d7083afc5cc16d54909f051cdd6b8210f31a5da81384163d340"
	)
	identities := []map[string]any{
		{"merchant": "möbel-haus", "cart": "C-1001", "approval_seq": 7.0},
		{"approval_seq": json.Number("7.00"), "cart": "C-1001", "merchant": "m\u00f6bel-haus"},
		{"cart": "C-1001", "merchant": "möbel-haus", "approval_seq": 7},
	}
	for _, identity := range identities {
		gotKey, gotCanonical, err := DeriveKey(action, identity)
		if err != nil {
			t.Fatalf("DeriveKey(%q, %v) error: %v", action, identity, err)
		}
		if string(gotCanonical) != canonical {
			t.Errorf("DeriveKey(%q, %v) canonical = %s, want %s", action, identity, gotCanonical, canonical)
		}
		if gotKey != key {
			t.Errorf("DeriveKey(%q, %v) key = %s, want %s", action, identity, gotKey, key)
		}
		if !derivedKeyForm.MatchString(gotKey) {
			t.Errorf("DeriveKey(%q, %v) key = %s, want 64 lowercase hex digits", action, identity, gotKey)
		}
	}
	if got := Fingerprint([]byte(canonical)); got != key {
		t.Errorf("Fingerprint(canonical) = %s, want %s", got, key)
	}
	// The canonical text is its own canonical form.
	if got, err := CanonicalJSON([]byte(canonical)); err != nil || string(got) != canonical {
		t.Errorf("CanonicalJSON(canonical) = %s, %v, want %s, nil", got, err, canonical)
	}
}

// TestDeriveKeepsTheIdentityHashed: the identity Derive returns is the
// identity's own canonical form, the very bytes inside the text hashed,
// whatever the action's length and the identity's keys (escaped, non-ASCII,
// sorting as UTF-16 does), and its key and text are DeriveKey's.
func TestDeriveKeepsTheIdentityHashed(t *testing.T) {
	for _, tt := range []struct {
		action   string
		identity map[string]any
	}{
		{"refund.issue", map[string]any{"order_id": "ORD-88412", "return_id": "RA-20931"}},
		{"a", map[string]any{"q\"uote": "x\ny", "\u00e9": 1.5, "\U0001F600": []any{true, nil}, "ﬀ": map[string]any{"z": "a", "b": 2}}},
		{strings.Repeat("x", MaxActionLen), map[string]any{"id": "\u202eRTL"}},
	} {
		d, err := Derive(tt.action, tt.identity)
		if err != nil {
			t.Fatalf("Derive(%q, %v): %v", tt.action, tt.identity, err)
		}
		key, canonical, err := DeriveKey(tt.action, tt.identity)
		if err != nil || key != d.Key || !bytes.Equal(canonical, d.Canonical) {
			t.Errorf("DeriveKey(%q) = %s, %s, %v; Derive gave %s, %s", tt.action, key, canonical, err, d.Key, d.Canonical)
		}
		own, err := Canonical(tt.identity)
		if err != nil || !bytes.Equal(d.Identity, own) {
			t.Errorf("Derive(%q).Identity = %s, want Canonical(identity) = %s (%v)", tt.action, d.Identity, own, err)
		}
		if want := `{"action":` + string(appendString(nil, tt.action)) + `,"identity":` + string(d.Identity) + `}`; string(d.Canonical) != want {
			t.Errorf("Derive(%q).Canonical = %s, want %s", tt.action, d.Canonical, want)
		}
	}
	if _, err := Derive("bad action", map[string]any{"a": 1}); err == nil {
		t.Error("Derive with a bad action succeeded")
	}
}

// TestFingerprintVector pins one fingerprint so that clients in other
// languages can check theirs (or the one DeriveKey returns for params)
// against it: SHA-256 of the UTF-8 canonical text of the params, in
// lowercase hex. The canonical text shows number normalization (2.0 is 2),
// key sorting, a decimal kept as a string and raw non-ASCII UTF-8.
func TestFingerprintVector(t *testing.T) {
	const (
		canonical   = `{"currency":"EUR","item":"desk lamp","max_amount":"89.00","merchant":"möbel-haus","quantity":2}`
		fingerprint = "78bd230c4df9a993812929c4b6487678e7ef00ce36d7f96e74407e5456afd8ed"
	)
	spellings := []any{
		map[string]any{"item": "desk lamp", "quantity": 2.0, "merchant": "möbel-haus", "max_amount": "89.00", "currency": "EUR"},
		map[string]any{"quantity": json.Number("2.00"), "currency": "EUR", "merchant": "m\u00f6bel-haus", "item": "desk lamp", "max_amount": "89.00"},
		map[string]any{"max_amount": "89.00", "merchant": "möbel-haus", "currency": "EUR", "quantity": 2, "item": "desk lamp"},
	}
	for _, params := range spellings {
		got, err := Canonical(params)
		if err != nil {
			t.Fatalf("Canonical(%v) error: %v", params, err)
		}
		if string(got) != canonical {
			t.Errorf("Canonical(%v) = %s, want %s", params, got, canonical)
		}
		if fp := Fingerprint(got); fp != fingerprint {
			t.Errorf("Fingerprint(Canonical(%v)) = %s, want %s", params, fp, fingerprint)
		}
	}
	text := ` { "quantity" : 2e0, "item" : "desk\u0020lamp", "max_amount" : "89.00", "currency" : "EUR", "merchant" : "möbel-haus" } `
	if got, err := CanonicalJSON([]byte(text)); err != nil || Fingerprint(got) != fingerprint {
		t.Errorf("CanonicalJSON(%s) = %s, %v; want the fingerprint %s", text, got, err, fingerprint)
	}
}

func TestDeriveKeyDistinguishes(t *testing.T) {
	base, _, err := DeriveKey("refund", map[string]any{"order": "O-1", "rma": "R-1"})
	if err != nil {
		t.Fatal(err)
	}
	others := []struct {
		action   string
		identity map[string]any
	}{
		{"refund", map[string]any{"order": "O-1", "rma": "R-2"}},
		{"refund", map[string]any{"order": "O-1"}},
		{"refund.partial", map[string]any{"order": "O-1", "rma": "R-1"}},
		{"refund", map[string]any{"order": "O-1", "rma": []any{"R-1"}}},
	}
	for _, o := range others {
		got, _, err := DeriveKey(o.action, o.identity)
		if err != nil {
			t.Errorf("DeriveKey(%q, %v) error: %v", o.action, o.identity, err)
			continue
		}
		if got == base {
			t.Errorf("DeriveKey(%q, %v) = %s, the same as for another action or identity", o.action, o.identity, got)
		}
	}
}

func TestDeriveKeyRejects(t *testing.T) {
	ok := map[string]any{"order": "O-1"}
	tests := []struct {
		name     string
		action   string
		identity map[string]any
		field    string
	}{
		{"empty action", "", ok, "action"},
		{"action too long", strings.Repeat("a", MaxActionLen+1), ok, "action"},
		{"action with space", "create order", ok, "action"},
		{"action with slash", "orders/create", ok, "action"},
		{"action non-ASCII", "bestellung-ä", ok, "action"},
		{"nil identity", "refund", nil, "identity"},
		{"empty identity", "refund", map[string]any{}, "identity"},
		{"NaN in identity", "refund", map[string]any{"n": math.NaN()}, "identity.n"},
		{"unsupported type in identity", "refund", map[string]any{"t": struct{}{}}, "identity.t"},
		{"identity too deep", "refund", map[string]any{"x": nested(MaxDepth - 1)}, "identity.x" + strings.Repeat("[0]", MaxDepth-2)},
		{"identity too large", "refund", map[string]any{"x": strings.Repeat("x", MaxParamsBytes)}, "identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, _, err := DeriveKey(tt.action, tt.identity)
			if err == nil {
				t.Fatalf("DeriveKey = %s, want an error", key)
			}
			if field, _ := invalidReason(t, err); field != tt.field {
				t.Errorf("field = %q, want %q", field, tt.field)
			}
		})
	}

	// At the limits.
	if _, _, err := DeriveKey(strings.Repeat("a", MaxActionLen), ok); err != nil {
		t.Errorf("DeriveKey(%d-byte action) error: %v", MaxActionLen, err)
	}
	if _, _, err := DeriveKey("a-Z_0.9:x", map[string]any{"x": nested(MaxDepth - 2)}); err != nil {
		t.Errorf("DeriveKey(identity at the depth limit) error: %v", err)
	}
}

func TestOperationKey(t *testing.T) {
	tests := []struct {
		key, operation, want string
	}{
		{"ord-1", "create-order", "ord-1:create-order"},
		{"fb51b6bc", "authorize-payment", "fb51b6bc:authorize-payment"},
		{"tenant/x:y", "refund", "tenant/x:y:refund"},
	}
	for _, tt := range tests {
		if got := OperationKey(tt.key, tt.operation); got != tt.want {
			t.Errorf("OperationKey(%q, %q) = %q, want %q", tt.key, tt.operation, got, tt.want)
		}
	}
}

// derivedKeyForm is the form of every derived key: a SHA-256 in lowercase
// hex (which the key rule of intent.proto accepts: see package server's
// TestKeyRule).
var derivedKeyForm = regexp.MustCompile(`^[0-9a-f]{64}$`)
