package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// Error texts a person reads: params too large said "intent: invalid
// params: intent: invalid params: …" (the prefix twice), Get of a missing
// key said "intent: not found" without the key, and a malformed label or
// tenant quoted the proto's raw regex. Each message must say its thing once,
// name what is missing, and describe what is allowed in words, the rules
// of rules.proto (which many fields share) included: each of their
// refusals (too long; a character outside the alphabet) is here.
func TestErrorTextsSayItOnce(t *testing.T) {
	c := serve(t, etcdtest.Start(t))
	huge := map[string]any{"note": strings.Repeat("x", 70_000)}
	for _, tc := range []struct {
		name string
		call func(ctx context.Context) error
		want string // the whole message
	}{
		{"params too large", func(ctx context.Context) error {
			_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: "big", Params: mustStruct(t, huge)})
			return err
		}, "intent: invalid params: canonical form is longer than the limit of 65536 bytes"},
		{"params too large inside Acquire", func(ctx context.Context) error {
			_, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: "big", SessionId: "00ff", RequestId: "r1",
				Register: &intentv1.RegisterRequest{Key: "big", Params: mustStruct(t, huge)}})
			return err
		}, "intent: invalid register.params: canonical form is longer than the limit of 65536 bytes"},
		{"Get of a missing key", func(ctx context.Context) error {
			_, err := c.Get(ctx, &intentv1.GetRequest{Key: "no-such-order"})
			return err
		}, `intent: no intent with key "no-such-order"`},
		{"label name", func(ctx context.Context) error {
			_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: "k", Params: mustStruct(t, lamp(1)), Labels: map[string]string{"Bad Label": "x"}})
			return err
		}, "intent: invalid labels[Bad Label]: map key: a label name must hold only ASCII letters, digits and the characters . _ : / -, and start with a letter or digit"},
		{"label filter", func(ctx context.Context) error {
			_, err := c.List(ctx, &intentv1.ListRequest{Label: "Bad Label=x"})
			return err
		}, "intent: invalid label: must be name=value, the name 1 to 63 ASCII letters, digits and the characters . _ : / -, starting with a letter or digit"},
		{"tenant", func(ctx context.Context) error {
			_, err := c.Get(ctx, &intentv1.GetRequest{Tenant: "Acme", Key: "k"})
			return err
		}, "intent: invalid tenant: must hold only lowercase ASCII letters, digits, '_' and '-', and start with a letter or digit"},
		{"session id", func(ctx context.Context) error {
			_, err := c.Heartbeat(ctx, &intentv1.HeartbeatRequest{SessionId: "not-hex"})
			return err
		}, "intent: invalid session_id: must be lowercase hexadecimal"},
		{"session id too long", func(ctx context.Context) error {
			_, err := c.Heartbeat(ctx, &intentv1.HeartbeatRequest{SessionId: strings.Repeat("not-hex", 5)})
			return err
		}, "intent: invalid session_id: must be at most 32 bytes"},
		{"tenant too long", func(ctx context.Context) error {
			_, err := c.Get(ctx, &intentv1.GetRequest{Tenant: strings.Repeat("é", 40), Key: "k"})
			return err
		}, "intent: invalid tenant: must be at most 64 bytes"},
		{"key", func(ctx context.Context) error {
			_, err := c.Get(ctx, &intentv1.GetRequest{Key: "order 1"})
			return err
		}, "intent: invalid key: must hold only ASCII letters, digits and the characters . _ : / = @ + -"},
		{"key too long", func(ctx context.Context) error {
			_, err := c.Get(ctx, &intentv1.GetRequest{Key: strings.Repeat("order 1", 40)})
			return err
		}, "intent: invalid key: must be at most 256 bytes"},
		{"a child's parent key", func(ctx context.Context) error {
			_, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: "k", Token: 1, Result: &intentv1.Result{},
				Children: []*intentv1.RegisterRequest{{Key: "k:mail", ParentKey: "k 1", Params: mustStruct(t, lamp(1))}}})
			return err
		}, "intent: invalid children[0].parent_key: must hold only ASCII letters, digits and the characters . _ : / = @ + -"},
		{"action", func(ctx context.Context) error {
			_, err := c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: "refund issue", Identity: mustStruct(t, lamp(1))})
			return err
		}, "intent: invalid action: must hold only ASCII letters, digits and the characters . _ : -"},
		{"label filter too long", func(ctx context.Context) error {
			_, err := c.List(ctx, &intentv1.ListRequest{Label: "team=" + strings.Repeat("x", 320)})
			return err
		}, "intent: invalid label: must be at most 320 bytes"},
		{"reason too long", func(ctx context.Context) error {
			_, err := c.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Key: "k", Token: 1, Reason: strings.Repeat("x", 1025)})
			return err
		}, "intent: invalid reason: must be at most 1024 bytes"},
		{"actor too long", func(ctx context.Context) error {
			_, err := c.OpenSession(ctx, &intentv1.OpenSessionRequest{Worker: strings.Repeat("x", 129)})
			return err
		}, "intent: invalid worker: must be at most 128 bytes"},
		{"request id too long", func(ctx context.Context) error {
			_, err := c.Resolve(ctx, &intentv1.ResolveRequest{Key: "k", Decision: intentv1.Decision_DECISION_PENDING, Actor: "a", Reason: "r", RequestId: strings.Repeat("x", 129)})
			return err
		}, "intent: invalid request_id: must be at most 128 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := tc.call(ctx)
			if got := status.Convert(err).Message(); got != tc.want {
				t.Errorf("message %q, want %q", got, tc.want)
			}
		})
	}
}
