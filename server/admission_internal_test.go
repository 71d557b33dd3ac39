package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// TestTenantResolvedOnce: the guard resolves a call's tenant from the
// principal and the tenant the request names, once, and carries it in the
// context; it writes nothing into the request. The domain values the
// handlers build carry that tenant, nested registrations and children
// too, with the children's parent set.
func TestTenantResolvedOnce(t *testing.T) {
	params, err := structpb.NewStruct(map[string]any{"item": "desk lamp"})
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(tenant string) *intentv1.AcquireRequest {
		return &intentv1.AcquireRequest{Tenant: tenant, Key: "k", SessionId: "ab", RequestId: "r",
			Register: &intentv1.RegisterRequest{Key: "k", Params: params}}
	}
	complete := func(tenant string) *intentv1.CompleteRequest {
		return &intentv1.CompleteRequest{Tenant: tenant, Key: "k", Token: 7, Result: &intentv1.Result{},
			Children: []*intentv1.RegisterRequest{{Key: "k:mail", Params: params}, {Key: "k:invoice", Params: params}}}
	}
	acme := &access.Principal{Name: "alice", Tenants: []string{"acme"}, Roles: []access.Role{access.RoleAdmin}}
	both := &access.Principal{Name: "carol", Tenants: []string{"acme", "globex"}, Roles: []access.Role{access.RoleAdmin}}
	withDefault := &access.Principal{Name: "dave", Tenants: []string{"acme", "default"}, Roles: []access.Role{access.RoleAdmin}}
	for _, tc := range []struct {
		name      string
		principal *access.Principal
		named     string
		want      string     // the resolved tenant
		refused   codes.Code // or the refusal
	}{
		{"one tenant, none named", acme, "", "acme", codes.OK},
		{"one tenant, named", acme, "acme", "acme", codes.OK},
		{"one tenant, another named", acme, "globex", "", codes.PermissionDenied},
		{"several tenants, none named", both, "", "", codes.InvalidArgument},
		{"several tenants, one named", both, "globex", "globex", codes.OK},
		{"several tenants with default, none named", withDefault, "", "default", codes.OK},
		{"authentication off, none named", access.Anonymous, "", "default", codes.OK},
		{"authentication off, named", access.Anonymous, "globex", "globex", codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewGuard(nil, RateLimits{}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			in := context.WithValue(context.Background(), principalKey{}, tc.principal)
			for _, req := range []proto.Message{acquire(tc.named), complete(tc.named)} {
				before := proto.Clone(req)
				method := "/intent.v1.IntentService/" + strings.TrimSuffix(string(req.ProtoReflect().Descriptor().Name()), "Request")
				ctx, err := g.authorize(in, method, req)
				if !proto.Equal(req, before) {
					t.Errorf("%s: the guard changed the request:\n got %v\nwant %v", method, req, before)
				}
				if tc.refused != codes.OK {
					if status.Code(err) != tc.refused {
						t.Errorf("%s: %v, want %v", method, err, tc.refused)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", method, err)
				}
				if got := callTenant(ctx, tc.named); got != tc.want {
					t.Errorf("%s: tenant %q, want %q", method, got, tc.want)
				}
				switch r := req.(type) {
				case *intentv1.AcquireRequest:
					ar, err := acquireRequest(callTenant(ctx, r.GetTenant()), r)
					if err != nil {
						t.Fatal(err)
					}
					if ar.Tenant != tc.want || ar.Register.Tenant != tc.want {
						t.Errorf("Acquire in %q, its registration in %q, want both in %q", ar.Tenant, ar.Register.Tenant, tc.want)
					}
				case *intentv1.CompleteRequest:
					rep, err := completion(callTenant(ctx, r.GetTenant()), r)
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range rep.Children {
						if rep.Tenant != tc.want || c.Tenant != tc.want || c.ParentKey != "k" {
							t.Errorf("Complete in %q, child %s in %q under %q, want %q under k", rep.Tenant, c.Key, c.Tenant, c.ParentKey, tc.want)
						}
					}
				}
			}
		})
	}
	// Without the guard (a server run without it, as in package server's
	// tests) the tenant defaults as with authentication off.
	for named, want := range map[string]string{"": "default", "acme": "acme"} {
		if got := callTenant(context.Background(), named); got != want {
			t.Errorf("callTenant without a guard, %q named: %q, want %q", named, got, want)
		}
	}
}

// TestChildrenRefusedTogether: what no single child's rules can see is
// refused by the server, naming the child: a key that repeats the
// parent's or another child's, a tenant not the parent's.
func TestChildrenRefusedTogether(t *testing.T) {
	params, err := structpb.NewStruct(map[string]any{"template": "mail"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		kids   []*intentv1.RegisterRequest
		field  string
		reason string
	}{
		{"the parent's key", []*intentv1.RegisterRequest{{Key: "parent", Params: params}}, "children[0].key", `"parent" repeats the parent's or another child's key`},
		{"one key twice", []*intentv1.RegisterRequest{{Key: "a", Params: params}, {Key: "a", Params: params}}, "children[1].key", `"a" repeats the parent's or another child's key`},
		{"another tenant", []*intentv1.RegisterRequest{{Tenant: "globex", Key: "a", Params: params}}, "children[0].tenant", "a child belongs to its parent's tenant"},
	} {
		_, err := completion("acme", &intentv1.CompleteRequest{Key: "parent", Token: 1, Result: &intentv1.Result{}, Children: tc.kids})
		var inv *intent.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field || inv.Reason != tc.reason {
			t.Errorf("%s: %v, want an invalid %s: %s", tc.name, err, tc.field, tc.reason)
		}
	}
}
