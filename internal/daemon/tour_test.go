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
		`"state": "STATE_NEEDS_REVIEW"`,
		`"actionTaken": "recorded"`,
		`already_completed: intent refund-77`,
		`"refund_id": "re_123"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tour output lacks %s\n--- output ---\n%s", want, got)
		}
	}
}

// tourScript joins the shell blocks between tour markers, in order: later
// blocks continue in the shell of the earlier ones.
func tourScript(t *testing.T, readme string) string {
	t.Helper()
	var blocks []string
	for {
		_, rest, ok := strings.Cut(readme, "<!-- tour:begin -->")
		if !ok {
			break
		}
		block, after, ok := strings.Cut(rest, "<!-- tour:end -->")
		if !ok {
			t.Fatal("README.md: a tour block has no end marker")
		}
		block = strings.TrimSpace(block)
		block = strings.TrimPrefix(block, "```sh")
		blocks = append(blocks, strings.TrimSuffix(block, "```"))
		readme = after
	}
	if len(blocks) == 0 {
		t.Fatal("README.md has no tour markers")
	}
	return strings.Join(blocks, "\n")
}
