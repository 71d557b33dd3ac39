package doclinks

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// link matches an inline Markdown link or image target: [text](target) or
// [text](target "title").
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestRelativeLinksResolve: every relative link in every Markdown file of
// the repository (tracked, or new and not ignored: a document is checked
// before its first commit) names a path inside the repository that exists,
// and its #fragment, if any, names a heading of the file it points to. The
// README once linked its design document at ../shared/DESIGN.md, outside
// the repository; when the README's sections moved to docs/, every link
// to them had to follow.
func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.md").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	files := strings.Fields(string(out))
	for _, want := range []string{"README.md", "CONTRIBUTING.md", "docs/DESIGN.md", "deploy/README.md"} {
		if !slices.Contains(files, want) {
			t.Errorf("git ls-files lists no %s: the documents are not all checked", want)
		}
	}
	checked := 0
	for _, file := range files {
		text, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			if os.IsNotExist(err) {
				continue // tracked, deleted in the work tree
			}
			t.Fatal(err)
		}
		for _, target := range links(string(text)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			if msg := resolve(root, file, target); msg != "" {
				t.Errorf("%s: link %s: %s", file, target, msg)
			}
		}
	}
	if checked == 0 {
		t.Errorf("checked no relative link in %d Markdown files, want the README's at least", len(files))
	}
}

// links returns the link targets of a Markdown text, outside fenced code
// blocks and inline code.
func links(text string) []string {
	var targets []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(withoutCode(line), -1) {
			targets = append(targets, m[1])
		}
	}
	return targets
}

// withoutCode blanks the inline code spans of a line.
func withoutCode(line string) string {
	parts := strings.Split(line, "`")
	for i := 1; i < len(parts); i += 2 {
		parts[i] = ""
	}
	return strings.Join(parts, "``")
}

// resolve returns why target, linked from file, does not resolve, or "".
func resolve(root, file, target string) string {
	path, fragment, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		if filepath.IsAbs(path) {
			return "absolute path: a clone does not have it; link relative to the file"
		}
		dest = filepath.Join(filepath.Dir(file), path)
		if rel, err := filepath.Rel(root, filepath.Join(root, dest)); err != nil || strings.HasPrefix(rel, "..") {
			return "points outside the repository"
		}
		if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
			return "no such file in the repository"
		}
	}
	if fragment == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	text, err := os.ReadFile(filepath.Join(root, dest))
	if err != nil {
		return err.Error()
	}
	if !headings(string(text))[fragment] {
		return "no heading #" + fragment + " in " + dest
	}
	return ""
}

// headings returns the anchors GitHub gives a Markdown text's headings:
// lower case, spaces to hyphens, letters, digits, - and _ kept, the rest
// dropped.
func headings(text string) map[string]bool {
	anchors := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}

// TestBrokenLinksAreFound: resolve, which TestRelativeLinksResolve applies
// to every document, finds each kind of broken link in a document under
// docs/ (and passes the good ones), in a repository made up for the test: a
// check that cannot fail guards nothing.
func TestBrokenLinksAreFound(t *testing.T) {
	root := t.TempDir()
	for path, text := range map[string]string{
		"README.md":           "# intentd\n\n## A five-minute tour\n",
		"docs/OPERATIONS.md":  "# Operating intentd\n\n## Sizing intentd's memory\n\n```sh\n# not a heading\n```\n",
		"docs/SECURITY.md":    "# Running securely\n",
		"cmd/intentd/main.go": "package main\n",
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const from = "docs/OPERATIONS.md"
	for _, tc := range []struct {
		target string
		broken bool
	}{
		{"SECURITY.md", false},
		{"SECURITY.md#running-securely", false},
		{"../README.md#a-five-minute-tour", false},
		{"#sizing-intentds-memory", false},
		{"../cmd/intentd", false},
		{"../cmd/intentd/main.go", false},
		{"BACKUP.md", true},                     // no such file
		{"SECURITY.md#roles-and-tenants", true}, // no such heading
		{"#not-a-heading", true},                // a comment in a code block is no heading
		{"../README.md#running-it", true},       // a section that moved away
		{"../../shared/DESIGN.md", true},        // outside the repository
		{"/docs/SECURITY.md", true},             // absolute
		{"docs/SECURITY.md", true},              // relative to the root, not to the file
	} {
		t.Run(tc.target, func(t *testing.T) {
			msg := resolve(root, from, tc.target)
			if broken := msg != ""; broken != tc.broken {
				t.Errorf("resolve(%s, %s) = %q, want broken %v", from, tc.target, msg, tc.broken)
			}
		})
	}
	// And links finds the targets to check, outside code.
	got := links("[a](SECURITY.md) `[b](BACKUP.md)`\n```\n[c](X.md)\n```\n[d](#e \"title\")")
	if want := []string{"SECURITY.md", "#e"}; !slices.Equal(got, want) {
		t.Errorf("links = %q, want %q", got, want)
	}
}
