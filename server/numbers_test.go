package server_test

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// TestLargeIntegersAreRefusedNotMerged: google.protobuf.Struct carries
// numbers as doubles, which from 2^53 on cannot tell neighbouring integers
// apart (9007199254740993 arrives as 9007199254740992). Two different
// orders must never become one intent, so every place params or identity
// enter refuses such a number with INVALID_FIELD naming its JSON path and
// saying to send it as a string, and nothing is written.
func TestLargeIntegersAreRefusedNotMerged(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	big := func(id float64) map[string]any { return map[string]any{"item": "desk lamp", "order_id": id} }
	cart := map[string]any{"items": []any{
		map[string]any{"sku": "L-1"}, map[string]any{"sku": "L-2"}, map[string]any{"sku": 12345678901234567890.0},
	}}

	// Below 2^53 every integer is told apart.
	a, errA := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Action: "ship", Identity: mustStruct(t, map[string]any{"order_id": float64(1<<53 - 1)})})
	b, errB := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Action: "ship", Identity: mustStruct(t, map[string]any{"order_id": float64(1<<53 - 2)})})
	if errA != nil || errB != nil || a.GetKey() == b.GetKey() {
		t.Fatalf("DeriveKey of order 2^53-1 and 2^53-2 = %v, %v; want two distinct keys", a, b)
	}

	sess := f.session("w")
	f.register("parent", lamp(1))
	_, token := f.lease("parent", "w2", intentv1.Outcome_OUTCOME_EXECUTE)
	cases := []struct {
		name  string
		call  func() error
		field string
	}{
		{"DeriveKey 2^53+1", func() error {
			_, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Action: "ship", Identity: mustStruct(t, map[string]any{"order_id": 9007199254740993})})
			return err
		}, "identity.order_id"},
		{"DeriveKey 2^53", func() error {
			_, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Action: "ship", Identity: mustStruct(t, map[string]any{"order_id": 9007199254740992})})
			return err
		}, "identity.order_id"},
		{"DeriveKey nested", func() error {
			_, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Action: "ship", Identity: mustStruct(t, cart)})
			return err
		}, "identity.items[2].sku"},
		{"Register", func() error {
			_, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: "big-1", Params: mustStruct(t, big(1<<53))})
			return err
		}, "params.order_id"},
		{"Register 1e300", func() error {
			_, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: "big-2", Params: mustStruct(t, big(1e300))})
			return err
		}, "params.order_id"},
		{"Register negative", func() error {
			_, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: "big-3", Params: mustStruct(t, big(-math.MaxFloat64))})
			return err
		}, "params.order_id"},
		{"Acquire.register", func() error {
			_, err := c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: "big-4", SessionId: sess, RequestId: "r1",
				Register: &intentv1.RegisterRequest{Key: "big-4", Params: mustStruct(t, big(1<<60))}})
			return err
		}, "register.params.order_id"},
		{"Complete.children", func() error {
			_, err := c.Complete(f.ctx, &intentv1.CompleteRequest{Key: "parent", Token: token, Result: &intentv1.Result{},
				Children: []*intentv1.RegisterRequest{
					{Key: "child-ok", Params: mustStruct(t, lamp(1))},
					{Key: "child-big", Params: mustStruct(t, cart)},
				}})
			return err
		}, "children[1].params.items[2].sku"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatalf("accepted, want INVALID_FIELD %s", tc.field)
			}
			d := detailsOf(t, err)
			if d.code != codes.InvalidArgument || d.info.GetReason() != "INVALID_FIELD" || d.info.GetMetadata()["field"] != tc.field {
				t.Errorf("error = %v %s field %q, want %v %s field %q", d.code, d.info.GetReason(), d.info.GetMetadata()["field"], codes.InvalidArgument, "INVALID_FIELD", tc.field)
			}
			if len(d.field) != 1 || d.field[0] != tc.field {
				t.Errorf("BadRequest fields = %q, want [%q]", d.field, tc.field)
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, "as strings") {
				t.Errorf("message %q does not say to send identifiers as strings", msg)
			}
		})
	}

	// Nothing was written: the refused keys do not exist, and the parent
	// is still held (the refused Complete did not complete it).
	for _, key := range []string{"big-1", "big-2", "big-3", "big-4", "child-ok", "child-big"} {
		if _, err := c.Get(f.ctx, &intentv1.GetRequest{Key: key}); status.Code(err) != codes.NotFound {
			t.Errorf("Get(%s) = %v, want NOT_FOUND", key, err)
		}
	}
	if got := f.get("parent").GetState(); got != intentv1.State_STATE_IN_PROGRESS {
		t.Errorf("parent state = %v, want %v", got, intentv1.State_STATE_IN_PROGRESS)
	}
}

// TestDeriveKeyReturnsTheFingerprintRegisterStores: a caller who wants to
// assert the approved terms in Acquire (expected_fingerprint) gets their
// fingerprint from DeriveKey, the same Register stores, instead of
// reimplementing RFC 8785 or registering a throwaway intent; DeriveKey
// stores nothing.
func TestDeriveKeyReturnsTheFingerprintRegisterStores(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	terms := lamp(2)

	both, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{
		Action: "purchase", Identity: mustStruct(t, map[string]any{"customer": "c-17", "cart": "cart-9"}),
		Params: mustStruct(t, terms),
	})
	if err != nil {
		t.Fatalf("DeriveKey(action, identity, params): %v", err)
	}
	only, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Params: mustStruct(t, terms)})
	if err != nil {
		t.Fatalf("DeriveKey(params): %v", err)
	}
	if only.GetKey() != "" || only.GetCanonical() != "" {
		t.Errorf("DeriveKey(params only) key %q, canonical %q; want both empty", only.GetKey(), only.GetCanonical())
	}
	if both.GetFingerprint() != only.GetFingerprint() || both.GetCanonicalParams() != only.GetCanonicalParams() {
		t.Errorf("fingerprints with and without identity differ: %s %s, %s %s", both.GetFingerprint(), both.GetCanonicalParams(), only.GetFingerprint(), only.GetCanonicalParams())
	}
	if got, want := only.GetFingerprint(), fingerprintOf(t, terms); got != want {
		t.Errorf("DeriveKey fingerprint = %s, want %s", got, want)
	}
	if _, err := c.Get(f.ctx, &intentv1.GetRequest{Key: both.GetKey()}); status.Code(err) != codes.NotFound {
		t.Errorf("Get(derived key) before Register = %v, want NOT_FOUND: DeriveKey stores nothing", err)
	}

	registered := f.register(both.GetKey(), terms)
	if registered.GetFingerprint() != both.GetFingerprint() {
		t.Errorf("Register stored fingerprint %s, DeriveKey said %s", registered.GetFingerprint(), both.GetFingerprint())
	}
	sess := f.session("w")
	resp, err := c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: both.GetKey(), SessionId: sess, RequestId: "r1", ExpectedFingerprint: both.GetFingerprint()})
	if err != nil || resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
		t.Fatalf("Acquire with DeriveKey's fingerprint = %v, %v; want EXECUTE", resp.GetOutcome(), err)
	}
	changed, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Params: mustStruct(t, lamp(3))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: both.GetKey(), SessionId: sess, RequestId: "r2", ExpectedFingerprint: changed.GetFingerprint()}); detailsOf(t, err).info.GetReason() != "FINGERPRINT_MISMATCH" {
		t.Errorf("Acquire with the fingerprint of other terms = %v, want %s", err, "FINGERPRINT_MISMATCH")
	}

	invalid := []struct {
		name  string
		req   *intentv1.DeriveKeyRequest
		field string
	}{
		{"nothing", &intentv1.DeriveKeyRequest{}, "identity"},
		{"action without identity", &intentv1.DeriveKeyRequest{Action: "purchase", Params: mustStruct(t, terms)}, "identity"},
		{"identity without action", &intentv1.DeriveKeyRequest{Identity: mustStruct(t, map[string]any{"cart": "c"}), Params: mustStruct(t, terms)}, "action"},
		{"empty params", &intentv1.DeriveKeyRequest{Params: &structpb.Struct{}}, "params"},
		{"2^53 in params", &intentv1.DeriveKeyRequest{Params: mustStruct(t, map[string]any{"order_id": float64(1 << 53)})}, "params.order_id"},
	}
	for _, tc := range invalid {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.DeriveKey(f.ctx, tc.req)
			if err == nil {
				t.Fatalf("DeriveKey succeeded, want INVALID_FIELD %q", tc.field)
			}
			if d := detailsOf(t, err); d.code != codes.InvalidArgument || len(d.field) != 1 || d.field[0] != tc.field {
				t.Errorf("error = %v %q, want %v [%q]", d.code, d.field, codes.InvalidArgument, tc.field)
			}
		})
	}
}
