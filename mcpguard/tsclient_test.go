package mcpguard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/intentd/intentd/mcpguard"
)

// TestTypeScriptClient: a host on the official TypeScript MCP SDK (pinned in
// testdata/ts-client, installed by its install.sh) calls a refund three
// times through the guard over streamable HTTP: one refund, the first
// answer the downstream's, the others replays; the guard's own tools are
// listed read-only.
func TestTypeScriptClient(t *testing.T) {
	dir := filepath.Join("testdata", "ts-client")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skip("the TypeScript MCP SDK is not installed: run mcpguard/testdata/ts-client/install.sh (npm ci)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on PATH: the TypeScript MCP client cannot run")
	}
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	g := newGuard(t, "ts", &mcpguard.Downstream{URL: url}, 0)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server() }, nil))
	t.Cleanup(srv.Close)
	order := unique(t, "ord")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs", srv.URL, order)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the TypeScript client: %v\n%s", err, out)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("the TypeScript client printed %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 5 {
		t.Fatalf("the TypeScript client printed %d lines, want 5:\n%s", len(lines), out)
	}
	if tools := lines[0]["tools"].([]any); len(tools) != 7 || lines[0]["statusReadOnly"] != true {
		t.Errorf("tools through the guard: %v", lines[0])
	}
	for i, want := range []string{"executed", "replayed", "replayed"} {
		if got := lines[1+i]; got["outcome"] != want || got["isError"] != false {
			t.Errorf("call %d: %v, want %s", i, got, want)
		}
	}
	if lines[4]["status"] != "completed" {
		t.Errorf("intent_status: %v", lines[4])
	}
	if n := r.effectsFor(order); n != 1 {
		t.Fatalf("%d refunds, want 1", n)
	}
}
