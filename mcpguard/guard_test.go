package mcpguard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/intentdtest"
	"github.com/intentd/intentd/mcpguard"
)

// unique is a fresh order id for one test.
func unique(t testing.TB, what string) string {
	return fmt.Sprintf("%s-%s-%d", what, strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

// TestRepeatIsOneEffect: the same call, sent again under another request
// id, by the same client or another, refunds once; every repeat answers
// the recorded result and says that nothing was done.
func TestRepeatIsOneEffect(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	g := newGuard(t, "repeat", &mcpguard.Downstream{URL: url}, 0)
	a, b := connect(t, g), connect(t, g)
	order := unique(t, "ord")

	first := refund(t, a, "c-1", order, 40)
	if first.IsError || outcome(first) != "executed" {
		t.Fatalf("first call: %s %q", outcome(first), text(first))
	}
	key, _ := first.Meta[mcpguard.MetaKey].(string)
	for i, cs := range []*mcp.ClientSession{a, b, a} {
		again := refund(t, cs, "c-1", order, 40)
		if again.IsError || outcome(again) != "replayed" || again.Meta[mcpguard.MetaKey] != key {
			t.Fatalf("repeat %d: %s %v %q", i, outcome(again), again.Meta, text(again))
		}
		if !strings.Contains(text(again), "already_completed") || !strings.Contains(text(again), "action_taken: none") || !strings.Contains(text(again), "RF-") {
			t.Errorf("repeat %d says %q; want the recorded refund and the statement", i, text(again))
		}
	}
	if n := r.effectsFor(order); n != 1 {
		t.Fatalf("%d refunds of %s, want 1", n, order)
	}
	// The reference the downstream got is the operation key, not the model's.
	if e := r.effects(); e[len(e)-1].Reference != key+":create_refund" {
		t.Errorf("the downstream got reference %q, want %s:create_refund", e[len(e)-1].Reference, key)
	}
}

// TestIdentityAndTerms: another customer (the host's _meta) is another
// intent; other terms for the same identity are refused with nothing sent;
// a missing _meta is refused with nothing sent.
func TestIdentityAndTerms(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	g := newGuard(t, "terms", &mcpguard.Downstream{URL: url}, 0)
	cs := connect(t, g)
	order := unique(t, "ord")

	if res := refund(t, cs, "c-1", order, 40); outcome(res) != "executed" {
		t.Fatalf("first: %s %q", outcome(res), text(res))
	}
	tests := []struct {
		name     string
		meta     mcp.Meta
		amount   float64
		outcome  string
		says     string
		refunded int
	}{
		{"other terms", mcp.Meta{"customer": "c-1"}, 400, "refused", "FINGERPRINT_MISMATCH", 1},
		{"no customer from the host", nil, 40, "refused", `_meta "customer"`, 1},
		{"another customer", mcp.Meta{"customer": "c-2"}, 40, "executed", "RF-", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_refund", Meta: tt.meta,
				Arguments: map[string]any{"order_id": order, "amount": tt.amount, "currency": "EUR"}})
			if err != nil {
				t.Fatal(err)
			}
			if outcome(res) != tt.outcome || !strings.Contains(text(res), tt.says) {
				t.Errorf("%s %q; want %s saying %q", outcome(res), text(res), tt.outcome, tt.says)
			}
			if n := r.effectsFor(order); n != tt.refunded {
				t.Errorf("%d refunds, want %d", n, tt.refunded)
			}
		})
	}
}

// TestPassThrough: unguarded tools and prompts reach the downstream as they
// are; the guard's own tools are listed read-only; the operation key's
// argument is the guard's and hidden from the model.
func TestPassThrough(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, "pass", &mcpguard.Downstream{URL: url}, 0))
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}})
	if err != nil {
		t.Fatal(err)
	}
	if text(res) != "hello" || res.Meta[mcpguard.MetaOutcome] != nil {
		t.Fatalf("echo: %v %q %v", err, text(res), res.Meta)
	}
	tools := map[string]*mcp.Tool{}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools[tool.Name] = tool
	}
	for _, name := range []string{"create_refund", "send_payout", "find_refund", "echo", mcpguard.StatusTool, mcpguard.CompletedTool} {
		if tools[name] == nil {
			t.Errorf("tools/list lacks %s", name)
		}
	}
	for _, name := range []string{mcpguard.StatusTool, mcpguard.CompletedTool} {
		if a := tools[name].Annotations; a == nil || !a.ReadOnlyHint {
			t.Errorf("%s is not annotated read-only", name)
		}
	}
	if s := fmt.Sprint(tools["create_refund"].InputSchema); strings.Contains(s, "reference") || !strings.Contains(s, "order_id") {
		t.Errorf("create_refund's schema through the guard: %s; want order_id and no reference", s)
	}
	p, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "refund-policy"})
	if err != nil || len(p.Messages) != 1 {
		t.Fatalf("prompts/get through the guard: %v %v", err, p)
	}
}

// TestLostAnswerIsLookedUp: the downstream is killed right after the
// refund (a stdio server, started again by the next call): the intent is
// UNKNOWN, nothing is sent again, and the next call settles it with the
// lookup tool and answers the refund it found.
func TestLostAnswerIsLookedUp(t *testing.T) {
	dir := t.TempDir()
	r := &refunds{dir: dir}
	g := newGuard(t, "lost", stdioDownstream(t, dir), 0)
	cs := connect(t, g)
	order := unique(t, "ord")
	if err := os.WriteFile(filepath.Join(dir, "crash-next"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	first := refund(t, cs, "c-1", order, 40)
	if !first.IsError || !strings.Contains(text(first), "do not retry") {
		t.Fatalf("the call whose answer was lost: %s %q", outcome(first), text(first))
	}
	st := status(t, cs, first.Meta[mcpguard.MetaKey].(string))
	if st["status"] != "unknown" {
		t.Fatalf("intent_status after the lost answer: %v", st)
	}
	second := refund(t, cs, "c-1", order, 40)
	if second.IsError || outcome(second) != "looked_up" || !strings.Contains(text(second), "RF-") {
		t.Fatalf("the next call: %s %q", outcome(second), text(second))
	}
	third := refund(t, cs, "c-1", order, 40)
	if outcome(third) != "replayed" {
		t.Errorf("then: %s %q", outcome(third), text(third))
	}
	if n := r.effectsFor(order); n != 1 {
		t.Fatalf("%d refunds, want 1", n)
	}
}

// TestLostAnswerWithoutLookupGoesToReview: a payout whose answer times
// out (no lookup configured) is never sent again: the intent waits for a
// person, and every call says so.
func TestLostAnswerWithoutLookupGoesToReview(t *testing.T) {
	dir := t.TempDir()
	r := &refunds{dir: dir}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, "review", &mcpguard.Downstream{URL: url}, 0))
	order := unique(t, "ord")
	if err := os.WriteFile(filepath.Join(dir, "crash-next"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "send_payout", Arguments: map[string]any{"order_id": order, "amount": 12.5, "currency": "EUR"}})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError || outcome(res) != "under_review" || !strings.Contains(text(res), "do not retry") {
			t.Fatalf("call %d: %s %q", i, outcome(res), text(res))
		}
	}
	if n := r.effectsFor(order); n != 1 {
		t.Fatalf("%d payouts, want 1", n)
	}
}

// TestConcurrentClientsOneEffect: two hosts send the same refund at once
// through one guard, and through two guards: one refund; the one that did
// not run it answers the recorded refund or that it is in progress.
func TestConcurrentClientsOneEffect(t *testing.T) {
	dir := t.TempDir()
	r := &refunds{dir: dir}
	url, _ := r.serveHTTP(t)
	g1 := newGuard(t, "race", &mcpguard.Downstream{URL: url}, 0)
	g2 := newGuard(t, "race", &mcpguard.Downstream{URL: url}, 0)
	if err := os.WriteFile(filepath.Join(dir, "slow"), []byte("300ms"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		a, b *mcpguard.Guard
	}{{"one guard", g1, g1}, {"two guards", g1, g2}} {
		t.Run(tt.name, func(t *testing.T) {
			order := unique(t, "ord")
			clients := []*mcp.ClientSession{connect(t, tt.a), connect(t, tt.b), connect(t, tt.a), connect(t, tt.b)}
			answers := make([]*mcp.CallToolResult, len(clients))
			var wg sync.WaitGroup
			for i, cs := range clients {
				wg.Go(func() { answers[i] = refund(t, cs, "c-9", order, 19.99) })
			}
			wg.Wait()
			executed := 0
			for i, a := range answers {
				switch outcome(a) {
				case "executed":
					executed++
				case "replayed", "in_progress":
				default:
					t.Errorf("client %d: %s %q", i, outcome(a), text(a))
				}
			}
			if executed != 1 || r.effectsFor(order) != 1 {
				t.Fatalf("%d calls executed, %d refunds; want 1 and 1", executed, r.effectsFor(order))
			}
		})
	}
}

// TestGuardRestartedMidCall: the guard process is killed while the
// downstream refunds; a new guard process answers the next call: it waits
// out the dead guard's lease, looks the refund up, and never refunds again.
func TestGuardRestartedMidCall(t *testing.T) {
	dir := t.TempDir()
	r := &refunds{dir: dir}
	downURL, _ := r.serveHTTP(t)
	if err := os.WriteFile(filepath.Join(dir, "slow"), []byte("1500ms"), 0o644); err != nil {
		t.Fatal(err)
	}
	order := unique(t, "ord")
	url1, cmd1 := guardChild(t, "restart", downURL, 2*time.Second)
	cs1 := connectHTTP(t, url1)
	go func() { // the host's call, cut when the guard dies
		_, _ = cs1.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_refund", Meta: mcp.Meta{"customer": "c-5"},
			Arguments: map[string]any{"order_id": order, "amount": 5, "currency": "EUR"}})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for r.effectsFor(order) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(filepath.Join(dir, "slow"))
	url2, _ := guardChild(t, "restart", downURL, 2*time.Second)
	cs2 := connectHTTP(t, url2)
	var res *mcp.CallToolResult
	for time.Now().Before(deadline) { // in progress until the dead guard's lease lapses
		if res = refund(t, cs2, "c-5", order, 5); outcome(res) != "in_progress" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if outcome(res) != "looked_up" || !strings.Contains(text(res), "RF-") {
		t.Fatalf("the new guard answered %s %q", outcome(res), text(res))
	}
	if n := r.effectsFor(order); n != 1 {
		t.Fatalf("%d refunds, want 1", n)
	}
}

// TestToolErrors: a downstream error answer releases a refund (nothing
// happened: the model may call again), and fails a payout for good
// (on-tool-error: fail).
func TestToolErrors(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, "errors", &mcpguard.Downstream{URL: url}, 0))
	ctx := context.Background()
	order := unique(t, "ord")
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_refund", Meta: mcp.Meta{"customer": "c-1"}, Arguments: map[string]any{"order_id": order, "amount": 1, "currency": "DECLINE"}})
	if err != nil || outcome(res) != "not_done" || !strings.Contains(text(res), "currency not accepted") || !strings.Contains(text(res), "may call it again") {
		t.Fatalf("refund declined: %v %s %q", err, outcome(res), text(res))
	}
	for i := range 2 {
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_payout", Arguments: map[string]any{"order_id": order, "amount": 1, "currency": "DECLINE"}})
		if err != nil || outcome(res) != "failed" || !strings.Contains(text(res), "do not retry") {
			t.Fatalf("payout declined (%d): %v %s %q", i, err, outcome(res), text(res))
		}
	}
}

// TestStatusTools: intent_status and list_completed answer what the guard
// carried out, in statements.
func TestStatusTools(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	name := fmt.Sprintf("status-%d", time.Now().UnixNano())
	cs := connect(t, newGuard(t, name, &mcpguard.Downstream{URL: url}, 0))
	order := unique(t, "ord")
	res := refund(t, cs, "c-1", order, 40)
	key := res.Meta[mcpguard.MetaKey].(string)
	if st := status(t, cs, key); st["status"] != "completed" || !strings.Contains(st["text"].(string), "do not request it again") {
		t.Errorf("intent_status: %v", st)
	}
	got, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpguard.StatusTool, Meta: mcp.Meta{"customer": "c-1"},
		Arguments: map[string]any{"tool": "create_refund", "arguments": map[string]any{"order_id": order}}})
	if err != nil || got.StructuredContent.(map[string]any)["key"] != key {
		t.Errorf("intent_status by tool and arguments: %v %v", err, got.StructuredContent)
	}
	if st := status(t, cs, "no-such-key"); st["status"] != "not_found" {
		t.Errorf("intent_status of an unknown key: %v", st)
	}
	// Asked about nothing, or about a tool the guard does not guard, they
	// name the guarded tools.
	none, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpguard.StatusTool, Arguments: map[string]any{}})
	if st, _ := none.StructuredContent.(map[string]any); err != nil || st["status"] != "refused" || !strings.Contains(st["text"].(string), "neither key nor tool was given; give key (a guarded answer's intentd/key), or tool (one of create_refund, issue_credit, send_payout)") {
		t.Errorf("intent_status of nothing: %v %v", err, none.StructuredContent)
	}
	echo, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpguard.CompletedTool, Arguments: map[string]any{"tool": "echo"}})
	if err != nil || !echo.IsError || !strings.Contains(text(echo), `"echo" is no guarded tool (they are: create_refund, issue_credit, send_payout)`) {
		t.Errorf("list_completed of an unguarded tool: %v %q", err, text(echo))
	}
	list, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpguard.CompletedTool, Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	done := list.StructuredContent.(map[string]any)["completed"].([]any)
	if len(done) != 1 || done[0].(map[string]any)["key"] != key || done[0].(map[string]any)["external_refs"].(map[string]any)["refund_id"] == nil {
		t.Errorf("list_completed: %v", list.StructuredContent)
	}
}

// TestListCompletedPages: list_completed answers the oldest first, a limit
// at a time, and its next_cursor goes on where the answer stopped, to the
// newest, none left out or repeated.
func TestListCompletedPages(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, fmt.Sprintf("pages-%d", time.Now().UnixNano()), &mcpguard.Downstream{URL: url}, 0))
	var want []any
	for i := range 5 {
		res := refund(t, cs, "c-1", unique(t, fmt.Sprint("ord", i)), 2)
		want = append(want, res.Meta[mcpguard.MetaKey])
	}
	list := func(args map[string]any) (keys []any, next string, res *mcp.CallToolResult) {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpguard.CompletedTool, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			return nil, "", res
		}
		out := res.StructuredContent.(map[string]any)
		for _, c := range out["completed"].([]any) {
			keys = append(keys, c.(map[string]any)["key"])
		}
		next, _ = out["next_cursor"].(string)
		return keys, next, res
	}
	var got []any
	args := map[string]any{"limit": 2}
	for page := 0; ; page++ {
		keys, next, _ := list(args)
		if len(keys) > 2 || page > 3 {
			t.Fatalf("page %d: %v, next %q", page, keys, next)
		}
		got = append(got, keys...)
		if next == "" {
			break
		}
		args = map[string]any{"limit": 2, "cursor": next}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("paged: %v; want, oldest first: %v", got, want)
	}
	if _, _, res := list(map[string]any{"cursor": "not-a-cursor"}); !res.IsError || !strings.Contains(text(res), "is not one this tool gave") {
		t.Errorf("a made-up cursor: %q", text(res))
	}
}

// status calls intent_status with key.
func status(t testing.TB, cs *mcp.ClientSession, key string) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpguard.StatusTool, Arguments: map[string]any{"key": key}})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := res.StructuredContent.(map[string]any)
	return m
}

// TestHostApproval: with approval: host, a call whose terms the host has
// not registered is refused with nothing sent; once the host's approval
// step registers them (Register with the tool's action and identity), the
// call runs once, and other terms are refused.
func TestHostApproval(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, "host", &mcpguard.Downstream{URL: url}, 0))
	order := unique(t, "ord")
	credit := func(amount float64) *mcp.CallToolResult {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "issue_credit", Meta: mcp.Meta{"customer": "c-3"},
			Arguments: map[string]any{"order_id": order, "amount": amount, "currency": "EUR"}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := credit(25); outcome(res) != "refused" || !strings.Contains(text(res), "NOT_APPROVED") {
		t.Fatalf("before the host approved: %s %q", outcome(res), text(res))
	}
	// The host's approval step: the terms the user approved.
	identity, _ := structpb.NewStruct(map[string]any{"order_id": order, "customer": "c-3"})
	params, _ := structpb.NewStruct(map[string]any{"order_id": order, "amount": 25, "currency": "EUR"})
	api := client.New(dialIntentd(t))
	if _, err := api.Register(context.Background(), &intentv1.RegisterRequest{Action: "credit.issue", Identity: identity, Params: params}); err != nil {
		t.Fatal(err)
	}
	if res := credit(250); outcome(res) != "refused" || !strings.Contains(text(res), "FINGERPRINT_MISMATCH") {
		t.Fatalf("other terms than approved: %s %q", outcome(res), text(res))
	}
	if res := credit(25); outcome(res) != "executed" {
		t.Fatalf("the approved terms: %s %q", outcome(res), text(res))
	}
	res := credit(25)
	if outcome(res) != "replayed" {
		t.Fatalf("again: %s %q", outcome(res), text(res))
	}
	if st := status(t, cs, res.Meta[mcpguard.MetaKey].(string)); st["status"] != "completed" || st["tool"] != "issue_credit" {
		t.Errorf("intent_status of the host's intent: %v", st)
	}
	if n := r.effectsFor(order); n != 1 {
		t.Fatalf("%d credits, want 1", n)
	}
}

// TestLookupAbsentSendsAgain: a call lost before it took effect (the
// downstream never answers, refunds nothing) is UNKNOWN; the next call's
// lookup finds nothing, and the call is sent again, with the same
// operation key: one refund in all.
func TestLookupAbsentSendsAgain(t *testing.T) {
	dir := t.TempDir()
	r := &refunds{dir: dir}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, "absent", &mcpguard.Downstream{URL: url}, 0))
	order := unique(t, "ord")
	if err := os.WriteFile(filepath.Join(dir, "vanish-next"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := refund(t, cs, "c-4", order, 7); outcome(res) != "unknown" {
		t.Fatalf("the lost call: %s %q", outcome(res), text(res))
	}
	res := refund(t, cs, "c-4", order, 7)
	if outcome(res) != "executed" || r.effectsFor(order) != 1 {
		t.Fatalf("after the lookup found nothing: %s %q, %d refunds", outcome(res), text(res), r.effectsFor(order))
	}
	if e := r.effects(); e[len(e)-1].Reference != res.Meta[mcpguard.MetaKey].(string)+":create_refund" {
		t.Errorf("sent again under reference %q", e[len(e)-1].Reference)
	}
}

// TestDownstreamToolsChange: a tool the downstream adds later is offered
// through the guard (tools/list_changed passes through).
func TestDownstreamToolsChange(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	s := r.server()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cs := connect(t, newGuard(t, "changes", &mcpguard.Downstream{URL: srv.URL}, 0))
	s.AddTool(&mcp.Tool{Name: "late_tool", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late"}}}, nil
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "late_tool"})
		if err == nil && text(res) == "late" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("late_tool through the guard: %v %v", err, res)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDownstreamRestarted: a downstream that restarted between calls (its
// sessions forgotten: 404 for the guard's) is reconnected to, and the call
// it refused unread is sent on the new session: executed, not unknown.
func TestDownstreamRestarted(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, restart := r.serveRestartable(t)
	cs := connect(t, newGuard(t, "restarted", &mcpguard.Downstream{URL: url}, 0))
	first, second := unique(t, "a"), unique(t, "b")
	if res := refund(t, cs, "c-6", first, 3); outcome(res) != "executed" {
		t.Fatalf("before the restart: %s %q", outcome(res), text(res))
	}
	restart()
	if res := refund(t, cs, "c-6", second, 3); outcome(res) != "executed" {
		t.Fatalf("after the restart: %s %q", outcome(res), text(res))
	}
	if r.effectsFor(first) != 1 || r.effectsFor(second) != 1 {
		t.Fatalf("refunds: %d and %d, want 1 and 1", r.effectsFor(first), r.effectsFor(second))
	}
}

// headerTransport sets one header on every request: the host's own.
type headerTransport struct{ name, value string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if h.value != "" {
		r.Header.Set(h.name, h.value)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestIdentityFromHeaders: over streamable HTTP the host may identify the
// request by an HTTP header it sets (identity.headers): another header
// value is another intent; no header is refused, nothing sent.
func TestIdentityFromHeaders(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	tools, err := mcpguard.ParseTools(json.RawMessage(`{"create_refund": {"action": "refund.create",
		"identity": {"arguments": ["order_id"], "headers": ["X-Customer"]}, "operation-key": {"argument": "reference"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := mcpguard.New(context.Background(), mcpguard.Config{Name: "headers", Downstream: &mcpguard.Downstream{URL: url}, Tools: tools}, dialIntentd(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server() }, nil))
	t.Cleanup(srv.Close)
	order := unique(t, "ord")
	for _, tc := range []struct{ customer, outcome string }{
		{"c-1", "executed"}, {"c-1", "replayed"}, {"c-2", "executed"}, {"", "refused"},
	} {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1, HTTPClient: &http.Client{Transport: headerTransport{"X-Customer", tc.customer}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_refund", Arguments: map[string]any{"order_id": order, "amount": 1, "currency": "EUR"}})
		_ = cs.Close()
		if err != nil {
			t.Fatal(err)
		}
		if outcome(res) != tc.outcome {
			t.Errorf("customer %q: %s %q, want %s", tc.customer, outcome(res), text(res), tc.outcome)
		}
	}
	if n := r.effectsFor(order); n != 2 {
		t.Fatalf("%d refunds, want 2 (one per customer)", n)
	}
}

// TestHostGivesUp: a host that stops waiting mid-call (its own timeout)
// does not cut the call: it is carried out and recorded, and the host's
// next call gets the recorded answer, not an unknown.
func TestHostGivesUp(t *testing.T) {
	dir := t.TempDir()
	r := &refunds{dir: dir}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, "gives-up", &mcpguard.Downstream{URL: url}, 0))
	order := unique(t, "ord")
	if err := os.WriteFile(filepath.Join(dir, "slow"), []byte("700ms"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_refund", Meta: mcp.Meta{"customer": "c-7"},
		Arguments: map[string]any{"order_id": order, "amount": 9, "currency": "EUR"}}); err == nil {
		t.Fatal("the host's call did not time out")
	}
	_ = os.Remove(filepath.Join(dir, "slow"))
	res := refund(t, cs, "c-7", order, 9) // waits while the first is in progress
	if outcome(res) != "replayed" || r.effectsFor(order) != 1 {
		t.Fatalf("the host's next call: %s %q, %d refunds; want replayed, 1", outcome(res), text(res), r.effectsFor(order))
	}
}

// TestIntentdUnreachable: while intentd does not answer (down, or the
// guard given a wrong address), a guarded call answers unavailable with
// nothing sent, and the read-only tools say so, rather than keep the model
// waiting.
func TestIntentdUnreachable(t *testing.T) {
	mcpguard.SetIntentdWait(t, 300*time.Millisecond)
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	conn, err := grpc.NewClient(freeport.Addr(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := mcpguard.New(ctx, mcpguard.Config{Name: "unreachable", Downstream: &mcpguard.Downstream{URL: url}, Tools: parseTools(t)}, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(context.Background())
	cs := connect(t, g)
	order := unique(t, "ord")
	res := refund(t, cs, "c-1", order, 40) // within refund's minute
	if outcome(res) != "unavailable" || !res.IsError || !strings.Contains(text(res), "nothing was sent") || r.effectsFor(order) != 0 {
		t.Fatalf("a call while intentd does not answer: %s %q, %d refunds; want unavailable, none", outcome(res), text(res), r.effectsFor(order))
	}
	if st := status(t, cs, "some-key"); st["status"] != "unavailable" {
		t.Errorf("intent_status while intentd does not answer: %v", st)
	}
	list, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpguard.CompletedTool, Arguments: map[string]any{}})
	if err != nil || !list.IsError || !strings.Contains(text(list), "intentd could not be asked") {
		t.Errorf("list_completed while intentd does not answer: %v %q", err, text(list))
	}
}

// stallable is a connection to intentd that stops answering on demand, as
// an intentd that stalls or is cut off once a client is connected: while
// stalled, a call is sent nowhere and waits for its deadline.
type stallable struct {
	grpc.ClientConnInterface
	stalled atomic.Bool
}

func (s *stallable) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if s.stalled.Load() {
		<-ctx.Done()
		return grpcstatus.FromContextError(ctx.Err()).Err()
	}
	return s.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
}

func (s *stallable) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if s.stalled.Load() {
		<-ctx.Done()
		return nil, grpcstatus.FromContextError(ctx.Err()).Err()
	}
	return s.ClientConnInterface.NewStream(ctx, desc, method, opts...)
}

// TestIntentdStallsAfterTheSessionOpened: once the guard's session is open,
// intentd stops answering. A call is answered unavailable within its bound
// (the wait for intentd and the tool's wait for a call in progress),
// nothing sent; once intentd answers again, the same call is carried out,
// once.
func TestIntentdStallsAfterTheSessionOpened(t *testing.T) {
	mcpguard.SetIntentdWait(t, 300*time.Millisecond)
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	conn := &stallable{ClientConnInterface: dialIntentd(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := mcpguard.New(ctx, mcpguard.Config{Name: "stalls", Downstream: &mcpguard.Downstream{URL: url}, Tools: parseTools(t), Logger: slog.New(slog.DiscardHandler)}, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close(context.Background())
	cs := connect(t, g)
	if first := refund(t, cs, "c-1", unique(t, "before"), 3); outcome(first) != "executed" {
		t.Fatalf("before the stall: %s %q", outcome(first), text(first))
	}
	conn.stalled.Store(true)
	order := unique(t, "during")
	start := time.Now()
	res := refund(t, cs, "c-1", order, 3)
	took := time.Since(start)
	if outcome(res) != "unavailable" || !strings.Contains(text(res), "nothing was sent") || r.effectsFor(order) != 0 {
		t.Fatalf("a call while intentd stalls: %s %q, %d refunds; want unavailable, none", outcome(res), text(res), r.effectsFor(order))
	}
	// The bound: 300ms for intentd, and refund's wait for a call in
	// progress (the default, 5s); well under the minute a report may take.
	if took > mcpguard.DefaultWaitInProgress+5*time.Second {
		t.Errorf("answered after %v", took)
	}
	conn.stalled.Store(false)
	var again *mcp.CallToolResult
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		// The session may have lapsed during the stall: the guard opens
		// another.
		if again = refund(t, cs, "c-1", order, 3); outcome(again) != "unavailable" {
			break
		}
	}
	if outcome(again) != "executed" || r.effectsFor(order) != 1 {
		t.Fatalf("after the stall: %s %q, %d refunds; want executed, one", outcome(again), text(again), r.effectsFor(order))
	}
}

// TestAnswerPastWhatARecordKeeps: an answer larger than a record keeps is
// answered whole the first time and recorded as done, with its structured
// scalars; a repeat says so, and nothing is refunded again.
func TestAnswerPastWhatARecordKeeps(t *testing.T) {
	dir := t.TempDir()
	r := &refunds{dir: dir}
	url, _ := r.serveHTTP(t)
	cs := connect(t, newGuard(t, "big", &mcpguard.Downstream{URL: url}, 0))
	order := unique(t, "ord")
	if err := os.WriteFile(filepath.Join(dir, "big"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	first := refund(t, cs, "c-8", order, 2)
	if outcome(first) != "executed" || len(text(first)) < 300000 {
		t.Fatalf("first: %s, %d bytes of text", outcome(first), len(text(first)))
	}
	again := refund(t, cs, "c-8", order, 2)
	if outcome(again) != "replayed" || !strings.Contains(text(again), "more than the 262144 a record keeps") || !strings.Contains(text(again), "RF-") {
		t.Fatalf("again: %s %q", outcome(again), text(again))
	}
	if n := r.effectsFor(order); n != 1 {
		t.Fatalf("%d refunds, want 1", n)
	}
}

// TestRateLimitedIsAskedAgain: an intentd that rate-limits the guard's
// principal refuses its Acquire before anything is sent; the guard asks
// again after a short wait, and the call is carried out once.
func TestRateLimitedIsAskedAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an intentd of its own")
	}
	cfg := intentdtest.Config(t.TempDir())
	cfg.RatePerPrincipal, cfg.BurstPerPrincipal = 40, 4 // a token every 25ms
	in := intentdtest.Start(t, cfg, slog.New(slog.DiscardHandler))
	dir := t.TempDir()
	r := &refunds{dir: dir}
	url, _ := r.serveHTTP(t)
	conn := in.Dial(t)
	g, err := mcpguard.New(context.Background(), mcpguard.Config{Name: "limited", Downstream: &mcpguard.Downstream{URL: url}, Tools: parseTools(t)}, conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	cs := connect(t, g)
	order := unique(t, "ord")
	if res := refund(t, cs, "c-9", order+"-warm", 1); outcome(res) != "executed" { // opens the guard's session
		t.Fatalf("warm-up: %s %q", outcome(res), text(res))
	}
	// The refund takes 100ms, so that the bucket has refilled for its
	// Complete; its Acquire meets an empty bucket.
	if err := os.WriteFile(filepath.Join(dir, "slow"), []byte("100ms"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	api := client.New(conn)
	limited := false
	for range 20 {
		_, err := api.Get(context.Background(), &intentv1.GetRequest{Key: "no-such-key"})
		limited = limited || errors.Is(err, client.ErrRateLimited)
	}
	if !limited {
		t.Fatal("20 calls at once were not rate-limited: the test proves nothing")
	}
	if res := refund(t, cs, "c-9", order, 1); outcome(res) != "executed" || r.effectsFor(order) != 1 {
		t.Fatalf("the call after the bucket ran dry: %s %q, %d refunds", outcome(res), text(res), r.effectsFor(order))
	}
}
