package mcpguard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/mcpguard"
)

// BenchmarkGuardedCall measures, in one run at one caller (C = 1), what the
// guard adds to a tool call, as medians of interleaved calls: downstream-ms
// is a host calling the refunds server directly over streamable HTTP;
// guarded-ms the same call through the guard (host → guard → downstream,
// both hops streamable HTTP), each a new intent (register and acquire,
// forward, complete); cycle-ms one intentd cycle alone (client.Session.Run
// registering and completing an intent with an Execute that does nothing).
// The target (issue 29): added-ms = guarded − downstream ≤ cycle-ms
// (added/cycle ≤ 1). guard-cycle-ms is the cycle with what the guard sends
// for a refund (action, identity, labels; the CallToolResult recorded). Figures: docs/PERFORMANCE.md, "The MCP guard".
func BenchmarkGuardedCall(b *testing.B) {
	r := &refunds{dir: b.TempDir()}
	downURL, _ := r.serveHTTP(b)
	g := newGuard(b, fmt.Sprintf("bench-%d", time.Now().UnixNano()), &mcpguard.Downstream{URL: downURL}, 0)
	gs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.Server() }, nil))
	b.Cleanup(gs.Close)
	ctx := context.Background()
	host := func(url string) *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	direct, guarded := host(downURL), host(gs.URL)
	run := fmt.Sprint(time.Now().UnixNano())
	api := client.New(dialIntentd(b))
	sess, err := api.OpenSession(ctx, "bench", 15*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer sess.Close(ctx)
	params, _ := structpb.NewStruct(map[string]any{"amount": 10})
	refund := func(cs *mcp.ClientSession, order string) {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_refund", Meta: mcp.Meta{"customer": "c-bench"},
			Arguments: map[string]any{"order_id": order, "amount": 10, "currency": "EUR", "reference": "r"}})
		if err != nil || res.IsError {
			b.Fatalf("%s: %v %v", order, err, res)
		}
	}
	payload := []byte(`{"content":[{"type":"text","text":"{\"order_id\":\"guarded-1796472073485089952-542\",\"reference\":\"cbf2f8ba04d131475a1f3e53b271013c750035d9c4e3a159b80d4c34498c3901:create_refund\",\"refund_id\":\"RF-1\"}"}],"structuredContent":{"order_id":"guarded-1796472073485089952-542","reference":"cbf2f8ba04d131475a1f3e53b271013c750035d9c4e3a159b80d4c34498c3901:create_refund","refund_id":"RF-1"}}`)
	refs := map[string]string{"refund_id": "RF-1", "order_id": "guarded-1796472073485089952-542", "reference": "cbf2f8ba04d131475a1f3e53b271013c750035d9c4e3a159b80d4c34498c3901:create_refund"}
	// cycle is one intentd cycle; asGuard registers and records what the
	// guard does for a refund (action, identity, labels, the answer).
	cycle := func(order string, asGuard bool) {
		key := order
		reg, res := &intentv1.RegisterRequest{Params: params}, &intentv1.Result{}
		if asGuard {
			id := map[string]any{"order_id": order, "customer": "c-bench", "shop": "acme"}
			key, _, _ = intent.DeriveKey("refund.create", id)
			identity, _ := structpb.NewStruct(id)
			reg = &intentv1.RegisterRequest{Params: params, Action: "refund.create", Identity: identity, Labels: map[string]string{mcpguard.LabelGuard: "bench", mcpguard.LabelTool: "create_refund"}}
			res = &intentv1.Result{Payload: payload, ExternalRefs: refs}
		}
		out, err := sess.Run(ctx, client.Task{Key: key, Register: reg,
			Execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) { return res, nil }})
		if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
			b.Fatalf("cycle %s: %v %v", key, err, out)
		}
	}
	// Interleaved, so that the three see the same machine: a load that
	// comes and goes moves all three, not one.
	var down, guard, cyc, same []time.Duration
	timed := func(into *[]time.Duration, f func()) {
		start := time.Now()
		f()
		*into = append(*into, time.Since(start))
	}
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("%s-%d", run, i)
		timed(&down, func() { refund(direct, "direct-"+id) })
		timed(&guard, func() { refund(guarded, "guarded-"+id) })
		timed(&cyc, func() { cycle("cycle-"+id, false) })
		timed(&same, func() { cycle("same-"+id, true) })
	}
	d, g2, c := median(down), median(guard), median(cyc)
	b.ReportMetric(ms(d), "downstream-ms")
	b.ReportMetric(ms(g2), "guarded-ms")
	b.ReportMetric(ms(c), "cycle-ms")
	b.ReportMetric(ms(g2-d), "added-ms")
	b.ReportMetric(float64(g2-d)/float64(c), "added/cycle")
	b.ReportMetric(ms(median(same)), "guard-cycle-ms")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
