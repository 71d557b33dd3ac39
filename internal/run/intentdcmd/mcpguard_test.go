package intentdcmd

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/intentd/intentd/internal/core/freeport"
)

// refundsServer serves a downstream MCP server over streamable HTTP with
// the tools create_refund, find_refund and echo, and returns its URL.
func refundsServer(t *testing.T) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "refunds", Version: "1"}, nil)
	type args struct {
		OrderID   string `json:"order_id,omitempty"`
		Reference string `json:"reference,omitempty"`
		Text      string `json:"text,omitempty"`
	}
	h := func(_ context.Context, _ *mcp.CallToolRequest, a args) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	}
	for _, name := range []string{"create_refund", "find_refund", "echo"} {
		mcp.AddTool(s, &mcp.Tool{Name: name}, h)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String() + "/mcp"
}

const guardTools = `
tools:
  create_refund:
    action: refund.create
    identity: {arguments: [order_id], meta: [customer]}
    operation-key: {argument: reference}
    lookup: {tool: find_refund, argument: reference}
`

// A bad config stops `intentd mcp-guard` at start with exit status 2 and
// one line naming the key, flag or variable — a guarded tool the
// downstream lacks included — then the usage hint.
func TestMCPGuardBadConfigNamesTheKey(t *testing.T) {
	down := "downstream: {url: " + refundsServer(t) + "}\n"
	for _, tc := range []struct {
		name      string
		env       []string
		yaml      string // "" : no --config
		args      []string
		wantFirst string
	}{
		{"no config", nil, "", nil, "intentd: --config is required: its downstream key names the MCP server to guard"},
		{"no downstream", nil, guardTools, nil, `key "downstream" is missing`},
		{"no tools", nil, down, nil, `key "tools" is missing`},
		{"an unknown top-level key", nil, "lisen: 127.0.0.1:0\n" + down + guardTools, nil, `key "lisen": unknown key; the keys are the guard's flag names, e.g. listen, downstream and tools`},
		{"an unknown tool key", nil, down + strings.Replace(guardTools, "action:", "acton:", 1), nil, "tools.create_refund.acton: unknown key"},
		{"no action", nil, down + strings.Replace(guardTools, "action: refund.create", "terms: [order_id]", 1), nil, "tools.create_refund.action: required"},
		{"an identity the model alone gives", nil, down + strings.Replace(guardTools, ", meta: [customer]", "", 1), nil, "tools.create_refund.identity: needs meta"},
		{"no operation key", nil, down + strings.Replace(guardTools, "operation-key: {argument: reference}", "timeout: 5s", 1), nil, "tools.create_refund.operation-key: required"},
		{"command and url", nil, "downstream: {url: http://127.0.0.1:9/mcp, command: [x]}\n" + guardTools, nil, "downstream: gives both command and url"},
		{"a tool the downstream lacks", nil, down + strings.Replace(guardTools, "create_refund:", "create_payout:", 1), nil, "tools.create_payout: the downstream " + "http://"},
		{"a lookup tool the downstream lacks", nil, down + strings.Replace(guardTools, "tool: find_refund", "tool: find_it", 1), nil, "tools.create_refund.lookup.tool: the downstream"},
		{"a bad environment variable", []string{"INTENTD_MCP_GUARD_SESSION_TTL=soon"}, down + guardTools, nil, `INTENTD_MCP_GUARD_SESSION_TTL (--session-ttl) "soon"`},
		{"plaintext off loopback", nil, down + guardTools, []string{"--listen", "10.0.0.1:7690"}, "--listen 10.0.0.1:7690 is not a loopback address"},
		{"a token in plaintext", nil, down + guardTools, []string{"--intentd", "10.0.0.2:7650", "--token-file", "/dev/null"}, "--token-file: the token would cross the network to 10.0.0.2:7650 in plaintext"},
		{"an empty header name", nil, down + strings.Replace(guardTools, "meta: [customer]", "headers: [\"\"]", 1), nil, "tools.create_refund.identity.headers[0]: empty name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"mcp-guard"}, tc.args...)
			if tc.yaml != "" {
				p := filepath.Join(t.TempDir(), "guard.yaml")
				if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", p)
			}
			stderr, code := runIntentd(t, tc.env, args...)
			if code != exitUsage {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitUsage, stderr)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			first := lines[0]
			if !strings.Contains(first, tc.wantFirst) {
				t.Errorf("first line %q, want it to say %q", first, tc.wantFirst)
			}
			if last := lines[len(lines)-1]; last != "Run 'intentd mcp-guard --help' for usage." {
				t.Errorf("stderr %q, want the error and the guard's usage hint", lines)
			}
		})
	}
}

// `intentd mcp-guard` serves MCP on stdio, as a host starts it: its tools
// are the downstream's and its own, and an unguarded call passes through.
func TestMCPGuardServesStdio(t *testing.T) {
	p := filepath.Join(t.TempDir(), "guard.yaml")
	if err := os.WriteFile(p, []byte("downstream: {url: "+refundsServer(t)+"}\n"+guardTools), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.Command(intentdBin, "mcp-guard", "--config", p, "--intentd", "127.0.0.1:9")
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, ","); got != "create_refund,echo,find_refund,intent_status,list_completed" {
		t.Errorf("tools through the guard: %s", got)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
	if err != nil || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "hi" {
		t.Fatalf("echo through the guard: %v %v", err, res)
	}
}

// `intentd mcp-guard --listen` serves MCP at /mcp, /healthz, and /readyz
// (not ready while intentd does not answer); SIGTERM stops it cleanly and
// at once, a host still connected (its standalone stream open) included.
func TestMCPGuardServesHTTP(t *testing.T) {
	p := filepath.Join(t.TempDir(), "guard.yaml")
	if err := os.WriteFile(p, []byte("downstream: {url: "+refundsServer(t)+"}\n"+guardTools), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeport.Addr(t)
	cmd := exec.Command(intentdBin, "mcp-guard", "--config", p, "--listen", addr, "--intentd", "127.0.0.1:9", "--shutdown-timeout", "1m")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz did not answer 200 within 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz with no intentd: %d, want 503", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "over http"}})
	if err != nil || res.Content[0].(*mcp.TextContent).Text != "over http" {
		t.Fatalf("echo over HTTP: %v %v", err, res)
	}
	defer cs.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("mcp-guard did not stop within 15s of SIGTERM, a host connected")
	}
}
