package intentdcmd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/intentd/intentd/internal/core/freeport"
)

// intentdBin is cmd/intentd (this package) built as a binary: these tests run intentd
// as a user does, exit status and stderr included.
var intentdBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "intentd-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	intentdBin = filepath.Join(dir, "intentd")
	if out, err := exec.Command("go", "build", "-o", intentdBin, "../../../cmd/intentd").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// runIntentd runs the binary to its end (it must end within 30s) and
// returns its stderr and exit status.
func runIntentd(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, intentdBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stderr.String(), 0
	case errors.As(err, &exit):
		return stderr.String(), exit.ExitCode()
	default:
		t.Fatalf("run intentd %v: %v", args, err)
		return "", 0
	}
}

// A bad flag, an unknown flag or a stray argument used to exit 1 with no
// output at all: cobra found it before RunE, and errors were silenced.
// Each must print one line naming the flag (or argument) and the problem,
// then the usage hint, and exit 2; nothing is started. A failure while
// starting is still exit 1, with its message.
func TestBadFlagIsNotSilent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		args      []string
		wantCode  int
		wantFirst string // the first line of stderr
	}{
		{"bad duration", nil, []string{"--retention", "bogus"}, exitUsage,
			`intentd: --retention "bogus": not valid, want a duration such as 500ms, 90s, 15m or 720h`},
		{"bad duration, = form", nil, []string{"--request-timeout=abc"}, exitUsage,
			`intentd: --request-timeout "abc": not valid, want a duration such as 500ms, 90s, 15m or 720h`},
		{"bad number", nil, []string{"--rate-per-principal", "abc"}, exitUsage,
			`intentd: --rate-per-principal "abc": not valid, want a number such as 500 or 0.5`},
		{"bad integer", nil, []string{"--max-recv-msg-size", "x"}, exitUsage,
			`intentd: --max-recv-msg-size "x": not valid, want a whole number`},
		{"bad bool", nil, []string{"--insecure=maybe"}, exitUsage,
			`intentd: --insecure "maybe": not valid, want true or false`},
		{"negative heap floor", nil, []string{"--gc-heap-floor", "-1"}, exitUsage,
			`intentd: --gc-heap-floor -1: want 0 (off) or a number of bytes`},
		{"unknown flag", nil, []string{"--foo"}, exitUsage,
			`intentd: unknown flag: --foo`},
		{"flag without its value", nil, []string{"--listen"}, exitUsage,
			`intentd: flag needs an argument: --listen`},
		{"stray argument", nil, []string{"serve"}, exitUsage,
			`intentd: unexpected argument "serve": intentd takes flags only`},
		// A bad --listen used to print three lines: the parse error, then
		// the loopback rules of TLS and of tokens about the same address.
		{"listen without a port", nil, []string{"--listen", "bogus"}, exitUsage,
			`intentd: --listen "bogus": address bogus: missing port in address`},
		{"listen off loopback, plaintext and anonymous", nil, []string{"--listen", "10.0.0.1:7650"}, exitUsage,
			`intentd: --listen 10.0.0.1:7650: off loopback intentd needs TLS and callers it knows; give --tls-cert, --tls-key and --tokens-file, or --insecure`},
		{"value out of range", nil, []string{"--retention", "-1h"}, exitUsage,
			`intentd: --retention -1h0m0s: must be positive`},
		{"bad environment variable", []string{"INTENTD_RETENTION=bogus"}, nil, exitUsage,
			`intentd: INTENTD_RETENTION (--retention) "bogus": not valid, want a duration such as 500ms, 90s, 15m or 720h`},
		{"archive DSN that does not parse", []string{"INTENTD_ARCHIVE_DSN=postgres://intentd:s3cret@db:notaport/intents"}, nil, exitUsage,
			`intentd: --archive-dsn: cannot parse`},
		{"etcd unreachable is a runtime failure", nil, []string{
			"--etcd-endpoints", "http://127.0.0.1:1", "--dial-timeout", "1s",
			"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "",
		}, exitFailure, `intentd: etcd at [http://127.0.0.1:1] does not answer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stderr, code := runIntentd(t, tc.env, tc.args...)
			if code != tc.wantCode {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, tc.wantCode, stderr)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if !strings.HasPrefix(lines[0], tc.wantFirst) {
				t.Errorf("first line of stderr %q, want it to start with %q", lines[0], tc.wantFirst)
			}
			if tc.wantCode != exitUsage {
				return
			}
			want := []string{lines[0], "Run 'intentd --help' for usage."}
			if len(lines) != 2 || lines[1] != want[1] {
				t.Errorf("stderr %q, want exactly %q", lines, want)
			}
		})
	}
}

// A --archive-dsn nothing answers at stops intentd at start with exit 2
// (a setting to fix, like a bad flag) and one line naming the flag, never
// the password, before the embedded etcd is started.
func TestUnreachableArchiveExitsTwo(t *testing.T) {
	addr := freeport.Addr(t) // nothing listens there now
	stderr, code := runIntentd(t, []string{"INTENTD_ARCHIVE_DSN=postgres://intentd:s3cret@" + addr + "/intents?sslmode=disable"},
		"--dial-timeout", "2s", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if code != exitUsage {
		t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitUsage, stderr)
	}
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "intentd: --archive-dsn: PostgreSQL did not answer within --dial-timeout 2s") {
		t.Errorf("stderr %q, want one line naming --archive-dsn", lines)
	}
	if strings.Contains(stderr, "s3cret") {
		t.Errorf("stderr shows the password: %q", stderr)
	}
}

// intentd --help lists, for every flag, the environment variable that sets
// it (it used to say so only in general, in the package doc).
func TestHelpNamesEveryFlagsEnvironmentVariable(t *testing.T) {
	out, err := exec.Command(intentdBin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("intentd --help: %v\n%s", err, out)
	}
	cmd := newCommand(&bytes.Buffer{}, nil)
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		field := strings.Fields(line)
		if len(field) == 0 || !strings.HasPrefix(field[0], "--") || field[0] == "--help" {
			continue
		}
		n++
		name := strings.TrimPrefix(field[0], "--")
		if want := "(env " + envName(name) + ")"; !strings.Contains(line, want) {
			t.Errorf("--help line %q lacks %s", line, want)
		}
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("--help lists --%s, which is no flag", name)
		}
	}
	if n < 20 {
		t.Errorf("--help listed %d flags, want all of them (at least 20):\n%s", n, out)
	}
}

// Started by hand, intentd used to say only a log line; once it serves it
// now says where and what to try next, in one plain line (a second one
// only under `go run`), and a SIGTERM to the process stops it cleanly.
func TestServingSaysWhereAndWhatNext(t *testing.T) {
	cmd := exec.Command(intentdBin,
		"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--embed-peer-url", "http://127.0.0.1:0", "--metrics-listen", "")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := linesOf(stderr)
	timeout := time.After(60 * time.Second)
	var plain []string
	// The plain line is printed once intentd serves; its first health log
	// line may come just before or just after it.
	for healthy := false; !healthy || len(plain) == 0; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("intentd exited before saying it serves: %v", cmd.Wait())
			}
			if strings.HasPrefix(l, "intentd: ") {
				plain = append(plain, l)
			}
			healthy = healthy || strings.Contains(l, "msg=health")
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatal("intentd did not report its health within 60s")
		}
	}
	if len(plain) != 1 {
		t.Fatalf("plain lines %q, want one (the built binary is not under go run)", plain)
	}
	if !strings.Contains(plain[0], "serving on 127.0.0.1:") || !strings.Contains(plain[0], "README.md") || !strings.Contains(plain[0], "intentctl --addr 127.0.0.1:") {
		t.Errorf("plain line %q, want where intentd serves, the README tour and intentctl", plain[0])
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range lines { // drain until intentd closes stderr
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("intentd after SIGTERM: %v, want exit 0", err)
	}
}

// Under `go run`, SIGTERM to the go command orphans intentd; intentd says so
// when it runs from a binary go run built.
func TestUnderGoRun(t *testing.T) {
	for _, tc := range []struct {
		exe  string
		want bool
	}{
		{"/tmp/go-build3921/b001/exe/intentd", true},
		{"/home/a/.cache/go-build/x/intentd", true},
		{"/home/a/src/intentd/bin/intentd", false},
		{"/usr/local/bin/intentd", false},
	} {
		if got := underGoRun(tc.exe); got != tc.want {
			t.Errorf("underGoRun(%q) = %v, want %v", tc.exe, got, tc.want)
		}
	}
}

// The shipped binary used to carry a hidden --fault-clock-offset-file that
// shifted intentd's wall clock: a test's fault hook in production. No flag
// is hidden now (a test's faults live in mains of the e2e module, which
// change the config through Configure), and that one is unknown.
func TestNoFaultHookInTheShippedBinary(t *testing.T) {
	newCommand(&bytes.Buffer{}, nil).Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			t.Errorf("--%s is a hidden flag; intentd documents every flag it has", f.Name)
		}
	})
	// The stray argument keeps an intentd that still had the flag from
	// starting: it would exit 2 naming the argument instead.
	stderr, code := runIntentd(t, nil, "--fault-clock-offset-file", "offset", "stray")
	if code != 2 || !strings.Contains(stderr, "fault-clock-offset-file") {
		t.Errorf("intentd --fault-clock-offset-file: exit %d, stderr %q; want exit 2 naming the unknown flag", code, stderr)
	}
}

// linesOf sends r's lines until it ends (a process closing its stderr),
// then closes the channel.
func linesOf(r io.Reader) <-chan string {
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return lines
}
