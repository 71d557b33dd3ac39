package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testlog"
)

var (
	seedFlag = flag.Int64("seed", 1, "seed of the chaos scenario's fault plan (printed by the test)")
	soakFlag = flag.Bool("soak", false, "also run the long soak: more intents, more workers, more faults")
)

// The environment of a worker child process (see TestWorkerProcess).
const (
	envWorkerMode = "E2E_WORKER_MODE" // what the child does; unset in the parent
	envIntentd    = "E2E_INTENTD"     // intentd's gRPC address
	envMerchant   = "E2E_MERCHANT"    // the merchant's base URL
	envGateway    = "E2E_GATEWAY"     // the courier gateway's base URL
	envKey        = "E2E_KEY"         // the intent to work on
	envTTL        = "E2E_TTL"         // the worker's session TTL
)

// sessionTTL is the shortest session TTL intentd accepts: leases of a
// stopped or killed worker lapse this long after its last heartbeat.
const sessionTTL = 2 * time.Second

// intentdBin is the intentd binary TestMain built.
var intentdBin string

// TestMain builds cmd/intentd once for every test. A worker child process
// (envWorkerMode set) builds nothing: it only runs TestWorkerProcess; nor
// does -short, which skips every scenario (startIntentd).
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(envWorkerMode) != "" || testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "intentd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	intentdBin, err = buildIntentd(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildIntentd runs `go build -o <dir>/intentd ./cmd/intentd` in the module
// root, the directory above this package.
func buildIntentd(dir string) (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.Contains(mod, []byte("module github.com/intentd/intentd\n")) {
		return "", fmt.Errorf("%s is not the intentd module root (go.mod: %v)", root, err)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no go command to build intentd with: %w", err)
	}
	bin := filepath.Join(dir, "intentd")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", bin, "./cmd/intentd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/intentd: %v\n%s", err, out)
	}
	return bin, nil
}

// intentd is a running intentd process.
type intentd struct {
	// Addr is its gRPC address.
	Addr   string
	cmd    *exec.Cmd
	logs   *testlog.Lines
	exited chan struct{}
}

// startIntentd starts intentd with an embedded etcd in a fresh data
// directory, on loopback ports of its choosing, and waits until it logs
// "intentd serving". It is stopped (SIGTERM, SIGKILL after 10s) when the
// test ends.
func startIntentd(t *testing.T) *intentd {
	t.Helper()
	if testing.Short() {
		t.Skip("the end-to-end scenarios run without -short")
	}
	dataDir := t.TempDir()
	cmd := exec.Command(intentdBin,
		"--listen", "127.0.0.1:0",
		"--data-dir", dataDir,
		"--embed-client-url", "http://127.0.0.1:0",
		"--embed-peer-url", "http://127.0.0.1:0",
		"--janitor-interval", "200ms",
		"--metrics-listen", "127.0.0.1:0",
		"--log-format", "json",
	)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start intentd: %v", err)
	}
	d := &intentd{cmd: cmd, logs: &testlog.Lines{}, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() { // exits when intentd closes stderr (it exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			line := sc.Text()
			d.logs.Add(line)
			if found {
				continue
			}
			var rec struct {
				Msg  string `json:"msg"`
				GRPC string `json:"grpc"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "intentd serving" && rec.GRPC != "" {
				found = true
				addr <- rec.GRPC
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() { d.stop(t) })
	select {
	case d.Addr = <-addr:
		return d
	case <-d.exited:
		t.Fatalf("intentd exited before serving:\n%s", d.logs.Tail(40))
	case <-time.After(30 * time.Second):
		t.Fatalf("intentd did not log \"intentd serving\" within 30s:\n%s", d.logs.Tail(40))
	}
	return nil
}

// stop sends SIGTERM, and SIGKILL if intentd is still there 10s later.
func (d *intentd) stop(t *testing.T) {
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("intentd ignored SIGTERM for 10s; killing it")
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	}
	if t.Failed() {
		t.Logf("intentd log (last lines):\n%s", d.logs.Tail(30))
	}
}

// client returns a client on a fresh connection to d, closed when the test
// ends.
func (d *intentd) client(t *testing.T) *client.Client {
	t.Helper()
	c, closeConn, err := dialIntentd(d.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeConn() })
	return c
}

// dialIntentd connects to intentd at addr with the options every worker
// here uses: short per-attempt deadlines, and reports that keep trying
// for 20s.
func dialIntentd(addr string, opts ...client.Option) (*client.Client, func() error, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return newClient(conn, opts...), conn.Close, nil
}

func newClient(conn grpc.ClientConnInterface, opts ...client.Option) *client.Client {
	base := []client.Option{client.WithCallTimeout(5 * time.Second), client.WithReportTimeout(20 * time.Second), client.WithBackoff(20*time.Millisecond, 500*time.Millisecond)}
	return client.New(conn, append(base, opts...)...)
}

// openSession opens a worker session, closed when the test ends.
func openSession(t *testing.T, c *client.Client, worker string, ttl time.Duration) *client.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.OpenSession(ctx, worker, ttl)
	if err != nil {
		t.Fatalf("OpenSession(%s): %v", worker, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx) // a session already lost is gone at the server too
	})
	return s
}

// testCtx is the deadline every scenario runs under.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// serve starts h on a loopback httptest server, closed when the test ends.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// get reads an intent with its history and children.
func get(t *testing.T, c *client.Client, key string) *intentv1.Intent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, &intentv1.GetRequest{Key: key})
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return resp.GetIntent()
}

// entries returns the intent's history entries of kind.
func entries(in *intentv1.Intent, kind intentv1.HistoryEntry_Kind) []*intentv1.HistoryEntry {
	var out []*intentv1.HistoryEntry
	for _, e := range in.GetHistory() {
		if e.GetKind() == kind {
			out = append(out, e)
		}
	}
	return out
}

// story renders an intent's history as one line per entry, for failure
// messages.
func story(in *intentv1.Intent) string {
	var b strings.Builder
	for _, e := range in.GetHistory() {
		fmt.Fprintf(&b, "  %s token=%d mode=%s accepted=%t worker=%s reason=%q\n",
			strings.TrimPrefix(e.GetKind().String(), "KIND_"), e.GetToken(), e.GetMode(), e.GetAccepted(), e.GetWorker(), e.GetReason())
	}
	return b.String()
}

// child is a worker child process: the test binary re-executed with
// envWorkerMode set, running TestWorkerProcess only. It prints progress
// lines on stdout that the parent waits for.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // closed when stdout closes
	out    *testlog.Lines
	exited chan struct{}
}

// startChild starts a worker child process in mode with the extra
// environment env ("NAME=value"); it is killed if still running when the
// test ends.
func startChild(t *testing.T, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(append(os.Environ(), envWorkerMode+"="+mode), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &testlog.Lines{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker child: %v", err)
	}
	c := &child{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 1000), out: out, exited: make(chan struct{})}
	go func() { // exits when the child closes stdout (it exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.Add(sc.Text())
			c.lines <- sc.Text()
		}
		close(c.lines)
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("worker child %s output:\n%s", mode, out.Tail(40))
		}
	})
	return c
}

// expect waits for the child's next line starting with prefix and returns
// the rest of it. A line "error ..." or the child's exit fails the test.
func (c *child) expect(prefix string, within time.Duration) string {
	c.t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("worker child exited before printing %q:\n%s", prefix, c.out.Tail(40))
			}
			if strings.HasPrefix(line, "error ") {
				c.t.Fatalf("worker child: %s", line)
			}
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				return strings.TrimSpace(rest)
			}
		case <-timer.C:
			c.t.Fatalf("worker child printed no %q within %v:\n%s", prefix, within, c.out.Tail(40))
		}
	}
}

// signal sends sig to the child.
func (c *child) signal(sig syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %v to worker child: %v", sig, err)
	}
}

// send writes one line to the child's stdin.
func (c *child) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		c.t.Fatalf("write to worker child: %v", err)
	}
}

// wait waits for the child to exit.
func (c *child) wait(within time.Duration) {
	c.t.Helper()
	select {
	case <-c.exited:
	case <-time.After(within):
		c.t.Fatalf("worker child still running after %v:\n%s", within, c.out.Tail(40))
	}
}

// field returns the value of name=value in a progress line's fields.
func field(line, name string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}
