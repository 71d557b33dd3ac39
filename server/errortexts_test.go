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
// name what is missing, and describe what is allowed in words.
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
