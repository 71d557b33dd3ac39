package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// sessionTTL is the shortest session TTL intentd accepts: leases of a
// stopped or killed worker lapse this long after its last heartbeat.
const sessionTTL = 2 * time.Second

// TestMain builds cmd/intentd once for every test (see harness.Main).
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Want{}, nil))
}

// startIntentd starts intentd with an embedded etcd in a fresh data
// directory and waits until it serves. It is stopped when the test ends.
// Under -short it skips the test.
func startIntentd(t *testing.T) *harness.Intentd {
	t.Helper()
	return harness.StartIntentd(t, harness.Bins(t), "intentd", harness.IntentdConfig{})
}

// clientOf returns a client on a fresh connection to d, closed when the
// test ends.
func clientOf(t *testing.T, d *harness.Intentd) *client.Client {
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
	conn, err := harness.Dial(addr)
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

// child is a worker child process (see TestWorkerProcess). It prints
// progress lines on stdout that the parent waits for.
type child struct {
	t     *testing.T
	p     *harness.Process
	stdin io.WriteCloser
	lines chan string // closed when stdout closes
	out   *testlog.Lines
}

// startChild starts a worker child process running spec; it is killed if
// still running when the test ends.
func startChild(t *testing.T, spec childSpec) *child {
	t.Helper()
	cmd, err := harness.ChildCommand(spec, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, stdin: stdin, lines: make(chan string, 1000), out: &testlog.Lines{}}
	c.p, err = harness.StartProcess(cmd, harness.ProcessConfig{
		Name: "worker child " + spec.Mode,
		Logs: c.out,
		Stdout: func(stdout io.Reader) {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				c.out.Add(sc.Text())
				c.lines <- sc.Text()
			}
			close(c.lines)
		},
	})
	if err != nil {
		t.Fatalf("start worker child: %v", err)
	}
	t.Cleanup(func() {
		c.p.Kill()
		if t.Failed() {
			t.Logf("worker child %s output:\n%s", spec.Mode, c.out.Tail(40))
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
	if err := c.p.Signal(sig); err != nil {
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
	case <-c.p.Exited():
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
