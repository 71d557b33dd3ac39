package intentdcmd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/intentd/intentd/internal/run/daemon"
)

// writeConfig writes a config file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "intentd.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// settled parses args as intentd would, then settles the flags from env
// and the config file, and returns the flag set's values by name.
func settled(t *testing.T, args []string, env map[string]string) (map[string]string, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	cmd := newCommand(&bytes.Buffer{}, nil)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	if err := settle(cmd.Flags()); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range []string{"listen", "retention", "etcd-endpoints", "max-attempts", "access-log", "rate-per-tenant"} {
		out[name] = cmd.Flags().Lookup(name).Value.String()
	}
	return out, nil
}

// A flag on the command line wins over its environment variable, which
// wins over the config file, which wins over the default.
func TestConfigFilePrecedence(t *testing.T) {
	file := writeConfig(t, `
listen: 127.0.0.1:7001
retention: 48h
etcd-endpoints: [http://e1:2379, http://e2:2379]
max-attempts: 7
access-log: true
rate-per-tenant: 0.5
`)
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want map[string]string
	}{
		{"file over default", []string{"--config", file}, nil, map[string]string{
			"listen": "127.0.0.1:7001", "retention": "48h0m0s", "etcd-endpoints": "[http://e1:2379,http://e2:2379]",
			"max-attempts": "7", "access-log": "true", "rate-per-tenant": "0.5"}},
		{"env over file", []string{"--config", file}, map[string]string{"INTENTD_LISTEN": "127.0.0.1:7002", "INTENTD_MAX_ATTEMPTS": "9"},
			map[string]string{"listen": "127.0.0.1:7002", "max-attempts": "9", "retention": "48h0m0s"}},
		{"flag over env over file", []string{"--config", file, "--listen", "127.0.0.1:7003"}, map[string]string{"INTENTD_LISTEN": "127.0.0.1:7002"},
			map[string]string{"listen": "127.0.0.1:7003", "retention": "48h0m0s"}},
		{"the file named by INTENTD_CONFIG", nil, map[string]string{"INTENTD_CONFIG": file}, map[string]string{"listen": "127.0.0.1:7001"}},
		{"default without a file", nil, nil, map[string]string{"listen": "127.0.0.1:7650", "max-attempts": "10", "access-log": "false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := settled(t, tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range tt.want {
				if got[k] != want {
					t.Errorf("--%s = %q, want %q", k, got[k], want)
				}
			}
		})
	}
}

// A config file's mistake is an error naming the file and the key, and
// intentd does not start (exit 2): a misspelt key must not leave its
// setting silently at the default.
func TestConfigFileMistakesNameTheKey(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{"unknown key", "listen: 127.0.0.1:7001\nretension: 48h\n", `key "retension": unknown key`},
		{"bad duration", "retention: forever\n", `key "retention" "forever": not valid, want a duration`},
		{"bad number", "max-attempts: many\n", `key "max-attempts" "many": not valid, want a whole number`},
		{"mapping value", "listen: {host: x}\n", `key "listen": want a value or a list of values, not a mapping`},
		{"null value", "listen:\n", `key "listen": no value`},
		{"list for a single value", "listen: [a, b]\n", `key "listen": want one value, not a list`},
		{"key given twice", "listen: a\nlisten: b\n", `key "listen" already set`},
		{"not a mapping", "- listen\n", "want a mapping"},
		{"config inside config", "config: other.yaml\n", `key "config": unknown key`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.text)
			stderr, code := runIntentd(t, nil, "--config", path)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d\n%s", code, exitUsage, stderr)
			}
			first, _, _ := strings.Cut(stderr, "\n")
			if !strings.Contains(first, path) || !strings.Contains(first, tt.want) {
				t.Errorf("first stderr line %q, want it to name %s and say %q", first, path, tt.want)
			}
		})
	}
	if stderr, code := runIntentd(t, nil, "--config", filepath.Join(t.TempDir(), "missing.yaml")); code != exitUsage || !strings.Contains(stderr, "--config") {
		t.Errorf("missing file: exit %d, stderr %q; want 2 naming --config", code, stderr)
	}
}

var firstCode = regexp.MustCompile("`([^`]*)`")

// flagTable is docs/CONFIGURATION.md's table of intentd's flags (once the
// README's), between the markers.
func flagTable(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "CONFIGURATION.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- intentd-flags:begin -->")
	block, _, ok2 := strings.Cut(rest, "<!-- intentd-flags:end -->")
	if !ok || !ok2 {
		t.Fatal("docs/CONFIGURATION.md has no intentd-flags block")
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(block, "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[0]), "`--") {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		// A default is its first `code`; words may follow: `8589934592` (8 GiB).
		def := ""
		if m := firstCode.FindStringSubmatch(cells[2]); m != nil {
			def = m[1]
		}
		cells[0], cells[1], cells[2] = strings.Trim(cells[0], "`"), strings.Trim(cells[1], "`"), def
		rows[strings.TrimPrefix(cells[0], "--")] = cells
	}
	return rows
}

// envDependentDefaults are flags whose default --help shows depends on the
// machine (the home directory): the table says how it is found instead.
var envDependentDefaults = map[string]bool{"data-dir": true}

// docs/CONFIGURATION.md's flag table names every flag intentd --help lists,
// and no other, each with its environment variable and default: an operator
// reading it misses nothing, and it cannot rot as flags come and go.
// Hidden (testing-only) flags are in neither.
func TestReadmeFlagTableIsComplete(t *testing.T) {
	out, err := exec.Command(intentdBin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("intentd --help: %v\n%s", err, out)
	}
	rows := flagTable(t)
	fs := newCommand(&bytes.Buffer{}, nil).Flags()
	listed := map[string]bool{}
	var missing []string
	for _, line := range strings.Split(string(out), "\n") {
		field := strings.Fields(line)
		if len(field) > 1 && strings.HasPrefix(field[0], "-") && !strings.HasPrefix(field[0], "--") {
			field = field[1:] // "-v, --version": the shorthand first
		}
		if len(field) == 0 || !strings.HasPrefix(field[0], "--") {
			continue
		}
		name := strings.TrimPrefix(field[0], "--")
		if name == "help" || name == "version" {
			continue // cobra's own: print and exit
		}
		listed[name] = true
		f := fs.Lookup(name)
		row, ok := rows[name]
		if !ok {
			usage, _, _ := strings.Cut(f.Usage, " (env ")
			def := f.DefValue
			if def == "[]" {
				def = ""
			}
			if def != "" {
				def = "`" + def + "`"
			}
			missing = append(missing, fmt.Sprintf("| `--%s` | `%s` | %s | %s |", name, envName(name), def, usage))
			continue
		}
		if row[1] != envName(name) {
			t.Errorf("docs/CONFIGURATION.md: --%s's variable is %q, want %s", name, row[1], envName(name))
		}
		def := f.DefValue
		if def == "[]" {
			def = ""
		}
		if row[2] != def && !envDependentDefaults[name] {
			t.Errorf("docs/CONFIGURATION.md: --%s's default is %q, --help says %q", name, row[2], def)
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/CONFIGURATION.md's flag table lacks %d flags of intentd --help:\n%s", len(missing), strings.Join(missing, "\n"))
	}
	for name := range rows {
		if !listed[name] {
			t.Errorf("docs/CONFIGURATION.md's flag table names --%s, which intentd --help does not list", name)
		}
	}
	if len(listed) < 20 {
		t.Errorf("--help listed %d flags, want all of them (at least 20)", len(listed))
	}
}

// TestNextStepsGivesTheConsoleURL: the line intentd prints once it serves
// names the review console's URL when the HTTP listener is on a known port
// (a wildcard host is reached on loopback), and nothing when it is off.
func TestNextStepsGivesTheConsoleURL(t *testing.T) {
	for _, tc := range []struct{ listen, want string }{
		{"127.0.0.1:7651", "Review console: http://127.0.0.1:7651/console/"},
		{":9000", "Review console: http://127.0.0.1:9000/console/"},
		{"[::1]:7651", "Review console: http://[::1]:7651/console/"},
		{"", ""},
		{"127.0.0.1:0", ""},
	} {
		cfg := daemon.DefaultConfig()
		cfg.MetricsListen = tc.listen
		got := nextSteps("127.0.0.1:7650", cfg)
		if line, _, _ := strings.Cut(got, "\n"); (tc.want == "" && strings.Contains(line, "console")) || !strings.Contains(line, tc.want) {
			t.Errorf("--metrics-listen %q: first line %q, want it to hold %q", tc.listen, line, tc.want)
		}
	}
}
