package readme

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"go/format"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// maxLines is how long the README may grow: read in five minutes, with the
// rest of what it once held in docs/.
const maxLines = 250

// start is how the README begins, byte for byte: the two commands a
// newcomer on a fresh machine with Go runs first.
const start = "# intentd\n\n```sh\n" +
	"go run ./cmd/intentd        # start intentd: embedded etcd, gRPC on 127.0.0.1:7650\n" +
	"./scripts/test.sh           # run every check and the whole test suite\n" +
	"```\n"

// The README's examples name intentd's default addresses; the tests run
// them against an intentd on ports of their own.
const (
	defaultGRPC    = "127.0.0.1:7650"
	defaultConsole = "127.0.0.1:7651"
)

func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// block returns the one fenced block between <!-- name:begin --> and
// <!-- name:end --> of text, without its fence; the test fails unless there
// is exactly one, so that a block moved or renamed is not silently skipped.
func block(t *testing.T, text, name string) string {
	t.Helper()
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	if n := strings.Count(text, begin); n != 1 {
		t.Fatalf("README.md has %d %s blocks, want 1", n, name)
	}
	_, rest, _ := strings.Cut(text, begin)
	b, _, ok := strings.Cut(rest, end)
	if !ok {
		t.Fatalf("README.md: the %s block has no end marker", name)
	}
	b = strings.TrimSpace(b)
	fence, body, ok := strings.Cut(b, "\n")
	if !ok || !strings.HasPrefix(fence, "```") || !strings.HasSuffix(body, "```") {
		t.Fatalf("README.md: the %s block is not one fenced code block:\n%s", name, b)
	}
	return strings.TrimSuffix(body, "```")
}

// TestReadmeShape: the README starts with the two commands, stays within
// maxLines, and links every document of docs/, CONTRIBUTING.md and
// deploy/README.md, so that what moved out of it can be found from it.
func TestReadmeShape(t *testing.T) {
	text := readme(t)
	docs, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md found (%v)", err)
	}
	links := []string{"CONTRIBUTING.md", "deploy/README.md", "python/README.md", "typescript/README.md"}
	for _, doc := range docs {
		links = append(links, "docs/"+filepath.Base(doc))
	}
	type check struct {
		name string
		ok   bool
		why  string
	}
	checks := []check{
		{"starts with the two commands", strings.HasPrefix(text, start), "README.md must start with\n" + start},
		{"at most 250 lines", strings.Count(text, "\n") <= maxLines, fmt.Sprintf("README.md has %d lines, want at most %d", strings.Count(text, "\n"), maxLines)},
	}
	for _, l := range links {
		checks = append(checks, check{"links " + l, strings.Contains(text, "]("+l+")"), "README.md does not link " + l})
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if !c.ok {
				t.Error(c.why)
			}
		})
	}
}

// TestReadmeGoWorker compiles the README's Go worker as a reader would save
// it, runs it twice against a real intentd (in-process, embedded etcd) and
// requires exactly the output the README shows: the first run executes,
// the second is handed the stored result. Go's worker examples used to live
// only in client/example_test.go; a README block nothing ran would rot.
func TestReadmeGoWorker(t *testing.T) {
	text := readme(t)
	src, want := block(t, text, "go-worker"), block(t, text, "go-worker-output")
	if formatted, err := format.Source([]byte(src)); err != nil {
		t.Fatalf("the README's Go worker does not parse: %v\n%s", err, src)
	} else if string(formatted) != src {
		t.Errorf("the README's Go worker is not gofmt'd; gofmt gives:\n%s", formatted)
	}
	if n := strings.Count(src, defaultGRPC); n != 1 {
		t.Fatalf("the README's Go worker names %s %d times, want once (the address this test replaces)", defaultGRPC, n)
	}

	in := intentdtest.Start(t, intentdtest.Config(t.TempDir()), slog.New(slog.DiscardHandler))
	main := filepath.Join(t.TempDir(), "worker", "main.go")
	if err := os.MkdirAll(filepath.Dir(main), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(main, []byte(strings.Replace(src, defaultGRPC, in.Addr, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for run := 1; run <= 2; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, "go", "run", main)
		cmd.Dir = root(t) // as the README says: from the repository root, where Go finds the module
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("run %d of the README's Go worker: %v\n%s", run, err, out)
		}
		got.Write(out)
	}
	if got.String() != want {
		t.Errorf("the README's Go worker, run twice, printed\n%s\nthe README shows\n%s", got.String(), want)
	}
}

// logAttr is one key=value of a text log line; a value is a word or a
// quoted string.
var logAttr = regexp.MustCompile(`([a-z_]+)=("(?:[^"\\]|\\.)*"|\S+)`)

// attrs returns the key=value pairs of a text log line, in order.
func attrs(line string) [][2]string {
	var kv [][2]string
	for _, m := range logAttr.FindAllStringSubmatch(line, -1) {
		kv = append(kv, [2]string{m[1], m[2]})
	}
	return kv
}

// matches reports whether the log line got is the line want of the README:
// the same level and message, and every attribute want shows, with its
// value unless the README elides it (…).
func matches(want, got string) bool {
	gotAttrs := map[string]string{}
	for _, kv := range attrs(got) {
		gotAttrs[kv[0]] = kv[1]
	}
	for _, kv := range attrs(want) {
		v, ok := gotAttrs[kv[0]]
		if !ok || (!strings.Contains(kv[1], "…") && v != kv[1]) {
			return false
		}
	}
	return true
}

// TestReadmeStartup runs `go run ./cmd/intentd`, the README's first command,
// as a newcomer does (no flags; its addresses and data directory moved by
// the environment, so that it runs beside anything) and requires every line
// of "What you see when it starts" among what it prints: the log lines by
// level, message and the attributes shown, intentd's own lines exactly.
func TestReadmeStartup(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs intentd with go run")
	}
	want := strings.Split(strings.TrimSpace(block(t, readme(t), "startup")), "\n")
	grpcAddr, consoleAddr := freeport.Addr(t), freeport.Addr(t)
	for i, l := range want {
		l = strings.ReplaceAll(l, defaultGRPC, grpcAddr)
		want[i] = strings.ReplaceAll(l, defaultConsole, consoleAddr)
	}

	cmd := exec.Command("go", "run", "./cmd/intentd")
	cmd.Dir = root(t)
	// The newcomer's environment: no INTENTD_* settings but the two
	// addresses, and a data directory of its own.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "INTENTD_") && !strings.HasPrefix(kv, "XDG_DATA_HOME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "XDG_DATA_HOME="+t.TempDir(), "INTENTD_LISTEN="+grpcAddr, "INTENTD_METRICS_LISTEN="+consoleAddr)
	// go run does not pass signals on to intentd: stop the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string)
	t.Cleanup(func() {
		go func() { // drain, so that intentd never blocks on its stderr
			for range lines {
			}
		}()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			t.Error("intentd did not stop within 30s of SIGTERM")
			<-exited
		}
	})

	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	var got []string
	missing := func() []string {
		var m []string
		for _, w := range want {
			found := false
			for _, g := range got {
				if strings.HasPrefix(w, "intentd: ") && g == w || strings.HasPrefix(w, "time=") && matches(w, g) {
					found = true
					break
				}
			}
			if !found {
				m = append(m, w)
			}
		}
		return m
	}
	// go run may compile intentd first; once intentd says it serves, what
	// the README shows has been printed within moments, or never will be.
	wait := 5 * time.Minute
	deadline := time.After(wait)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("intentd exited before printing all the README shows; missing:\n%s\n--- it printed ---\n%s",
					strings.Join(missing(), "\n"), strings.Join(got, "\n"))
			}
			got = append(got, l)
			if len(missing()) == 0 {
				return
			}
			if strings.HasPrefix(l, "intentd: serving on") {
				wait = 10 * time.Second
				deadline = time.After(wait)
			}
		case <-deadline:
			t.Fatalf("intentd had not printed, in %v more:\n%s\n--- it printed ---\n%s",
				wait, strings.Join(missing(), "\n"), strings.Join(got, "\n"))
		}
	}
}
