package mcpguard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/intentdtest"
	"github.com/intentd/intentd/mcpguard"
)

// The tests' world: one real intentd for the package (its own embedded
// etcd), a downstream MCP server on the official Go SDK that refunds
// without any idempotency and counts every refund in a file (so that a
// downstream killed and started again keeps the count), the guard in front
// of it, and MCP clients of the same SDK calling through the guard.

var intentdAddr string

// The roles this test binary plays as a child process.
const (
	roleEnv = "MCPGUARD_TEST_ROLE"
	dirEnv  = "MCPGUARD_TEST_DIR"
	confEnv = "MCPGUARD_TEST_CONFIG"
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "downstream": // a refunds server on stdio
		r := &refunds{dir: os.Getenv(dirEnv), exit: func() { os.Exit(3) }}
		if err := r.server().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "downstream:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "guard": // a guard serving streamable HTTP, as intentd mcp-guard does
		os.Exit(runGuardChild())
	}
	// No rate limit: the benchmark calls as fast as intentd answers.
	intentdtest.Main(m, &intentdAddr, func(c *daemon.Config) { c.RatePerPrincipal, c.RatePerTenant = 0, 0 })
}

// refunds is the downstream: create_refund and send_payout refund on every
// call (a blind retry is a second refund), find_refund finds a refund by
// its reference, echo passes through unguarded. Files in dir steer it: a
// file "slow" holding a duration makes the next effect take that long; a
// file "crash-next" makes the next call exit the process right after its
// effect (exit set) or never answer (exit nil); a file "vanish-next" makes
// the next call never answer and have no effect.
type refunds struct {
	dir  string
	exit func()
	mu   sync.Mutex
	n    int // refunds made, once counted from the file
}

type refundArgs struct {
	OrderID   string  `json:"order_id"`
	Amount    float64 `json:"amount"`
	Currency  string  `json:"currency"`
	Reference string  `json:"reference,omitempty"`
}

type refundOut struct {
	RefundID  string `json:"refund_id"`
	OrderID   string `json:"order_id"`
	Reference string `json:"reference"`
}

type findArgs struct {
	Reference string `json:"reference"`
}

type findOut struct {
	Found    bool   `json:"found"`
	RefundID string `json:"refund_id,omitempty"`
}

func (r *refunds) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "refunds", Version: "1"}, nil)
	effect := func(ctx context.Context, req *mcp.CallToolRequest, a refundArgs) (*mcp.CallToolResult, refundOut, error) {
		if a.Reference == "" {
			a.Reference, _ = req.Params.Meta["reference"].(string)
		}
		if a.Currency == "DECLINE" {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "currency not accepted"}}}, refundOut{}, nil
		}
		if os.Remove(filepath.Join(r.dir, "vanish-next")) == nil {
			<-ctx.Done() // lost before it took effect: no refund, no answer
			return nil, refundOut{}, ctx.Err()
		}
		out := r.record(req.Params.Name, a)
		if b, err := os.ReadFile(filepath.Join(r.dir, "slow")); err == nil {
			d, _ := time.ParseDuration(strings.TrimSpace(string(b)))
			time.Sleep(d)
		}
		if os.Remove(filepath.Join(r.dir, "crash-next")) == nil {
			if r.exit != nil {
				r.exit()
			}
			<-ctx.Done() // never answers
			return nil, refundOut{}, ctx.Err()
		}
		if _, err := os.Stat(filepath.Join(r.dir, "big")); err == nil { // an answer past what a record keeps
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("receipt ", 40000)}}}, out, nil
		}
		return nil, out, nil
	}
	mcp.AddTool(s, &mcp.Tool{Name: "create_refund", Description: "Refund an order."}, effect)
	mcp.AddTool(s, &mcp.Tool{Name: "send_payout", Description: "Pay out to an order's seller."}, effect)
	mcp.AddTool(s, &mcp.Tool{Name: "issue_credit", Description: "Credit a customer's account."}, effect)
	mcp.AddTool(s, &mcp.Tool{Name: "find_refund", Description: "Find a refund by reference."}, func(_ context.Context, _ *mcp.CallToolRequest, a findArgs) (*mcp.CallToolResult, findOut, error) {
		for _, e := range r.effects() {
			if e.Reference == a.Reference {
				return nil, findOut{Found: true, RefundID: e.RefundID}, nil
			}
		}
		return nil, findOut{Found: false}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Say it back."}, func(_ context.Context, _ *mcp.CallToolRequest, a struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	})
	s.AddPrompt(&mcp.Prompt{Name: "refund-policy", Description: "The refund policy."}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "Refunds within 30 days."}}}}, nil
	})
	return s
}

// record appends one effect to the file of effects.
func (r *refunds) record(tool string, a refundArgs) refundOut {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		r.n = len(r.effects())
	}
	r.n++
	out := refundOut{RefundID: fmt.Sprintf("RF-%d", r.n), OrderID: a.OrderID, Reference: a.Reference}
	f, err := os.OpenFile(filepath.Join(r.dir, "effects.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	b, _ := json.Marshal(out)
	if _, err := f.Write(append(b, '\n')); err != nil {
		panic(err)
	}
	return out
}

func (r *refunds) effects() []refundOut {
	f, err := os.Open(filepath.Join(r.dir, "effects.jsonl"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []refundOut
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e refundOut
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// effectsFor counts the refunds of an order.
func (r *refunds) effectsFor(order string) int {
	n := 0
	for _, e := range r.effects() {
		if e.OrderID == order {
			n++
		}
	}
	return n
}

// serveHTTP serves the refunds server over streamable HTTP; stop ends it.
func (r *refunds) serveHTTP(t testing.TB) (url string, stop func()) {
	t.Helper()
	s := r.server()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	stop = func() { _ = srv.Close() }
	t.Cleanup(stop)
	return "http://" + l.Addr().String() + "/mcp", stop
}

// serveRestartable is serveHTTP whose restart forgets every session, as a
// downstream process started again on the same port would.
func (r *refunds) serveRestartable(t testing.TB) (url string, restart func()) {
	t.Helper()
	var mu sync.Mutex
	fresh := func() http.Handler {
		s := r.server()
		return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	}
	h := fresh()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		cur := h
		mu.Unlock()
		cur.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() {
		mu.Lock()
		h = fresh()
		mu.Unlock()
	}
}

// toolsConfig is the guarded tools of the tests' config file: refunds by
// order and the host's customer, with a lookup; payouts without one.
const toolsConfig = `{
  "create_refund": {
    "action": "refund.create",
    "identity": {"arguments": ["order_id"], "meta": ["customer"], "values": {"shop": "acme"}},
    "terms": ["order_id", "amount", "currency"],
    "operation-key": {"argument": "reference"},
    "timeout": "2s",
    "lookup": {"tool": "find_refund", "argument": "reference"}
  },
  "issue_credit": {
    "action": "credit.issue",
    "identity": {"arguments": ["order_id"], "meta": ["customer"]},
    "operation-key": {"argument": "reference"},
    "approval": "host",
    "timeout": "2s",
    "lookup": {"tool": "find_refund", "argument": "reference"}
  },
  "send_payout": {
    "action": "payout.send",
    "identity": {"arguments": ["order_id"], "values": {"shop": "acme"}},
    "operation-key": {"meta": "reference"},
    "timeout": "2s",
    "on-tool-error": "fail"
  }
}`

func parseTools(t testing.TB) map[string]*mcpguard.Tool {
	t.Helper()
	tools, err := mcpguard.ParseTools(json.RawMessage(toolsConfig))
	if err != nil {
		t.Fatal(err)
	}
	return tools
}

func dialIntentd(t testing.TB) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(intentdAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// newGuard starts a guard in front of down.
func newGuard(t testing.TB, name string, down *mcpguard.Downstream, ttl time.Duration) *mcpguard.Guard {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := mcpguard.New(ctx, mcpguard.Config{Name: name, Downstream: down, Tools: parseTools(t), SessionTTL: ttl, Logger: slog.New(slog.DiscardHandler)}, dialIntentd(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

// connect is an MCP client session with g, in memory.
func connect(t testing.TB, g *mcpguard.Guard) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := g.Server().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close(); _ = ss.Wait() })
	return cs
}

// connectHTTP is an MCP client session with the guard at url.
func connectHTTP(t testing.TB, url string) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// refund calls create_refund as the host of customer would.
func refund(t testing.TB, cs *mcp.ClientSession, customer, order string, amount float64) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_refund", Meta: mcp.Meta{"customer": customer},
		Arguments: map[string]any{"order_id": order, "amount": amount, "currency": "EUR"}})
	if err != nil {
		t.Fatalf("create_refund %s: %v", order, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func outcome(res *mcp.CallToolResult) string {
	s, _ := res.Meta[mcpguard.MetaOutcome].(string)
	return s
}

// stdioDownstream is the refunds server as a child process on stdio: this
// test binary in its downstream role.
func stdioDownstream(t testing.TB, dir string) *mcpguard.Downstream {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &mcpguard.Downstream{Command: []string{exe}, Env: map[string]string{roleEnv: "downstream", dirEnv: dir}}
}

// runGuardChild runs the guard of MCPGUARD_TEST_CONFIG on streamable HTTP
// and prints its address, until it is killed.
func runGuardChild() int {
	var c struct {
		Intentd, Name string
		Downstream    json.RawMessage
		TTL           time.Duration
	}
	if err := json.Unmarshal([]byte(os.Getenv(confEnv)), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	down, err := mcpguard.ParseDownstream(c.Downstream)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	tools, err := mcpguard.ParseTools(json.RawMessage(toolsConfig))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	conn, err := grpc.NewClient(c.Intentd, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g, err := mcpguard.New(context.Background(), mcpguard.Config{Name: c.Name, Downstream: down, Tools: tools, SessionTTL: c.TTL}, conn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("http://" + l.Addr().String() + "/mcp")
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server() }, nil)
	_ = http.Serve(l, h)
	return 1
}

// guardChild starts a guard process in front of the downstream at url.
func guardChild(t *testing.T, name, downURL string, ttl time.Duration) (url string, cmd *exec.Cmd) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	conf, _ := json.Marshal(map[string]any{"Intentd": intentdAddr, "Name": name, "Downstream": map[string]any{"url": downURL}, "TTL": ttl})
	cmd = exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"=guard", confEnv+"="+string(conf))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the guard process did not start: %v", err)
	}
	return strings.TrimSpace(line), cmd
}
