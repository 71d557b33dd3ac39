package daemon_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReadmeTour runs the grpcurl tour of README.md, verbatim, against a
// fresh intentd, and checks that each step shows what the README says it
// shows. A README that drifts from the product fails here.
func TestReadmeTour(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "grpcurl")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("bin/grpcurl missing in CI: scripts/install-tools.sh must install it: %v", err)
		}
		t.Skip("bin/grpcurl not installed; run ./scripts/install-tools.sh")
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	script := tourScript(t, string(readme))

	in := start(t, testConfig(t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "ADDR="+in.addr)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("tour failed: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		`"created": true`,
		`"outcome": "OUTCOME_EXECUTE"`,
		`"actionTaken": "recorded"`,
		`"outcome": "OUTCOME_COMPLETED"`,
		`"actionTaken": "none"`,
		`already_completed: intent purchase-lamp-1`,
		`"reason": "STALE_TOKEN"`,
		`"reason": "FINGERPRINT_MISMATCH"`,
		`"accepted": false`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tour output lacks %s\n--- output ---\n%s", want, got)
		}
	}
}

// tourScript extracts the shell block between the tour markers.
func tourScript(t *testing.T, readme string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "<!-- tour:begin -->")
	block, _, ok2 := strings.Cut(rest, "<!-- tour:end -->")
	if !ok || !ok2 {
		t.Fatal("README.md has no tour markers")
	}
	block = strings.TrimSpace(block)
	block = strings.TrimPrefix(block, "```sh")
	block = strings.TrimSuffix(block, "```")
	return block
}
