// Package scripts holds the tests of the shell scripts beside it and of
// what the README and docs/ say about them: the scripts are what a
// newcomer runs first, and each mismatch here once stopped one.
package scripts

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// scriptVar is the value of NAME=value at the start of a line of a script.
func scriptVar(t *testing.T, script, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `="?([^"\s]+)"?`).FindStringSubmatch(read(t, script))
	if m == nil {
		t.Fatalf("%s sets no %s", script, name)
	}
	return m[1]
}

// The README's tours get grpcurl with one `go install`, no root and no
// Debian packages; it must be the version install-tools.sh pins, which the
// tests run.
func TestReadmeGrpcurlIsThePinnedOne(t *testing.T) {
	pinned := scriptVar(t, "install-tools.sh", "GRPCURL_VERSION")
	installs := regexp.MustCompile(`go install github\.com/fullstorydev/grpcurl/cmd/grpcurl@(\S+?)[`+"`"+`\s]`).FindAllStringSubmatch(read(t, "../README.md"), -1)
	if len(installs) == 0 {
		t.Fatal("README.md shows no `go install github.com/fullstorydev/grpcurl/cmd/grpcurl@…` for the tour")
	}
	for _, m := range installs {
		if m[1] != pinned {
			t.Errorf("README.md installs grpcurl@%s, install-tools.sh pins GRPCURL_VERSION=%s", m[1], pinned)
		}
	}
}

// install-tools.sh used to exit 1 on any Node.js but 20 ("Node.js 20 is
// needed"), and test.sh runs it first, so the whole suite failed on a
// machine with a current Node although typescript/package.json accepts
// Node ≥ 20. Any major from the minimum on is accepted now.
func TestNodeCheckAcceptsNewerMajors(t *testing.T) {
	script, err := filepath.Abs("check-node.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		node     string // what `node --version` prints; empty: node fails
		ok       bool
		untested bool // the check says the major is untested
	}{
		{"v18.20.4", false, false},
		{"v19.9.0", false, false},
		{"v20.20.2", true, false},
		{"v22.11.0", true, true},
		{"v24.1.0", true, true},
		{"v100.0.0", true, true},
		{"", false, false},
		{"not a version", false, false},
	} {
		t.Run(tc.node, func(t *testing.T) {
			bin := t.TempDir()
			fake := "#!/bin/sh\nexit 1\n"
			if tc.node != "" {
				fake = "#!/bin/sh\necho '" + tc.node + "'\n"
			}
			if err := os.WriteFile(filepath.Join(bin, "node"), []byte(fake), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", script)
			cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
			out, err := cmd.CombinedOutput()
			if ok := err == nil; ok != tc.ok {
				t.Fatalf("node %q: check-node.sh: %v, want ok=%v\n%s", tc.node, err, tc.ok, out)
			}
			if untested := strings.Contains(string(out), "tested on"); tc.ok && untested != tc.untested {
				t.Errorf("node %q: output %q, want the untested note %v", tc.node, out, tc.untested)
			}
		})
	}
}

// The minimum Node.js the check accepts is what package.json's engines
// says, no more and no less.
func TestNodeMinimumIsTheEngines(t *testing.T) {
	var pkg struct {
		Engines struct{ Node string } `json:"engines"`
	}
	if err := json.Unmarshal([]byte(read(t, "../typescript/package.json")), &pkg); err != nil {
		t.Fatal(err)
	}
	if want := ">=" + scriptVar(t, "check-node.sh", "NODE_MIN"); pkg.Engines.Node != want {
		t.Errorf("typescript/package.json engines.node %q, check-node.sh accepts %q", pkg.Engines.Node, want)
	}
}

// test.sh's sizing steps name the commands whose figures
// docs/PERFORMANCE.md gives (the README gave them once); they used to cite
// -n 1000000 and -n 50000 while the figures came from -n 100000 and
// -n 20000.
func TestSizingStepsCiteTheFiguresCommands(t *testing.T) {
	perf := read(t, "../docs/PERFORMANCE.md")
	cites := regexp.MustCompile(`docs/PERFORMANCE\.md's figures: ([^)]*)\)`).FindAllStringSubmatch(read(t, "test.sh"), -1)
	if len(cites) < 2 {
		t.Fatalf("test.sh cites %d of docs/PERFORMANCE.md's figures, want the two sizing steps", len(cites))
	}
	for _, c := range cites {
		if !strings.Contains(perf, "`"+c[1]+"`") {
			t.Errorf("test.sh cites docs/PERFORMANCE.md's figures of `%s`, which docs/PERFORMANCE.md does not show", c[1])
		}
	}
}

// What the blocks of the README and docs/ write in the repository root
// stays out of git: the backup file was not ignored, and `git add .` after
// the backup example would have committed every intent.
func TestReadmeOutputsAreIgnored(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git here")
	}
	for _, tc := range []struct{ doc, written, path string }{
		{"docs/BACKUP.md", "snapshot save intentd-backup.db", "intentd-backup.db"},
		{"docs/SECURITY.md", "dev-certs --out certs", "certs/ca.pem"},
		{"docs/SECURITY.md", "cat > tokens.json", "tokens.json"},
		{"README.md", `GOBIN="$PWD/bin" go install`, "bin/grpcurl"}, // the tour
	} {
		if !strings.Contains(read(t, "../"+tc.doc), tc.written) {
			t.Errorf("%s no longer says %q: update this test", tc.doc, tc.written)
			continue
		}
		cmd := exec.Command("git", "check-ignore", "-q", "--no-index", tc.path)
		cmd.Dir = ".."
		if err := cmd.Run(); err != nil {
			t.Errorf("%s (%s: %s) is not git-ignored: %v", tc.path, tc.doc, tc.written, err)
		}
	}
}
