package server

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

// The wire and domain enums share their numbers; these conversions say so
// in one place.
func stateToProto(s intent.State) intentv1.State       { return intentv1.State(s) }
func outcomeToProto(o intent.Outcome) intentv1.Outcome { return intentv1.Outcome(o) }
func modeToProto(m intent.Mode) intentv1.LeaseMode     { return intentv1.LeaseMode(m) }

func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func intentToProto(in *intent.Intent) *intentv1.Intent {
	if in == nil {
		return nil
	}
	out := &intentv1.Intent{
		Tenant:        in.Tenant,
		Key:           in.Key,
		State:         stateToProto(in.State),
		Params:        paramsToProto(in.Params),
		ParamsVersion: in.ParamsVersion,
		Fingerprint:   in.Fingerprint,
		Labels:        in.Labels,
		ParentKey:     in.ParentKey,
		Lease:         leaseToProto(in.Lease),
		Result:        resultToProto(in.Result),
		Failure:       failureToProto(in.Failure),
		CreatedAt:     timeToProto(in.CreatedAt),
		UpdatedAt:     timeToProto(in.UpdatedAt),
		CompletedAt:   timeToProto(in.CompletedAt),
		Revision:      in.Revision,
		RetainUntil:   timeToProto(in.RetainUntil),
		Attempts:      uint32(in.Attempts),
		MaxAttempts:   uint32(in.MaxAttempts),
		Action:        in.Action,
		Identity:      paramsToProto(in.Identity),
		Summary:       in.Summary,
	}
	if in.Retention > 0 {
		out.Retention = durationToProto(in.Retention)
	}
	for _, c := range in.Children {
		out.Children = append(out.Children, &intentv1.Child{Key: c.Key, State: stateToProto(c.State)})
	}
	for _, e := range in.History {
		out.History = append(out.History, &intentv1.HistoryEntry{
			Time:          timeToProto(e.Time),
			Kind:          intentv1.HistoryEntry_Kind(e.Kind),
			Token:         uint64(e.Token),
			Mode:          modeToProto(e.Mode),
			SessionId:     e.SessionID,
			Worker:        e.Worker,
			Accepted:      e.Accepted,
			Result:        resultToProto(e.Result),
			Failure:       failureToProto(e.Failure),
			Reason:        e.Reason,
			Principal:     e.Principal,
			ResolvedState: stateToProto(e.ResolvedState),
			Channel:       e.Channel,
			PayloadSha256: e.PayloadSHA256,
		})
	}
	return out
}

// paramsToProto turns stored canonical JSON (params, an identity) back into
// a Struct. Stored params were a Struct on the way in, so this cannot fail
// short of corruption, in which case the params are omitted rather than
// the whole answer lost.
//
// The Struct holds its fields as their encoding, in its unknown fields
// (structFields, in structwire.go): encoding the Struct writes them as
// they are, which is what a deterministic Marshal of the Struct protojson
// reads from the text writes, and a client decodes them as the Struct's
// fields. In this process the Struct looks empty: answers are for the
// wire, and nothing in intentd reads them back (the review console is a
// client of its own). Every Acquire replay that reads etcd converts its
// params (BenchmarkParamsToProto).
func paramsToProto(raw json.RawMessage) *structpb.Struct {
	if len(raw) == 0 {
		return nil
	}
	fields, ok := structFields(nil, raw)
	if !ok {
		return nil
	}
	s := new(structpb.Struct)
	s.ProtoReflect().SetUnknown(fields)
	return s
}

func leaseToProto(l *intent.Lease) *intentv1.Lease {
	if l == nil {
		return nil
	}
	return &intentv1.Lease{
		Token:      uint64(l.Token),
		Mode:       modeToProto(l.Mode),
		SessionId:  l.SessionID,
		Worker:     l.Worker,
		AcquiredAt: timeToProto(l.AcquiredAt),
		ExpiresAt:  timeToProto(l.ExpiresAt),
		Live:       l.Live,
	}
}

func resultToProto(r *intent.Result) *intentv1.Result {
	if r == nil {
		return nil
	}
	return &intentv1.Result{Payload: r.Payload, ExternalRefs: r.ExternalRefs}
}

func failureToProto(f *intent.Failure) *intentv1.Failure {
	if f == nil {
		return nil
	}
	return &intentv1.Failure{Code: f.Code, Message: f.Message}
}

func durationToProto(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

// statement renders an Acquire outcome as a short, true account an agent
// can plan from.
func statement(a *intent.Acquisition) *intentv1.Statement {
	in := a.Intent
	st := &intentv1.Statement{
		IntentKey:   in.Key,
		State:       stateToProto(in.State),
		Result:      resultToProto(in.Result),
		CompletedAt: timeToProto(in.CompletedAt),
		ActionTaken: vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE),
	}
	if a.Lease != nil {
		st.CurrentToken = uint64(a.Lease.Token)
	}
	name := intentName(in.Key, in)
	var b strings.Builder
	switch a.Outcome {
	case intent.OutcomeExecute:
		st.Status, st.ActionTaken = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_EXECUTE), vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_LEASE_ISSUED)
		fmt.Fprintf(&b, "execute: you hold intent %s under token %d; perform it once, sending operation keys such as %s:create-order downstream", name, a.Lease.Token, in.Key)
	case intent.OutcomeReconcile:
		st.Status, st.ActionTaken = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_RECONCILE), vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_LEASE_ISSUED)
		fmt.Fprintf(&b, "reconcile: an earlier attempt at intent %s may have taken effect; you hold token %d; ask the downstream system by operation key before acting", name, a.Lease.Token)
	case intent.OutcomeCompleted:
		st.Status = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_ALREADY_COMPLETED)
		fmt.Fprintf(&b, "already_completed: intent %s completed at %s", name, in.CompletedAt.UTC().Format(time.RFC3339))
		if in.Result != nil && len(in.Result.ExternalRefs) > 0 {
			refs, _ := json.Marshal(in.Result.ExternalRefs)
			fmt.Fprintf(&b, " with %s", refs)
		}
	case intent.OutcomeFailed:
		st.Status = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_ALREADY_FAILED)
		fmt.Fprintf(&b, "already_failed: intent %s failed", name)
		if in.Failure != nil {
			fmt.Fprintf(&b, " (%s)", in.Failure.Code)
		}
	case intent.OutcomeCancelled:
		st.Status = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_CANCELLED)
		fmt.Fprintf(&b, "cancelled: intent %s was withdrawn", name)
	case intent.OutcomeInProgress:
		st.Status = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_IN_PROGRESS)
		fmt.Fprintf(&b, "in_progress: intent %s is held by worker %q", name, a.Lease.Worker)
		if !a.Lease.ExpiresAt.IsZero() {
			fmt.Fprintf(&b, " until about %s unless it heartbeats", a.Lease.ExpiresAt.UTC().Format(time.RFC3339))
		}
		b.WriteString("; wait and acquire again")
	case intent.OutcomeNeedsReview:
		st.Status = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_NEEDS_REVIEW)
		fmt.Fprintf(&b, "needs_review: intent %s waits for a human decision", name)
		if in.MaxAttempts > 0 && in.Attempts >= in.MaxAttempts {
			fmt.Fprintf(&b, " after %d attempts ended without a report", in.Attempts)
		}
	case intent.OutcomeExpired:
		st.Status = vocab.Status(intentv1.StatementStatus_STATEMENT_STATUS_EXPIRED)
		fmt.Fprintf(&b, "expired: intent %s outlived its retention (it was %s); it needs a new approval", name, in.State)
	}
	if st.ActionTaken == vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE) {
		b.WriteString("; action_taken: none")
	}
	st.Text = b.String()
	return st
}

// intentName is how a statement names the intent with key: the key, then
// the approver's summary in parentheses when in has one ("intent refund-77
// (\"Refund 40.00 USD to Alice for ORD-88412\")"), so that whoever reads
// the statement learns what a key of 64 hex digits stands for. The summary
// is quoted as a Go string: it is the approver's text inside intentd's
// sentence, and quotes, backslashes and bidi controls in it stay visible as
// escapes rather than end the quotation or reorder the sentence. Without a
// summary the text is what it always was.
func intentName(key string, in *intent.Intent) string {
	if in == nil || in.Summary == "" {
		return key
	}
	return key + " (" + strconv.Quote(in.Summary) + ")"
}

// refusal renders a refused fenced call as a Statement, for the error's
// details: what became of the intent, and that nothing was done.
func refusal(status intentv1.StatementStatus, text string, in *intent.Intent, current uint64, evidence bool) *intentv1.Statement {
	taken := vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE)
	if evidence {
		taken = vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_EVIDENCE_RECORDED)
	}
	st := &intentv1.Statement{Status: vocab.Status(status), ActionTaken: taken, CurrentToken: current, Text: text + "; action_taken: " + taken}
	if in != nil {
		st.IntentKey, st.State = in.Key, stateToProto(in.State)
		st.Result, st.CompletedAt = resultToProto(in.Result), timeToProto(in.CompletedAt)
	}
	return st
}
