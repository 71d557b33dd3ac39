package mcpguard_test

import (
	"context"
	"encoding/json"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/mcpguard"
)

// The addresses and path docs/MCP.md names; the test runs its blocks on
// ports and files of its own.
const (
	guideIntentd = "127.0.0.1:7650"
	guideRefunds = "127.0.0.1:7680"
	guideConfig  = "/tmp/mcp-guard.yaml"
)

// block is the one fenced block between <!-- name:begin --> and
// <!-- name:end --> of docs/MCP.md, without its fence.
func block(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/MCP.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	if n := strings.Count(text, begin); n != 1 {
		t.Fatalf("docs/MCP.md has %d %s blocks, want 1", n, name)
	}
	_, rest, _ := strings.Cut(text, begin)
	body, _, ok := strings.Cut(rest, end)
	if !ok {
		t.Fatalf("the %s block has no end", name)
	}
	body = strings.TrimSpace(body)
	fence, body, _ := strings.Cut(body, "\n")
	if !strings.HasPrefix(fence, "```") || !strings.HasSuffix(body, "```") {
		t.Fatalf("the %s block is not one fenced code block", name)
	}
	return strings.TrimSuffix(body, "```")
}

// TestGuideConfig: the guide's config file is one the guard reads.
func TestGuideConfig(t *testing.T) {
	j, err := yaml.YAMLToJSON([]byte(block(t, "mcp-config")))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]json.RawMessage
	if err := json.Unmarshal(j, &file); err != nil {
		t.Fatal(err)
	}
	if _, err := mcpguard.ParseDownstream(file["downstream"]); err != nil {
		t.Errorf("the guide's downstream: %v", err)
	}
	if _, err := mcpguard.ParseTools(file["tools"]); err != nil {
		t.Errorf("the guide's tools: %v", err)
	}
}

// TestGuideDemo runs docs/MCP.md as a reader does: intentd, the guide's
// config file, and the guide's program (which starts the guard with go run
// ./cmd/intentd mcp-guard on stdio), saved and run from the repository
// root; it must print exactly what the guide shows.
func TestGuideDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program and intentd")
	}
	src, want := block(t, "mcp-demo"), block(t, "mcp-demo-output")
	if formatted, err := format.Source([]byte(src)); err != nil || string(formatted) != src {
		t.Fatalf("the guide's program is not gofmt'd Go (%v)", err)
	}
	for _, s := range []string{guideRefunds, guideConfig} {
		if strings.Count(src, s) != 1 {
			t.Fatalf("the guide's program names %s %d times, want once", s, strings.Count(src, s))
		}
	}
	refunds, dir := freeport.Addr(t), t.TempDir()
	conf := strings.NewReplacer(guideIntentd, intentdAddr, guideRefunds, refunds).Replace(block(t, "mcp-config"))
	confPath := filepath.Join(dir, "mcp-guard.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	prog := strings.NewReplacer(guideRefunds, refunds, guideConfig, confPath).Replace(src)
	main := filepath.Join(dir, "mcp-demo", "main.go")
	if err := os.MkdirAll(filepath.Dir(main), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(main, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", main)
	cmd.Dir = ".." // the repository root, as the guide says
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the guide's program: %v\n%s%s", err, out, stderr.String())
	}
	if string(out) != want {
		t.Errorf("the guide's program printed\n%s\nthe guide shows\n%s\n(stderr: %s)", out, want, stderr.String())
	}
}
