package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/vocab"
)

// decidedState is the state a decision leaves an intent in.
func decidedState(d intentv1.Decision) intentv1.State {
	return intentv1.State(intentv1.State_value["STATE_"+strings.TrimPrefix(d.String(), "DECISION_")])
}

// lastDecision is the latest reviewer's decision in an intent's history, or
// nil when a later escalation reopened the question.
func lastDecision(in *intentv1.Intent) *intentv1.HistoryEntry {
	h := in.GetHistory()
	for i := len(h) - 1; i >= 0; i-- {
		switch h[i].GetKind() {
		case intentv1.HistoryEntry_KIND_RESOLVED:
			return h[i]
		case intentv1.HistoryEntry_KIND_ESCALATED:
			return nil
		}
	}
	return nil
}

// byActor reports whether principal, as the store records a decision's
// author, is actor: the actor itself without authentication, the token's
// name when it is the actor's, else "<token name> (as <actor>)".
func byActor(principal, actor string) bool {
	return principal == actor || strings.HasSuffix(principal, " (as "+actor+")")
}

// priorDecision turns a refused resolve into the answer to a retry: when
// the same decision by the same actor is already recorded — the earlier
// run's reply was lost to a timeout, and the rerun got a fresh request id —
// the intent is returned as a replay would return it (action_taken none).
// Otherwise it returns nil, and notes who decided on stderr if someone did.
func priorDecision(ctx context.Context, c *client.Client, req *intentv1.ResolveRequest, refused error, stderr io.Writer) *intentv1.ResolveResponse {
	if !errors.Is(refused, client.ErrInvalidTransition) && !errors.Is(refused, client.ErrLeaseHeld) {
		return nil
	}
	got, err := c.Get(ctx, &intentv1.GetRequest{Key: req.GetKey()})
	if err != nil {
		return nil
	}
	e := lastDecision(got.GetIntent())
	if e == nil {
		return nil
	}
	if e.GetResolvedState() == decidedState(req.GetDecision()) && byActor(e.GetPrincipal(), req.GetActor()) {
		return &intentv1.ResolveResponse{Intent: got.GetIntent(), ActionTaken: vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE)}
	}
	fmt.Fprintln(stderr, clean(fmt.Sprintf("intentctl: %s was decided %s by %s at %s", req.GetKey(), stateName(e.GetResolvedState()), e.GetPrincipal(), stamp(e.GetTime()))))
	return nil
}

// printDecided is resolve's text. A replay says so: the decision it finds
// is the caller's own, made earlier.
func printDecided(w io.Writer, resp *intentv1.ResolveResponse) error {
	in := resp.GetIntent()
	if resp.GetActionTaken() == vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE) {
		if e := lastDecision(in); e != nil {
			_, err := fmt.Fprintln(w, clean(fmt.Sprintf("already decided (by you, at %s): %s %s; nothing changed, now %s",
				stamp(e.GetTime()), in.GetKey(), stateName(e.GetResolvedState()), stateName(in.GetState()))))
			return err
		}
	}
	return printChanged(w, "resolved", in, resp.GetActionTaken())
}

// printChanged is the text of a reviewer's or approver's call: what it did
// and the state it left.
func printChanged(w io.Writer, verb string, in *intentv1.Intent, action string) error {
	s := fmt.Sprintf("%s %s: now %s", verb, in.GetKey(), stateName(in.GetState()))
	if t := in.GetLease().GetToken(); t != 0 {
		s += fmt.Sprintf(", token %d", t)
	}
	if action != "" {
		s += " (" + action + ")"
	}
	_, err := fmt.Fprintln(w, clean(s))
	return err
}
