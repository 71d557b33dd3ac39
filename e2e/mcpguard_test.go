package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/intentd/intentd/e2e/harness"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// The MCP guard as it ships: `intentd mcp-guard` processes (the built
// intentd) serving streamable HTTP in front of a refunds MCP server that
// refunds on every call, with hosts on the official Go MCP SDK. Repeats
// from two hosts make one refund; a guard killed while the refund is under
// way and started again never refunds twice.

// mcpRefunds is the downstream: create_refund refunds every time (hold
// makes it refund, then keep the answer until released); find_refund
// finds a refund by the reference the guard sends.
type mcpRefunds struct {
	url string

	mu    sync.Mutex
	byRef map[string]string
	total int
	hold  chan struct{}
	made  chan string
}

func newMCPRefunds(t *testing.T) *mcpRefunds {
	r := &mcpRefunds{byRef: map[string]string{}}
	s := mcp.NewServer(&mcp.Implementation{Name: "refunds", Version: "1"}, nil)
	type refundArgs struct {
		OrderID   string  `json:"order_id"`
		Amount    float64 `json:"amount"`
		Reference string  `json:"reference,omitempty"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "create_refund"}, func(ctx context.Context, _ *mcp.CallToolRequest, a refundArgs) (*mcp.CallToolResult, map[string]any, error) {
		r.mu.Lock()
		r.total++
		id := fmt.Sprintf("RF-%d", r.total)
		r.byRef[a.Reference] = id
		hold, made := r.hold, r.made
		r.mu.Unlock()
		if made != nil {
			made <- a.Reference
		}
		if hold != nil {
			select {
			case <-hold:
			case <-ctx.Done():
			}
		}
		return nil, map[string]any{"refund_id": id}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "find_refund"}, func(_ context.Context, _ *mcp.CallToolRequest, a struct {
		Reference string `json:"reference"`
	}) (*mcp.CallToolResult, map[string]any, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		id, ok := r.byRef[a.Reference]
		return nil, map[string]any{"found": ok, "refund_id": id}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *mcpRefunds) refunds() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// mcpGuard is an `intentd mcp-guard` process on a fixed loopback port.
type mcpGuard struct {
	url  string
	cmd  func() *exec.Cmd
	logs *testlog.Lines
	proc *harness.Process
}

func startMCPGuard(t *testing.T, intentdAddr, downstream string) *mcpGuard {
	t.Helper()
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`downstream: {url: %s}
session-ttl: 2s
tools:
  create_refund:
    action: refund.create
    identity: {arguments: [order_id], meta: [customer]}
    operation-key: {argument: reference}
    lookup: {tool: find_refund, argument: reference}
`, downstream)
	path := filepath.Join(t.TempDir(), "mcp-guard.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	bin := harness.Bins(t).Intentd
	g := &mcpGuard{url: "http://" + addr + "/mcp", logs: &testlog.Lines{}, cmd: func() *exec.Cmd {
		return exec.Command(bin, "mcp-guard", "--config", path, "--listen", addr, "--intentd", intentdAddr, "--log-format", "json")
	}}
	t.Cleanup(func() {
		if g.proc != nil {
			g.proc.Terminate(10 * time.Second)
		}
		if t.Failed() {
			t.Logf("mcp-guard log (last lines):\n%s", g.logs.Tail(20))
		}
	})
	g.start(t)
	return g
}

// start starts the process (again) and waits until it logs that it serves.
func (g *mcpGuard) start(t *testing.T) {
	t.Helper()
	serving := make(chan struct{})
	var once sync.Once
	p, err := harness.StartProcess(g.cmd(), harness.ProcessConfig{Name: "mcp-guard", Logs: g.logs, OnLine: func(line string) {
		var rec struct{ Msg string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "intentd mcp-guard serving" {
			once.Do(func() { close(serving) })
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	g.proc = p
	select {
	case <-serving:
	case <-p.Exited():
		t.Fatalf("mcp-guard exited before serving:\n%s", g.logs.Tail(20))
	case <-time.After(30 * time.Second):
		p.Kill()
		t.Fatalf("mcp-guard did not serve within 30s:\n%s", g.logs.Tail(20))
	}
}

// mcpHost is an MCP client session with the guard at url.
func mcpHost(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-host", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func refundThrough(ctx context.Context, cs *mcp.ClientSession, order string) (*mcp.CallToolResult, error) {
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_refund", Meta: mcp.Meta{"customer": "c-e2e"},
		Arguments: map[string]any{"order_id": order, "amount": 30}})
}

func mcpOutcome(res *mcp.CallToolResult) string {
	if res == nil {
		return "<no answer>"
	}
	s, _ := res.Meta["intentd/outcome"].(string)
	return s
}

func TestMCPGuardRepeatsAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts intentd and mcp-guard processes")
	}
	d := startIntentd(t)
	r := newMCPRefunds(t)
	g := startMCPGuard(t, d.Addr, r.url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("repeats from two hosts", func(t *testing.T) {
		order := fmt.Sprintf("ord-repeat-%d", time.Now().UnixNano())
		a, b := mcpHost(t, g.url), mcpHost(t, g.url)
		var got []string
		for _, cs := range []*mcp.ClientSession{a, b, a} {
			res, err := refundThrough(ctx, cs, order)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, mcpOutcome(res))
		}
		if strings.Join(got, ",") != "executed,replayed,replayed" || r.refunds() != 1 {
			t.Fatalf("answers %v, %d refunds; want executed then replayed twice, 1 refund", got, r.refunds())
		}
	})

	t.Run("guard killed mid-call", func(t *testing.T) {
		before := r.refunds()
		order := fmt.Sprintf("ord-killed-%d", time.Now().UnixNano())
		r.mu.Lock()
		r.hold, r.made = make(chan struct{}), make(chan string, 1)
		r.mu.Unlock()
		host := mcpHost(t, g.url)
		go func() { _, _ = refundThrough(ctx, host, order) }()
		select {
		case <-r.made:
		case <-ctx.Done():
			t.Fatal("the refund never reached the downstream")
		}
		g.proc.Kill()
		r.mu.Lock()
		close(r.hold)
		r.hold, r.made = nil, nil
		r.mu.Unlock()
		g.start(t)
		again := mcpHost(t, g.url)
		var res *mcp.CallToolResult
		for ctx.Err() == nil { // in progress until the killed guard's 2s session lapses
			var err error
			if res, err = refundThrough(ctx, again, order); err != nil {
				t.Fatal(err)
			}
			if mcpOutcome(res) != "in_progress" {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if mcpOutcome(res) != "looked_up" || r.refunds() != before+1 {
			t.Fatalf("after the restart: %s, %d refunds; want looked_up and one refund", mcpOutcome(res), r.refunds()-before)
		}
	})
}
