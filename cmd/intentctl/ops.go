package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

func newGetCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get KEY",
		Short: "Print an intent: a summary (state, fingerprint, lease, result, attempts), then its history as a timeline",
		Args:  cobra.ExactArgs(1),
		RunE:  g.showIntent(printIntent),
	}
}

// listFlags are the filters and paging of list and review-queue.
type listFlags struct {
	states    []string
	label     string
	parent    string
	pageSize  int32
	pageToken string
	all       bool
}

func (l *listFlags) register(cmd *cobra.Command, withStates bool) {
	f := cmd.Flags()
	if withStates {
		f.StringSliceVar(&l.states, "state", nil, "keep intents in this state (repeatable): pending, in_progress, unknown, completed, failed, needs_review, cancelled")
	}
	f.StringVar(&l.label, "label", "", "keep intents with this label, name=value")
	f.StringVar(&l.parent, "parent", "", "keep the children of this intent")
	f.Int32Var(&l.pageSize, "page-size", 0, "intents per page (intentd's default 50, at most 100)")
	f.StringVar(&l.pageToken, "page-token", "", "continue from a previous page's next_page_token")
	f.BoolVar(&l.all, "all", false, "follow next_page_token to the end and print every page as one listing")
}

func (l *listFlags) request(states []intentv1.State) (*intentv1.ListRequest, error) {
	if l.label != "" && !strings.Contains(l.label, "=") {
		return nil, usagef("--label %q: want name=value", l.label)
	}
	if states == nil {
		var err error
		if states, err = parseStates(l.states); err != nil {
			return nil, err
		}
	}
	return &intentv1.ListRequest{States: states, Label: l.label, ParentKey: l.parent, PageSize: l.pageSize, PageToken: l.pageToken}, nil
}

// list prints one page, or with --all every page as one listing.
func (l *listFlags) list(cmd *cobra.Command, g *globals, states []intentv1.State) error {
	out, err := l.fetch(cmd, g, states)
	if err != nil {
		return err
	}
	return g.out.print(cmd.OutOrStdout(), out, func(w io.Writer, wide bool) error {
		return printIntents(w, out.GetIntents(), out.GetNextPageToken(), wide)
	})
}

// fetch reads one page, or with --all every page as one ListResponse (the
// revision is the first page's, which every page reads).
func (l *listFlags) fetch(cmd *cobra.Command, g *globals, states []intentv1.State) (*intentv1.ListResponse, error) {
	req, err := l.request(states)
	if err != nil {
		return nil, err
	}
	c, done, err := g.connect()
	if err != nil {
		return nil, err
	}
	defer done()
	ctx, cancel := g.deadline(cmd.Context())
	defer cancel()
	var out *intentv1.ListResponse
	for {
		page, err := c.List(ctx, req)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = page
		} else {
			out.Intents = append(out.Intents, page.GetIntents()...)
			out.NextPageToken = page.GetNextPageToken()
		}
		next := page.GetNextPageToken()
		if !l.all || next == "" {
			break
		}
		if next == req.GetPageToken() {
			return nil, fmt.Errorf("intentd returned page token %q twice; stopping", next)
		}
		req.PageToken = next
	}
	return out, nil
}

func newListCommand(g *globals) *cobra.Command {
	l := &listFlags{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List intents by state, label or parent, oldest first",
		Args:  cobra.NoArgs,
		RunE: g.action(func(cmd *cobra.Command, _ []string) error {
			return l.list(cmd, g, nil)
		}),
	}
	l.register(cmd, true)
	return cmd
}

// reviewStates are the states a human decides: nobody can tell what
// happened (UNKNOWN), or a worker handed the intent over (NEEDS_REVIEW).
var reviewStates = []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW}

func newReviewQueueCommand(g *globals) *cobra.Command {
	l := &listFlags{}
	cmd := &cobra.Command{
		Use:   "review-queue",
		Short: "List the intents waiting for a human: list --state unknown --state needs_review",
		Args:  cobra.NoArgs,
		RunE: g.action(func(cmd *cobra.Command, _ []string) error {
			return l.list(cmd, g, reviewStates)
		}),
	}
	l.register(cmd, false)
	return cmd
}

// parseStates reads state names: "unknown", "NEEDS_REVIEW", "needs-review"
// and "STATE_UNKNOWN" all work.
func parseStates(names []string) ([]intentv1.State, error) {
	var out []intentv1.State
	for _, n := range names {
		s := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(n), "-", "_"))
		if !strings.HasPrefix(s, "STATE_") {
			s = "STATE_" + s
		}
		v, ok := intentv1.State_value[s]
		if !ok || v == int32(intentv1.State_STATE_UNSPECIFIED) {
			return nil, usagef("--state %q: want pending, in_progress, unknown, completed, failed, needs_review or cancelled", n)
		}
		out = append(out, intentv1.State(v))
	}
	return out, nil
}

// parseDecision reads a decision name: "completed" or "DECISION_COMPLETED".
func parseDecision(name string) (intentv1.Decision, error) {
	s := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(s, "DECISION_") {
		s = "DECISION_" + s
	}
	v, ok := intentv1.Decision_value[s]
	if !ok || v == int32(intentv1.Decision_DECISION_UNSPECIFIED) {
		return 0, usagef("--decision %q: want completed, pending, failed or cancelled", name)
	}
	return intentv1.Decision(v), nil
}

// pairs reads name=value arguments into a map; a name given twice is an
// error, not a silent overwrite.
func pairs(what string, args []string) (map[string]string, error) {
	out := make(map[string]string, len(args))
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, usagef("%s %q: want name=value", what, a)
		}
		if _, dup := out[k]; dup {
			return nil, usagef("%s: %q given twice", what, k)
		}
		out[k] = v
	}
	return out, nil
}

func newResolveCommand(g *globals) *cobra.Command {
	var (
		decision, actor, reason, failureCode, payload, requestID string
		refs                                                     []string
		force                                                    bool
	)
	cmd := &cobra.Command{
		Use:   "resolve KEY",
		Short: "Decide an UNKNOWN or NEEDS_REVIEW intent, recording who and why",
		Long: `resolve records a reviewer's decision on an UNKNOWN or NEEDS_REVIEW intent:

  completed   the side effect happened; --ref and --payload give its result
  pending     confirmed absent downstream: execute again, with the same operation keys
  failed      it definitely failed; --failure-code names how (the reason is the message)
  cancelled   it must not happen

Every decision issues a new token, so an earlier lease's report is stale.
An intent under a live lease is refused (LEASE_HELD) unless --force.`,
		Args: cobra.ExactArgs(1),
		RunE: g.action(func(cmd *cobra.Command, args []string) error {
			d, err := parseDecision(decision)
			if err != nil {
				return err
			}
			refMap, err := pairs("--ref", refs)
			if err != nil {
				return err
			}
			req := &intentv1.ResolveRequest{Key: args[0], Decision: d, Actor: actor, Reason: reason, Force: force, RequestId: requestID}
			switch {
			case d == intentv1.Decision_DECISION_COMPLETED:
				req.Result = &intentv1.Result{ExternalRefs: refMap, Payload: []byte(payload)}
			case len(refs) > 0 || payload != "":
				return usagef("--ref and --payload go with --decision completed only")
			}
			switch {
			case d == intentv1.Decision_DECISION_FAILED && failureCode == "":
				return usagef("--decision failed needs --failure-code")
			case d == intentv1.Decision_DECISION_FAILED:
				req.Failure = &intentv1.Failure{Code: failureCode, Message: reason}
			case failureCode != "":
				return usagef("--failure-code goes with --decision failed only")
			}
			c, done, err := g.connect()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := g.deadline(cmd.Context())
			defer cancel()
			resp, err := c.Resolve(ctx, req)
			if err != nil {
				if resp = priorDecision(ctx, c, req, err, cmd.ErrOrStderr()); resp == nil {
					return err
				}
			}
			if resp.GetActionTaken() == vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE) && len(resp.GetIntent().GetHistory()) == 0 {
				// A replay by request id: the history says when it was decided.
				if got, err := c.Get(ctx, &intentv1.GetRequest{Key: req.GetKey()}); err == nil {
					resp.Intent = got.GetIntent()
				}
			}
			return g.out.print(cmd.OutOrStdout(), resp, func(w io.Writer, _ bool) error { return printDecided(w, resp) })
		}),
	}
	f := cmd.Flags()
	f.StringVar(&decision, "decision", "", "completed, pending, failed or cancelled")
	f.StringVar(&actor, "actor", "", "who decides (recorded in the history)")
	f.StringVar(&reason, "reason", "", "why (recorded in the history)")
	f.StringArrayVar(&refs, "ref", nil, "external reference of the result, name=value (repeatable; completed only)")
	f.StringVar(&payload, "payload", "", "result payload, stored as bytes (completed only)")
	f.StringVar(&failureCode, "failure-code", "", "failure code (failed only)")
	f.BoolVar(&force, "force", false, "decide even under a live lease, superseding it")
	f.StringVar(&requestID, "request-id", "", "idempotency id: the same id never decides twice (default: a fresh one)")
	for _, name := range []string{"decision", "actor", "reason"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func newCancelCommand(g *globals) *cobra.Command {
	var actor, reason string
	cmd := &cobra.Command{
		Use:   "cancel KEY",
		Short: "Withdraw a PENDING intent",
		Args:  cobra.ExactArgs(1),
		RunE: g.action(func(cmd *cobra.Command, args []string) error {
			resp, err := callOnce(cmd.Context(), g, func(ctx context.Context, c *client.Client) (*intentv1.CancelResponse, error) {
				return c.Cancel(ctx, &intentv1.CancelRequest{Key: args[0], Actor: actor, Reason: reason})
			})
			if err != nil {
				return err
			}
			return g.out.print(cmd.OutOrStdout(), resp, func(w io.Writer, _ bool) error {
				return printChanged(w, "cancelled", resp.GetIntent(), "")
			})
		}),
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the history)")
	cmd.Flags().StringVar(&actor, "actor", "", "who cancels (recorded in the history)")
	_ = cmd.MarkFlagRequired("reason")
	return cmd
}

func newEscalateCommand(g *globals) *cobra.Command {
	var actor, reason string
	var force bool
	cmd := &cobra.Command{
		Use:   "escalate KEY",
		Short: "Hand an intent to a human (NEEDS_REVIEW)",
		Long: `escalate moves an intent to NEEDS_REVIEW as a reviewer, without a token.
An intent under a live lease is refused (LEASE_HELD) unless --force, which
supersedes the lease.`,
		Args: cobra.ExactArgs(1),
		RunE: g.action(func(cmd *cobra.Command, args []string) error {
			resp, err := callOnce(cmd.Context(), g, func(ctx context.Context, c *client.Client) (*intentv1.EscalateResponse, error) {
				return c.Escalate(ctx, &intentv1.EscalateRequest{Key: args[0], Actor: actor, Reason: reason, Force: force})
			})
			if err != nil {
				return err
			}
			return g.out.print(cmd.OutOrStdout(), resp, func(w io.Writer, _ bool) error {
				return printChanged(w, "escalated", resp.GetIntent(), "")
			})
		}),
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the history)")
	cmd.Flags().StringVar(&actor, "actor", "", "who escalates (recorded in the history)")
	cmd.Flags().BoolVar(&force, "force", false, "escalate even under a live lease, superseding it")
	_ = cmd.MarkFlagRequired("reason")
	return cmd
}

func newWatchCommand(g *globals) *cobra.Command {
	var (
		states        []string
		label, parent string
		from          int64
	)
	cmd := &cobra.Command{
		Use:   "watch [KEY]",
		Short: "Stream changes, one line each, until interrupted",
		Long: `watch prints every change to one intent (KEY) or to the intents the filters
keep, one line each, until interrupted: revision, what happened (created,
put, deleted), key, state, lease token and holder. -o json prints one
protojson WatchResponse per line, -o yaml one YAML document each. The first
line, "created", says the watch is established: every change after its
revision follows, so a change made once that line is out is never missed.
--from REV starts at an etcd revision (resume with the last revision + 1;
list's revision + 1 follows a listing). A compacted revision fails with
REVISION_COMPACTED: list again, then watch from its revision + 1.`,
		Args: cobra.MaximumNArgs(1),
		RunE: g.action(func(cmd *cobra.Command, args []string) error {
			st, err := parseStates(states)
			if err != nil {
				return err
			}
			if label != "" && !strings.Contains(label, "=") {
				return usagef("--label %q: want name=value", label)
			}
			if from < 0 {
				return usagef("--from %d: must not be negative", from)
			}
			req := &intentv1.WatchRequest{States: st, Label: label, ParentKey: parent, StartRevision: from, CreatedNotify: true}
			if len(args) == 1 {
				req.Key = args[0]
			}
			c, done, err := g.connect()
			if err != nil {
				return err
			}
			defer done()
			out := cmd.OutOrStdout()
			var werr error
			err = c.Watch(cmd.Context(), req, func(ev *intentv1.WatchResponse) bool {
				werr = g.out.event(out, ev)
				return werr == nil
			})
			switch {
			case werr != nil:
				return werr
			case errors.Is(err, context.Canceled) && cmd.Context().Err() != nil:
				return nil // interrupted: the normal end of a watch
			}
			return err
		}),
	}
	f := cmd.Flags()
	f.StringSliceVar(&states, "state", nil, "keep changes that leave an intent in this state (repeatable)")
	f.StringVar(&label, "label", "", "keep intents with this label, name=value")
	f.StringVar(&parent, "parent", "", "keep the children of this intent")
	f.Int64Var(&from, "from", 0, "first etcd revision to report; 0 means changes after now")
	return cmd
}

func newDeriveKeyCommand(g *globals) *cobra.Command {
	var params string
	cmd := &cobra.Command{
		Use:   "derive-key [ACTION name=value ...] [--params JSON]",
		Short: "Print the canonical key of an action and its identity fields, and the fingerprint of params",
		Long: `derive-key asks intentd for the key of ACTION with the given identity fields,
the same in every language: the hex SHA-256 of their canonical JSON. With
--params it also prints the fingerprint intentd gives those approved terms
(what Register stores and Acquire's expected_fingerprint is compared with);
ACTION and its fields may then be left out.

A value is read as JSON when it parses as JSON (quantity=2 is the number 2,
tags='["a","b"]' an array), else as a string (customer=c-17). Identifiers
are best sent as strings: quote a number to keep it one, id='"1042"'. A
number intentd would have to round (2^53 or more, or more digits than a
double holds) is refused, in identity fields and params alike.`,
		Example: `  intentctl derive-key purchase customer=c-17 cart=cart-9
  intentctl derive-key --params '{"item": "desk lamp", "quantity": 1}'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if params != "" && len(args) == 0 {
				return nil
			}
			return cobra.MinimumNArgs(2)(cmd, args)
		},
		RunE: g.action(func(cmd *cobra.Command, args []string) error {
			req := &intentv1.DeriveKeyRequest{}
			if len(args) > 0 {
				identity, err := identityFields(args[1:])
				if err != nil {
					return err
				}
				req.Action, req.Identity = args[0], identity
			}
			if params != "" {
				p, err := jsonObject("--params", params)
				if err != nil {
					return err
				}
				req.Params = p
			}
			resp, err := callOnce(cmd.Context(), g, func(ctx context.Context, c *client.Client) (*intentv1.DeriveKeyResponse, error) {
				return c.DeriveKey(ctx, req)
			})
			if err != nil {
				return err
			}
			return g.out.print(cmd.OutOrStdout(), resp, func(w io.Writer, _ bool) error {
				tw := table(w)
				for _, f := range [][2]string{{"key", resp.GetKey()}, {"canonical", resp.GetCanonical()}, {"fingerprint", resp.GetFingerprint()}, {"canonical_params", resp.GetCanonicalParams()}} {
					if f[1] != "" {
						fmt.Fprintf(tw, "%s:\t%s\n", f[0], clean(f[1]))
					}
				}
				return tw.Flush()
			})
		}),
	}
	cmd.Flags().StringVar(&params, "params", "", "approved terms, a JSON object, to fingerprint")
	return cmd
}

// jsonObject reads the JSON object text of flag, its numbers held to
// intent.ExactNumber's rule.
func jsonObject(flag, text string) (*structpb.Struct, error) {
	var v any
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil || dec.More() {
		return nil, usagef("%s: want one JSON object: %v", flag, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, usagef("%s: want a JSON object, not %s", flag, text)
	}
	if _, err := exactNumbers(flag, m); err != nil {
		return nil, err
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, usagef("%s: %v", flag, err)
	}
	return s, nil
}

// identityFields reads name=value arguments, each value JSON if it parses
// as JSON, else the string itself.
func identityFields(args []string) (*structpb.Struct, error) {
	raw, err := pairs("identity field", args)
	if err != nil {
		return nil, err
	}
	fields := make(map[string]any, len(raw))
	for k, v := range raw {
		var parsed any
		dec := json.NewDecoder(strings.NewReader(v))
		dec.UseNumber()
		if err := dec.Decode(&parsed); err != nil || dec.More() {
			fields[k] = v
			continue
		}
		if parsed, err = exactNumbers("identity field "+k, parsed); err != nil {
			return nil, err
		}
		fields[k] = parsed
	}
	s, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, usagef("identity: %v", err)
	}
	return s, nil
}

// exactNumbers turns the json.Numbers in v, found at field (a path for
// the message), into float64, the only number protobuf's Struct holds, and
// refuses, as intentd would, a number that would not survive the trip
// (intent.ExactNumber): a key derived from a rounded identifier is somebody
// else's key.
func exactNumbers(field string, v any) (any, error) {
	switch v := v.(type) {
	case json.Number:
		f, err := intent.ExactNumber(v.String())
		if err != nil {
			return nil, usagef("%s: %v; quote it to send a string", field, err)
		}
		return f, nil
	case map[string]any:
		for k, e := range v {
			var err error
			if v[k], err = exactNumbers(field+"."+k, e); err != nil {
				return nil, err
			}
		}
		return v, nil
	case []any:
		for i, e := range v {
			var err error
			if v[i], err = exactNumbers(fmt.Sprintf("%s[%d]", field, i), e); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	return v, nil
}
