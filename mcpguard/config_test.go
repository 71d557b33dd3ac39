package mcpguard_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/mcpguard"
)

// TestParseToolsNamesTheKey: every mistake in a tools key is a
// *ConfigError naming the key, in words that say what to write instead.
func TestParseToolsNamesTheKey(t *testing.T) {
	const good = `"action": "refund.create", "identity": {"arguments": ["order_id"], "meta": ["customer"]}, "operation-key": {"argument": "reference"}`
	for _, tc := range []struct {
		name, tools, key, says string
	}{
		{"not a mapping", `[]`, "tools", "want a mapping"},
		{"no tool", `{}`, "tools", "names no tool"},
		{"an unknown key", `{"t": {` + good + `, "retries": 3}}`, "tools.t.retries", "unknown key"},
		{"no action", `{"t": {"identity": {"meta": ["c"]}, "operation-key": {"meta": "k"}}}`, "tools.t.action", "required"},
		{"a bad action", `{"t": {"action": "refund create", "identity": {"meta": ["c"]}, "operation-key": {"meta": "k"}}}`, "tools.t.action", "letters, digits"},
		{"the model's arguments alone", `{"t": {"action": "a", "identity": {"arguments": ["order_id"]}, "operation-key": {"meta": "k"}}}`, "tools.t.identity", "needs meta"},
		{"a field named twice", `{"t": {"action": "a", "identity": {"arguments": ["c"], "meta": ["c"]}, "operation-key": {"meta": "k"}}}`, "tools.t.identity", "named twice"},
		{"no operation key", `{"t": {"action": "a", "identity": {"meta": ["c"]}}}`, "tools.t.operation-key", "required"},
		{"an operation key in two places", `{"t": {"action": "a", "identity": {"meta": ["c"]}, "operation-key": {"meta": "k", "argument": "r"}}}`, "tools.t.operation-key", "both"},
		{"the operation key among the terms", `{"t": {` + good + `, "terms": ["reference"]}}`, "tools.t.terms", "the guard sets it"},
		{"a bad approval", `{"t": {` + good + `, "approval": "model"}}`, "tools.t.approval", "want call"},
		{"a bad timeout", `{"t": {` + good + `, "timeout": "forever"}}`, "tools.t.timeout", "no duration"},
		{"a number for a timeout", `{"t": {` + good + `, "timeout": 30}}`, "tools.t.timeout", "30 is no duration (such as 10s, 1m30s: a number needs its unit)"},
		{"a long timeout", `{"t": {` + good + `, "timeout": "11m"}}`, "tools.t.timeout", "outside"},
		{"a bad on-tool-error", `{"t": {` + good + `, "on-tool-error": "retry"}}`, "tools.t.on-tool-error", "want release"},
		{"a lookup without tool", `{"t": {` + good + `, "lookup": {"argument": "reference"}}}`, "tools.t.lookup.tool", "required"},
		{"a lookup without argument", `{"t": {` + good + `, "lookup": {"tool": "find"}}}`, "tools.t.lookup.argument", "required"},
		{"the guard's own tool", `{"intent_status": {` + good + `}}`, "tools.intent_status", "the guard's own"},
		{"a number for a list", `{"t": {` + good + `, "terms": 3}}`, "tools.t.terms", "not a list of strings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mcpguard.ParseTools(json.RawMessage(tc.tools))
			var ce *mcpguard.ConfigError
			if !errors.As(err, &ce) || ce.Key != tc.key || !strings.Contains(ce.Reason, tc.says) {
				t.Fatalf("ParseTools: %v; want %s: ...%s...", err, tc.key, tc.says)
			}
		})
	}
	tools, err := mcpguard.ParseTools(json.RawMessage(`{"t": {` + good + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := tools["t"]; got.Operation != "t" || got.Approval != "call" || got.Timeout != mcpguard.DefaultTimeout || got.OnToolError != "release" || got.WaitInProgress != mcpguard.DefaultWaitInProgress {
		t.Errorf("defaults: %+v", got)
	}
}

func TestParseDownstreamNamesTheKey(t *testing.T) {
	for _, tc := range []struct {
		name, raw, key, says string
	}{
		{"nothing", `{}`, "downstream", "names no server"},
		{"both", `{"command": ["x"], "url": "http://h/mcp"}`, "downstream", "both"},
		{"a bad url", `{"url": "ftp://h/mcp"}`, "downstream.url", "http:// or https://"},
		{"credentials in the url", `{"url": "http://u:p@h/mcp"}`, "downstream.url", "no credentials"},
		{"headers with a command", `{"command": ["x"], "headers": {"A": "b"}}`, "downstream.headers", "go with url"},
		{"an unknown key", `{"url": "http://h/mcp", "retry": true}`, "downstream.retry", "unknown key"},
		{"a bad protocol version", `{"url": "http://h/mcp", "protocol-version": "2020-01-01"}`, "downstream.protocol-version", "want one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mcpguard.ParseDownstream(json.RawMessage(tc.raw))
			var ce *mcpguard.ConfigError
			if !errors.As(err, &ce) || ce.Key != tc.key || !strings.Contains(ce.Reason, tc.says) {
				t.Fatalf("ParseDownstream: %v; want %s: ...%s...", err, tc.key, tc.says)
			}
		})
	}
}

// TestNewChecksTheDownstream: New refuses, naming the key, a guarded tool,
// a lookup tool, or an operation-key, identity, term or lookup argument
// the downstream does not have; and says so when the downstream does not
// start.
func TestNewChecksTheDownstream(t *testing.T) {
	r := &refunds{dir: t.TempDir()}
	url, _ := r.serveHTTP(t)
	for _, tc := range []struct {
		name, tools, says string
	}{
		{"an unknown tool", `{"create_payout": {"action": "a", "identity": {"meta": ["c"]}, "operation-key": {"meta": "k"}}}`, "tools.create_payout: the downstream " + url + " has no tool create_payout (it has: create_refund, echo, find_refund, issue_credit, send_payout)"},
		{"an unknown lookup tool", `{"create_refund": {"action": "a", "identity": {"meta": ["c"]}, "operation-key": {"meta": "k"}, "lookup": {"tool": "lookup_refund", "argument": "reference"}}}`, "tools.create_refund.lookup.tool: the downstream"},
		{"an unknown lookup argument", `{"create_refund": {"action": "a", "identity": {"meta": ["c"]}, "operation-key": {"meta": "k"}, "lookup": {"tool": "find_refund", "argument": "ref"}}}`, `tools.create_refund.lookup.argument: the downstream's find_refund takes no argument "ref" (its arguments: reference)`},
		{"an unknown identity argument", `{"create_refund": {"action": "a", "identity": {"arguments": ["orderid"], "meta": ["c"]}, "operation-key": {"meta": "k"}}}`, `tools.create_refund.identity.arguments: the downstream's create_refund takes no argument "orderid" (its arguments: amount, currency, order_id, reference)`},
		{"a misspelt term", `{"create_refund": {"action": "a", "identity": {"meta": ["c"]}, "terms": ["order_id", "amount", "curency"], "operation-key": {"meta": "k"}}}`, `tools.create_refund.terms: the downstream's create_refund takes no argument "curency"`},
		{"an unknown operation-key argument", `{"create_refund": {"action": "a", "identity": {"meta": ["c"]}, "operation-key": {"argument": "idempotency_key"}}}`, `tools.create_refund.operation-key.argument: the downstream's create_refund takes no argument "idempotency_key"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tools, err := mcpguard.ParseTools(json.RawMessage(tc.tools))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = mcpguard.New(ctx, mcpguard.Config{Downstream: &mcpguard.Downstream{URL: url}, Tools: tools}, dialIntentd(t))
			var ce *mcpguard.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("New: %v; want a ConfigError saying %q", err, tc.says)
			}
		})
	}
	t.Run("a downstream that does not start", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := mcpguard.New(ctx, mcpguard.Config{Downstream: &mcpguard.Downstream{Command: []string{"/nonexistent/refunds-server"}}, Tools: parseTools(t)}, dialIntentd(t))
		if err == nil || !strings.Contains(err.Error(), "/nonexistent/refunds-server") {
			t.Fatalf("New: %v; want an error naming the command", err)
		}
	})
}
