package mcpguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/text"
)

// MetaFingerprint is the _meta key a host may set to the fingerprint of
// the terms it approved (DeriveKey's): a call with other terms is refused.
const MetaFingerprint = "intentd/fingerprint"

// MetaKey is the _meta key of a guarded answer that names its intent.
const MetaKey = "intentd/key"

// MetaOutcome is the _meta key of a guarded answer that says what the
// guard did: executed, replayed, looked_up, in_progress, under_review,
// not_done, failed, refused, unavailable.
const MetaOutcome = "intentd/outcome"

// intentdWait bounds how long a call waits for intentd before anything is
// sent (the guard's session) and the read-only tools' reads: past it the
// model is answered unavailable, rather than left waiting while intentd is
// down or --intentd names the wrong address.
var intentdWait = 10 * time.Second

// terms is what a call derives from its arguments and the host's _meta.
type terms struct {
	key, fingerprint string
	identity, params map[string]any
}

// derive computes a call's intent key and approved terms. The error is
// the answer to the model: what is missing, nothing sent.
func derive(t *Tool, args map[string]any, meta mcp.Meta, header http.Header) (*terms, error) {
	identity := map[string]any{}
	for _, a := range t.Identity.Arguments {
		v, ok := args[a]
		if !ok {
			return nil, fmt.Errorf("the argument %q is required: it identifies the request", a)
		}
		identity[a] = v
	}
	for _, m := range t.Identity.Meta {
		v, ok := meta[m]
		if !ok || v == nil {
			return nil, fmt.Errorf("the host did not set _meta %q, which identifies the request; the host must supply it (the model cannot)", m)
		}
		identity[m] = v
	}
	for _, h := range t.Identity.Headers {
		v := header.Get(h)
		if v == "" {
			return nil, fmt.Errorf("the host did not send the HTTP header %q, which identifies the request; the host must supply it (the model cannot)", h)
		}
		identity[h] = v
	}
	maps.Copy(identity, t.Identity.Values)
	key, _, err := intent.DeriveKey(t.Action, identity)
	if err != nil {
		return nil, fmt.Errorf("the request's identity: %v", err)
	}
	params := map[string]any{}
	if len(t.Terms) > 0 {
		for _, a := range t.Terms {
			if v, ok := args[a]; ok {
				params[a] = v
			}
		}
	} else {
		for a, v := range args {
			if a != t.OperationKey.Argument {
				params[a] = v
			}
		}
	}
	if len(params) == 0 {
		params["identity"] = identity // no terms beyond who and what
	}
	canon, err := intent.Canonical(params)
	if err != nil {
		return nil, fmt.Errorf("the request's terms: %v", err)
	}
	return &terms{key: key, fingerprint: intent.Fingerprint(canon), identity: identity, params: params}, nil
}

// headerOf is the HTTP request's header of a call (nil on stdio).
func headerOf(req mcp.Request) http.Header {
	if e := req.GetExtra(); e != nil {
		return e.Header
	}
	return nil
}

// guarded is a call of a guarded tool: derive the key, acquire, forward
// once with the operation key, record the answer; or answer what became of
// the intent.
func (g *Guard) guarded(ctx context.Context, t *Tool, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	args := map[string]any{}
	if raw := req.Params.Arguments; len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &args); err != nil {
			return say("", "refused", fmt.Sprintf("refused: %s's arguments are not a JSON object (%v); nothing was sent; action_taken: none", t.Name, err)), nil
		}
	}
	tm, err := derive(t, args, req.Params.Meta, headerOf(req))
	if err != nil {
		return say("", "refused", fmt.Sprintf("refused: %s: %v; nothing was sent; action_taken: none", t.Name, err)), nil
	}
	expected := tm.fingerprint
	if fp, ok := req.Params.Meta[MetaFingerprint].(string); ok && fp != "" {
		expected = fp // the host approved terms of this fingerprint
	}
	task := client.Task{Key: tm.key, ExpectedFingerprint: expected, WaitInProgress: t.WaitInProgress}
	if t.Approval == "call" {
		p, err := structpb.NewStruct(tm.params)
		if err != nil {
			return say(tm.key, "refused", fmt.Sprintf("refused: %s's terms: %v; nothing was sent; action_taken: none", t.Name, err)), nil
		}
		id, err := structpb.NewStruct(tm.identity)
		if err != nil {
			return say(tm.key, "refused", fmt.Sprintf("refused: %s's identity: %v; nothing was sent; action_taken: none", t.Name, err)), nil
		}
		task.Register = &intentv1.RegisterRequest{Params: p, Action: t.Action, Identity: id, MaxAttempts: uint32(t.MaxAttempts),
			Labels: map[string]string{LabelGuard: g.cfg.Name, LabelTool: t.Name}}
	}
	var live *mcp.CallToolResult // the downstream's answer, when this call got one
	sent := false                // whether this call sent anything downstream
	claim := newClaimBound(intentdWait + t.WaitInProgress)
	task.Execute = func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		if !claim.act() {
			return nil, client.NotAttempted(claim.err())
		}
		sent = true
		p := &mcp.CallToolParams{Name: t.Name, Meta: forwardMeta(req.Params.Meta)}
		delete(p.Meta, MetaFingerprint)
		down := maps.Clone(args)
		opKey := att.OperationKey(t.Operation)
		if a := t.OperationKey.Argument; a != "" {
			down[a] = opKey
		} else {
			if p.Meta == nil {
				p.Meta = mcp.Meta{}
			}
			p.Meta[t.OperationKey.Meta] = opKey
		}
		p.Arguments = down
		cctx, cancel := context.WithTimeout(ctx, t.Timeout)
		defer cancel()
		res, err := g.down.call(cctx, p)
		var unsent *notSentError
		switch {
		case errors.As(err, &unsent):
			return nil, client.NotAttempted(err)
		case err != nil && refusedUnsent(err):
			return nil, client.NotAttempted(fmt.Errorf("the downstream refused the call: %w", err))
		case err != nil:
			return nil, fmt.Errorf("the downstream's answer was lost (%w): it may or may not have taken effect", err)
		}
		live = res
		if res.IsError {
			switch t.OnToolError {
			case "release":
				return nil, client.NotAttempted(fmt.Errorf("the downstream answered an error: %s", textOf(res)))
			case "fail":
				return nil, client.Final("tool_error", errors.New(text.Cut(textOf(res), 900)))
			}
		}
		return toResult(res)
	}
	if l := t.Lookup; l != nil {
		task.Reconcile = func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			if !claim.act() {
				return client.Evidence{}, claim.err()
			}
			sent = true
			return g.lookup(ctx, t, l, att)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, intentdWait)
	sess, err := g.session(sctx)
	cancel()
	if err != nil {
		if sctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %v", intentdWait)
		}
		g.log.Warn("mcp-guard: intentd could not be reached", "tool", t.Name, "err", err)
		return say(tm.key, "unavailable", fmt.Sprintf("unavailable: intentd could not be reached (%v); nothing was sent; try again later; action_taken: none", err)), nil
	}
	// The host may stop waiting (a timeout of its own, a cancellation):
	// the call goes on to its end, bounded by the tool's timeout, so that
	// an effect that happens is recorded and the host's next call gets
	// it, rather than an answer cut mid-way and an intent left UNKNOWN.
	ctx = context.WithoutCancel(ctx)
	// Until the downstream is asked, the call is bounded: an intentd that
	// stops answering once the guard's session is open (down, stalled, cut
	// off) would otherwise keep the claim retrying, and the host waiting,
	// for ever. Past the bound the model is answered unavailable at once,
	// nothing sent, while Run gives back in the background a lease it may
	// have got; once the downstream is asked, the call goes on to its end.
	type ran struct {
		out *client.Outcome
		err error
	}
	got := make(chan ran, 1)
	go func() {
		rctx, giveUp := context.WithCancel(ctx)
		defer giveUp()
		defer claim.start(giveUp)()
		out, err := sess.Run(rctx, task)
		for wait := 20 * time.Millisecond; out == nil && !sent && errors.Is(err, client.ErrRateLimited) && wait <= time.Second; wait *= 2 {
			// Refused before anything was sent, as many hosts share the
			// guard's one principal: wait a little and ask again.
			time.Sleep(wait/2 + rand.N(wait/2))
			out, err = sess.Run(rctx, task)
		}
		got <- ran{out, err}
	}()
	var r ran
	select {
	case r = <-got:
	case <-claim.given:
		g.log.Warn("mcp-guard: intentd did not answer the claim", "tool", t.Name, "within", claim.bound)
		return say(tm.key, "unavailable", fmt.Sprintf("unavailable: %s was not carried out: %v; nothing was sent; you may call it again later; action_taken: none", t.Name, claim.err())), nil
	}
	out, err := r.out, r.err
	if err != nil && out != nil && out.Intent.GetState() == intentv1.State_STATE_UNKNOWN && task.Reconcile == nil {
		// No lookup can settle it: hand it to a person now (the next
		// Acquire is RECONCILE, which Run escalates without a Reconcile),
		// so that the answer's "under review" is true when it is read.
		ectx, cancel := context.WithTimeout(ctx, intentdWait)
		again, aerr := sess.Run(ectx, client.Task{Key: tm.key, Execute: task.Execute, WaitInProgress: time.Millisecond})
		cancel()
		if aerr == nil && again.Outcome == intentv1.Outcome_OUTCOME_NEEDS_REVIEW {
			out.Outcome, out.Intent = again.Outcome, again.Intent
		}
	}
	return g.answer(ctx, t, tm, out, err, live, sent), nil
}

// claimBound gives up a call's claim when intentd has not let it act
// within bound: the first of act and the bound wins, once.
type claimBound struct {
	bound time.Duration
	state atomic.Int32  // 0 claiming, 1 acting, 2 given up
	given chan struct{} // closed when the bound gave the claim up
}

func newClaimBound(bound time.Duration) *claimBound {
	return &claimBound{bound: bound, given: make(chan struct{})}
}

// start arms the bound; give is called if it passes first. The function it
// returns disarms it.
func (c *claimBound) start(give func()) (stop func()) {
	t := time.AfterFunc(c.bound, func() {
		if c.state.CompareAndSwap(0, 2) {
			give()
			close(c.given)
		}
	})
	return func() { t.Stop() }
}

// act reports whether the call may ask the downstream: not once the bound
// gave the claim up.
func (c *claimBound) act() bool { return c.state.CompareAndSwap(0, 1) || c.state.Load() == 1 }

func (c *claimBound) err() error {
	return fmt.Errorf("intentd did not let the call act within %v", c.bound)
}

// lookup asks the downstream's lookup tool whether an earlier attempt took
// effect, by its operation key.
func (g *Guard) lookup(ctx context.Context, t *Tool, l *Lookup, att *client.Attempt) (client.Evidence, error) {
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	res, err := g.down.call(cctx, &mcp.CallToolParams{Name: l.Tool, Arguments: map[string]any{l.Argument: att.OperationKey(t.Operation)}})
	if err != nil {
		return client.Evidence{}, fmt.Errorf("lookup %s: %w", l.Tool, err)
	}
	if res.IsError {
		return client.Evidence{}, fmt.Errorf("lookup %s answered an error: %s", l.Tool, text.Cut(textOf(res), 300))
	}
	sc, _ := structured(res)[l.FoundField].(bool)
	if _, has := structured(res)[l.FoundField]; !has {
		return client.Undecided(fmt.Sprintf("lookup %s answered without a boolean %q: a person decides", l.Tool, l.FoundField)), nil
	}
	if !sc {
		return client.Absent("lookup " + l.Tool + " found no effect"), nil
	}
	r, err := toResult(res)
	if err != nil {
		return client.Evidence{}, err
	}
	return client.Found(r), nil
}

// structured is a result's structuredContent as an object (nil if none).
func structured(res *mcp.CallToolResult) map[string]any {
	if res == nil || res.StructuredContent == nil {
		return nil
	}
	if m, ok := res.StructuredContent.(map[string]any); ok {
		return m
	}
	var m map[string]any
	if b, err := json.Marshal(res.StructuredContent); err == nil {
		_ = json.Unmarshal(b, &m)
	}
	return m
}

// maxKeptAnswer is the most of a CallToolResult's JSON a record keeps
// (intent.v1.Result.payload's limit).
const maxKeptAnswer = 256 << 10

// toResult is the record of a downstream answer: the CallToolResult's JSON,
// replayed as it was, and its structured scalars as external references.
func toResult(res *mcp.CallToolResult) (*intentv1.Result, error) {
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("the downstream's answer: %w", err)
	}
	r := &intentv1.Result{Payload: b}
	if len(b) > maxKeptAnswer {
		// The effect happened: record that it did, with what can be
		// kept (its structured scalars below), rather than fail it.
		cut, _ := json.Marshal(&mcp.CallToolResult{IsError: res.IsError, Content: []mcp.Content{&mcp.TextContent{
			Text: fmt.Sprintf("the downstream's answer was %d bytes, more than the %d a record keeps; its external references are kept", len(b), maxKeptAnswer)}}})
		r.Payload = cut
	}
	for _, k := range slices.Sorted(maps.Keys(structured(res))) {
		if len(r.ExternalRefs) == 32 || k == "" || len(k) > 256 {
			break
		}
		switch v := structured(res)[k].(type) {
		case string:
			r.ExternalRefs = setRef(r.ExternalRefs, k, v)
		case float64, bool:
			r.ExternalRefs = setRef(r.ExternalRefs, k, fmt.Sprint(v))
		}
	}
	return r, nil
}

func setRef(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = text.Cut(v, 256)
	return m
}

// fromResult is a recorded answer as the CallToolResult it was.
func fromResult(r *intentv1.Result) *mcp.CallToolResult {
	res := &mcp.CallToolResult{}
	if r == nil || len(r.GetPayload()) == 0 || json.Unmarshal(r.GetPayload(), res) != nil {
		refs, _ := json.Marshal(r.GetExternalRefs())
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "recorded result: " + string(refs)}}}
	}
	return res
}

// answer is what the model gets for one guarded call.
func (g *Guard) answer(ctx context.Context, t *Tool, tm *terms, out *client.Outcome, err error, live *mcp.CallToolResult, sent bool) *mcp.CallToolResult {
	switch {
	case errors.Is(err, client.ErrFingerprintMismatch):
		approved := "unknown terms"
		gctx, cancel := context.WithTimeout(ctx, intentdWait)
		defer cancel()
		if in, gerr := g.api.Get(gctx, &intentv1.GetRequest{Key: tm.key}); gerr == nil {
			b, _ := json.Marshal(in.GetIntent().GetParams().AsMap())
			approved = string(b)
		}
		mine, _ := json.Marshal(tm.params)
		return say(tm.key, "refused", fmt.Sprintf("refused: FINGERPRINT_MISMATCH: %s was approved with other terms (%s) than these (%s); nothing was sent. Ask the user to approve the new terms, or call it with the approved ones.", t.Name, approved, mine))
	case errors.Is(err, client.ErrNotFound):
		mine, _ := json.Marshal(tm.params)
		return say(tm.key, "refused", fmt.Sprintf("refused: NOT_APPROVED: %s with these terms (%s) has not been approved; nothing was sent. Ask the user to approve it first.", t.Name, mine))
	case errors.Is(err, client.ErrPermissionDenied) || errors.Is(err, client.ErrUnauthenticated):
		return say(tm.key, "refused", fmt.Sprintf("refused: intentd refused the guard's own credentials (%v); nothing was sent; this needs whoever runs the guard, not a retry; tell the user %s is not available now.", err, t.Name))
	case out == nil && err != nil && !sent:
		return say(tm.key, "unavailable", fmt.Sprintf("unavailable: %s was not carried out: intentd refused or did not answer (%v); nothing was sent; you may call it again later; action_taken: none", t.Name, err))
	case out == nil && err != nil:
		return say(tm.key, "unavailable", fmt.Sprintf("unavailable: %s could not be carried out safely (%v); if it was sent, its outcome is recorded as unknown and will be looked up, never sent again; do not retry now, check %s later.", t.Name, err, StatusTool))
	}
	in := out.Intent
	switch {
	case out.Outcome == intentv1.Outcome_OUTCOME_COMPLETED && out.Executed && live != nil:
		return withMeta(live, tm.key, "executed")
	case out.Outcome == intentv1.Outcome_OUTCOME_COMPLETED:
		res := fromResult(in.GetResult())
		said := ""
		if out.Statement != nil && out.Statement.GetStatus() == "already_completed" {
			said = out.Statement.GetText()
		} else {
			said = fmt.Sprintf("already_completed: %s had taken effect in an earlier attempt (found by lookup); it was recorded, not repeated; action_taken: none", t.Name)
		}
		res.Content = append(slices.Clone(res.Content), &mcp.TextContent{Text: said})
		outcome := "replayed"
		if out.Executed || out.Statement == nil {
			outcome = "looked_up"
		}
		return withMeta(res, tm.key, outcome)
	case out.Outcome == intentv1.Outcome_OUTCOME_IN_PROGRESS:
		return say(tm.key, "in_progress", fmt.Sprintf("in_progress: %s is being carried out by another call and was not started again; do not retry now; check %s with key %s later. (%s)", t.Name, StatusTool, tm.key, out.Statement.GetText()))
	case in.GetState() == intentv1.State_STATE_UNKNOWN:
		return say(tm.key, "unknown", fmt.Sprintf("unknown: %s may or may not have taken effect (%v); it was not sent again, and the next call of it looks it up first; do not retry now; check %s with key %s later.", t.Name, err, StatusTool, tm.key))
	case out.Outcome == intentv1.Outcome_OUTCOME_NEEDS_REVIEW:
		why := ""
		if err != nil {
			why = " (" + err.Error() + ")"
		}
		return say(tm.key, "under_review", fmt.Sprintf("under_review: %s may or may not have taken effect%s; it is under human review; do not retry, and tell the user a person will confirm it (intent %s).", t.Name, why, tm.key))
	case out.Outcome == intentv1.Outcome_OUTCOME_FAILED:
		f := in.GetFailure()
		if out.Executed {
			return withMeta(errResult(live, fmt.Sprintf("failed: %s failed for good (%s: %s); do not retry with the same terms.", t.Name, f.GetCode(), f.GetMessage())), tm.key, "failed")
		}
		return say(tm.key, "failed", fmt.Sprintf("already_failed: %s failed for good before (%s: %s); nothing was sent; do not retry with the same terms; action_taken: none", t.Name, f.GetCode(), f.GetMessage()))
	case in.GetState() == intentv1.State_STATE_PENDING && out.Executed:
		return withMeta(errResult(live, fmt.Sprintf("not_done: %s was not carried out (%v); you may call it again.", t.Name, err)), tm.key, "not_done")
	}
	status := strings.ToLower(strings.TrimPrefix(out.Outcome.String(), "OUTCOME_"))
	return say(tm.key, status, nonEmpty(out.Statement.GetText(), fmt.Sprintf("%s: %s was not carried out (intent %s is %s); action_taken: none", status, t.Name, tm.key, in.GetState())))
}

// say is an answer in words, as a tool error (the model must not read it
// as the tool's success).
func say(key, outcome, text string) *mcp.CallToolResult {
	return withMeta(&mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}, key, outcome)
}

// errResult is the downstream's error answer with the guard's words after
// it, or the words alone.
func errResult(live *mcp.CallToolResult, text string) *mcp.CallToolResult {
	res := &mcp.CallToolResult{IsError: true}
	if live != nil {
		res.Content = slices.Clone(live.Content)
		res.StructuredContent = live.StructuredContent
	}
	res.Content = append(res.Content, &mcp.TextContent{Text: text})
	return res
}

func withMeta(res *mcp.CallToolResult, key, outcome string) *mcp.CallToolResult {
	r := *res
	r.Meta = maps.Clone(res.Meta)
	if r.Meta == nil {
		r.Meta = mcp.Meta{}
	}
	if key != "" {
		r.Meta[MetaKey] = key
	}
	r.Meta[MetaOutcome] = outcome
	return &r
}

// textOf is the text of a result's text contents.
func textOf(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, " ")
}

func nonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// sinceText is a time as a statement writes it.
func sinceText(t time.Time) string { return t.UTC().Format(time.RFC3339) }
