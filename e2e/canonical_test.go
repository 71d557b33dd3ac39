package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// canonicalVector is one row of api/canonical-vectors.json, the table the
// Go, Python and Node suites all check the server's answers against.
type canonicalVector struct {
	Name            string `json:"name"`
	Action          string `json:"action"`
	Identity        string `json:"identity"`
	Canonical       string `json:"canonical"`
	Key             string `json:"key"`
	CanonicalParams string `json:"canonical_params"`
	Fingerprint     string `json:"fingerprint"`
	Refused         *struct {
		DeriveKey string `json:"derive_key"`
		Register  string `json:"register"`
	} `json:"refused"`
}

// TestCanonicalVectors checks intentd's DeriveKey answers, and the
// fingerprint it gives the identity as params (from DeriveKey, and as
// Register stores it), against the shared table; identities are parsed the way most callers parse JSON
// (encoding/json: every number a double) and sent as a Struct.
func TestCanonicalVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "api", "canonical-vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Vectors []canonicalVector `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	c := clientOf(t, startIntentd(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, v := range table.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal([]byte(v.Identity), &m); err != nil {
				t.Fatal(err)
			}
			identity, err := structpb.NewStruct(m)
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("vector-%d-%d", time.Now().UnixNano(), i)
			got, derr := c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: v.Action, Identity: identity})
			fp, ferr := c.Fingerprint(ctx, identity)
			params, perr := c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Params: identity})
			reg, rerr := c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: identity})
			if v.Refused != nil {
				if f := refusedField(derr); f != v.Refused.DeriveKey {
					t.Errorf("DeriveKey refused field %q (err %v), want %q", f, derr, v.Refused.DeriveKey)
				}
				if f := refusedField(ferr); f != v.Refused.Register {
					t.Errorf("DeriveKey of params refused field %q (err %v), want %q", f, ferr, v.Refused.Register)
				}
				if f := refusedField(rerr); f != v.Refused.Register {
					t.Errorf("Register refused field %q (err %v), want %q", f, rerr, v.Refused.Register)
				}
				return
			}
			if derr != nil || ferr != nil || rerr != nil {
				t.Fatalf("DeriveKey: %v; DeriveKey of params: %v; Register: %v", derr, ferr, rerr)
			}
			if perr != nil || params.GetCanonicalParams() != v.CanonicalParams {
				t.Errorf("DeriveKey canonical params %s (err %v), want %s", params.GetCanonicalParams(), perr, v.CanonicalParams)
			}
			if fp != v.Fingerprint {
				t.Errorf("DeriveKey fingerprint of params %s, want %s", fp, v.Fingerprint)
			}
			if got.GetCanonical() != v.Canonical || got.GetKey() != v.Key {
				t.Errorf("DeriveKey = %s %s, want %s %s", got.GetKey(), got.GetCanonical(), v.Key, v.Canonical)
			}
			if fp := reg.GetIntent().GetFingerprint(); fp != v.Fingerprint {
				t.Errorf("fingerprint %s, want %s", fp, v.Fingerprint)
			}
		})
	}
}

// refusedField is the field an INVALID_FIELD refusal names ("" for any other error).
func refusedField(err error) string {
	var e *client.Error
	if errors.As(err, &e) && errors.Is(err, client.ErrInvalidArgument) {
		return e.Field
	}
	return ""
}
