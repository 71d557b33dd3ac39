package mcpguard_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/internal/testing/intentdtest"
	"github.com/intentd/intentd/mcpguard"
)

// bearer sends a token with every call, as intentd mcp-guard's
// --token-file does.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// TestGuardRoles: against an intentd with authentication on, a guard whose
// token has the roles worker, reader and approver carries a call out; one
// without approver is refused for a tool with approval: call, nothing sent,
// and its answer names why.
func TestGuardRoles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an intentd of its own")
	}
	dir := t.TempDir()
	var f access.File
	for _, p := range []struct {
		name, token string
		roles       []access.Role
	}{
		{"guard", "tok-guard-1a2b", []access.Role{access.RoleWorker, access.RoleReader, access.RoleApprover}},
		{"guard-no-approver", "tok-guard-3c4d", []access.Role{access.RoleWorker, access.RoleReader}},
	} {
		f.Principals = append(f.Principals, access.Entry{Name: p.name, Tenants: []string{"acme"}, Roles: p.roles, TokenSHA256: []string{access.HashToken(p.token)}})
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokens, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := intentdtest.Config(filepath.Join(dir, "intentd"))
	cfg.TokensFile = tokens
	in := intentdtest.Start(t, cfg, slog.New(slog.DiscardHandler))
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	for _, tc := range []struct {
		name, token, outcome, says string
	}{
		{"worker, reader and approver", "tok-guard-1a2b", "executed", "RF-"},
		{"no approver", "tok-guard-3c4d", "refused", "approver role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient(in.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(tc.token)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			g, err := mcpguard.New(context.Background(), mcpguard.Config{Name: "roles", Tenant: "acme", Downstream: &mcpguard.Downstream{URL: url}, Tools: parseTools(t)}, conn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Close(context.Background()) })
			cs := connect(t, g)
			order := unique(t, "ord")
			res := refund(t, cs, "c-1", order, 5)
			if outcome(res) != tc.outcome || !strings.Contains(text(res), tc.says) {
				t.Fatalf("%s %q; want %s saying %q", outcome(res), text(res), tc.outcome, tc.says)
			}
			want := map[string]int{"executed": 1}[tc.outcome]
			if n := r.effectsFor(order); n != want {
				t.Fatalf("%d refunds, want %d", n, want)
			}
			if tc.outcome == "executed" {
				if st := status(t, cs, res.Meta[mcpguard.MetaKey].(string)); st["status"] != "completed" {
					t.Errorf("intent_status with the reader role: %v", st)
				}
			}
		})
	}
}
