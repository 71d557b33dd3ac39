package mcpguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// The guard's own tools for models: read-only, answering in statements.
// Claiming and reporting never face the model.

type statusArgs struct {
	Key       string         `json:"key,omitempty" jsonschema:"the intent key a guarded answer named (its _meta intentd/key or its text)"`
	Tool      string         `json:"tool,omitempty" jsonschema:"instead of key: a guarded tool's name, with arguments"`
	Arguments map[string]any `json:"arguments,omitempty" jsonschema:"with tool: the arguments of the call to ask about"`
}

type completedArgs struct {
	Tool   string `json:"tool,omitempty" jsonschema:"only this guarded tool's intents (default: all of this guard's)"`
	Limit  int    `json:"limit,omitempty" jsonschema:"at most this many, oldest first (default 20, at most 100)"`
	Cursor string `json:"cursor,omitempty" jsonschema:"the next_cursor of the previous answer, to go on from there (with the same tool)"`
}

// statementOut is a statement as the tools answer it.
type statementOut struct {
	Status string            `json:"status"`
	Key    string            `json:"key,omitempty"`
	State  string            `json:"state,omitempty"`
	Tool   string            `json:"tool,omitempty"`
	Refs   map[string]string `json:"external_refs,omitempty"`
	Text   string            `json:"text"`
}

type completedOut struct {
	Completed []statementOut `json:"completed"`
	// NextCursor is set when there are more: the cursor of the next call.
	NextCursor string `json:"next_cursor,omitempty"`
}

func (g *Guard) addOwnTools() {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}
	mcp.AddTool(g.server, &mcp.Tool{Name: StatusTool, Annotations: ro,
		Description: "What became of a guarded request: completed (and with what), in progress, under human review, failed, or not yet done. Read-only; it never carries anything out."},
		func(ctx context.Context, req *mcp.CallToolRequest, a statusArgs) (*mcp.CallToolResult, statementOut, error) {
			st := g.status(ctx, a, req.Params.Meta, headerOf(req))
			return nil, st, nil
		})
	mcp.AddTool(g.server, &mcp.Tool{Name: CompletedTool, Annotations: ro,
		Description: "The guarded requests already carried out, each with what it created: check here before asking for something again. Read-only."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a completedArgs) (*mcp.CallToolResult, completedOut, error) {
			out, err := g.completed(ctx, a)
			return nil, out, err
		})
}

// status answers intent_status.
func (g *Guard) status(ctx context.Context, a statusArgs, meta mcp.Meta, header http.Header) statementOut {
	key := a.Key
	if key == "" {
		t, ok := g.cfg.Tools[a.Tool]
		if !ok {
			why := "neither key nor tool was given"
			if a.Tool != "" {
				why = fmt.Sprintf("%q is no guarded tool", a.Tool)
			}
			return statementOut{Status: "refused", Text: fmt.Sprintf("refused: %s; give key (a guarded answer's intentd/key), or tool (one of %s) and its arguments; action_taken: none", why, strings.Join(sortedKeys(g.cfg.Tools), ", "))}
		}
		args := a.Arguments
		if args == nil {
			args = map[string]any{}
		}
		tm, err := derive(t, args, meta, header)
		if err != nil {
			return statementOut{Status: "refused", Text: fmt.Sprintf("refused: %s: %v; action_taken: none", t.Name, err)}
		}
		key = tm.key
	}
	ctx, cancel := context.WithTimeout(ctx, intentdWait)
	defer cancel()
	resp, err := g.api.Get(ctx, &intentv1.GetRequest{Key: key})
	switch {
	case errors.Is(err, client.ErrNotFound):
		return statementOut{Status: "not_found", Key: key, Text: fmt.Sprintf("not_found: no request with key %s was made through this guard; nothing was done; action_taken: none", key)}
	case err != nil:
		return statementOut{Status: "unavailable", Key: key, Text: fmt.Sprintf("unavailable: intentd could not be asked (%v); try again later", err)}
	}
	in := resp.GetIntent()
	tool, ok := g.toolOf(in)
	if !ok {
		return statementOut{Status: "not_found", Key: key, Text: fmt.Sprintf("not_found: no request with key %s was made through this guard; action_taken: none", key)}
	}
	return describe(in, tool)
}

// toolOf is the guarded tool an intent belongs to: the one its labels name
// when this guard registered it, or, when the host did (approval: host),
// the one whose action it has.
func (g *Guard) toolOf(in *intentv1.Intent) (string, bool) {
	if in.GetLabels()[LabelGuard] == g.cfg.Name {
		return in.GetLabels()[LabelTool], true
	}
	for _, name := range sortedKeys(g.cfg.Tools) {
		if t := g.cfg.Tools[name]; t.Approval == "host" && t.Action == in.GetAction() {
			return name, true
		}
	}
	return "", false
}

// completed answers list_completed.
func (g *Guard) completed(ctx context.Context, a completedArgs) (completedOut, error) {
	limit := a.Limit
	if limit <= 0 {
		limit = 20
	}
	limit = min(limit, 100)
	label := LabelGuard + "=" + g.cfg.Name
	if a.Tool != "" {
		if _, ok := g.cfg.Tools[a.Tool]; !ok {
			return completedOut{}, fmt.Errorf("%q is no guarded tool (they are: %s)", a.Tool, strings.Join(sortedKeys(g.cfg.Tools), ", "))
		}
		label = LabelTool + "=" + a.Tool
	}
	ctx, cancel := context.WithTimeout(ctx, intentdWait)
	defer cancel()
	out := completedOut{Completed: []statementOut{}}
	token := a.Cursor
	for len(out.Completed) < limit {
		// A page no larger than what is still wanted: the next page's
		// token is then where the answer stops, to go on from.
		resp, err := g.api.List(ctx, &intentv1.ListRequest{States: []intentv1.State{intentv1.State_STATE_COMPLETED}, Label: label, PageSize: int32(limit - len(out.Completed)), PageToken: token})
		switch {
		case errors.Is(err, client.ErrInvalidArgument) && token != "":
			return out, fmt.Errorf("cursor %q is not one this tool gave for these arguments (give it with the same tool, or leave it out to start from the oldest)", token)
		case errors.Is(err, client.ErrCompacted):
			return out, errors.New("the cursor is too old (intentd no longer keeps the listing it continues): leave it out to start again from the oldest")
		case err != nil:
			return out, fmt.Errorf("intentd could not be asked: %v", err)
		}
		for _, in := range resp.GetIntents() {
			if in.GetLabels()[LabelGuard] == g.cfg.Name {
				out.Completed = append(out.Completed, describe(in, in.GetLabels()[LabelTool]))
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	out.NextCursor = token
	return out, nil
}

// describe is an intent's state as a statement for the model.
func describe(in *intentv1.Intent, tool string) statementOut {
	st := statementOut{Key: in.GetKey(), State: strings.TrimPrefix(in.GetState().String(), "STATE_"), Tool: tool, Refs: in.GetResult().GetExternalRefs()}
	var b strings.Builder
	switch in.GetState() {
	case intentv1.State_STATE_COMPLETED:
		st.Status = "completed"
		fmt.Fprintf(&b, "completed: %s (intent %s) took effect at %s", tool, in.GetKey(), sinceText(in.GetCompletedAt().AsTime()))
		if len(st.Refs) > 0 {
			refs, _ := json.Marshal(st.Refs)
			fmt.Fprintf(&b, " with %s", refs)
		}
		b.WriteString("; do not request it again")
	case intentv1.State_STATE_IN_PROGRESS:
		st.Status = "in_progress"
		fmt.Fprintf(&b, "in_progress: %s (intent %s) is being carried out; do not retry now; check again later", tool, in.GetKey())
	case intentv1.State_STATE_UNKNOWN:
		st.Status = "unknown"
		fmt.Fprintf(&b, "unknown: %s (intent %s) may or may not have taken effect; it will be looked up or reviewed, never sent again; do not retry", tool, in.GetKey())
	case intentv1.State_STATE_NEEDS_REVIEW:
		st.Status = "under_review"
		fmt.Fprintf(&b, "under_review: %s (intent %s) waits for a person to confirm what happened; do not retry; tell the user a person will confirm it", tool, in.GetKey())
	case intentv1.State_STATE_FAILED:
		st.Status = "failed"
		fmt.Fprintf(&b, "failed: %s (intent %s) failed for good (%s); do not retry with the same terms", tool, in.GetKey(), in.GetFailure().GetCode())
	case intentv1.State_STATE_CANCELLED:
		st.Status = "cancelled"
		fmt.Fprintf(&b, "cancelled: %s (intent %s) was withdrawn by a person; do not retry", tool, in.GetKey())
	case intentv1.State_STATE_PENDING:
		st.Status = "not_done"
		fmt.Fprintf(&b, "not_done: %s (intent %s) is approved and has not taken effect; it may be called", tool, in.GetKey())
	default:
		st.Status = strings.ToLower(st.State)
		fmt.Fprintf(&b, "%s: %s (intent %s)", st.Status, tool, in.GetKey())
	}
	b.WriteString("; action_taken: none")
	st.Text = b.String()
	return st
}
