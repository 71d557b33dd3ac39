package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
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
	}
	for _, e := range in.History {
		out.History = append(out.History, &intentv1.HistoryEntry{
			Time:      timeToProto(e.Time),
			Kind:      intentv1.HistoryEntry_Kind(e.Kind),
			Token:     uint64(e.Token),
			Mode:      modeToProto(e.Mode),
			SessionId: e.SessionID,
			Worker:    e.Worker,
			Accepted:  e.Accepted,
			Result:    resultToProto(e.Result),
			Failure:   failureToProto(e.Failure),
			Reason:    e.Reason,
		})
	}
	return out
}

// paramsToProto turns stored canonical JSON back into a Struct. Stored params
// were a Struct on the way in, so this cannot fail short of corruption, in
// which case the params are omitted rather than the whole answer lost.
func paramsToProto(raw json.RawMessage) *structpb.Struct {
	if len(raw) == 0 {
		return nil
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(raw, s); err != nil {
		return nil
	}
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

// statement renders an Acquire outcome as a short, true sentence an agent
// can plan from.
func statement(a *intent.Acquisition) string {
	in := a.Intent
	var b strings.Builder
	switch a.Outcome {
	case intent.OutcomeExecute:
		fmt.Fprintf(&b, "execute: you hold intent %s under token %d; perform it once, sending operation keys such as %s:create-order downstream", in.Key, a.Lease.Token, in.Key)
	case intent.OutcomeReconcile:
		fmt.Fprintf(&b, "reconcile: an earlier attempt at intent %s may have taken effect; you hold token %d; ask the downstream system by operation key before acting", in.Key, a.Lease.Token)
	case intent.OutcomeCompleted:
		fmt.Fprintf(&b, "already_completed: intent %s completed at %s", in.Key, in.CompletedAt.UTC().Format(time.RFC3339))
		if in.Result != nil && len(in.Result.ExternalRefs) > 0 {
			refs, _ := json.Marshal(in.Result.ExternalRefs)
			fmt.Fprintf(&b, " with %s", refs)
		}
	case intent.OutcomeFailed:
		fmt.Fprintf(&b, "already_failed: intent %s failed", in.Key)
		if in.Failure != nil {
			fmt.Fprintf(&b, " (%s)", in.Failure.Code)
		}
	case intent.OutcomeCancelled:
		fmt.Fprintf(&b, "cancelled: intent %s was withdrawn", in.Key)
	case intent.OutcomeInProgress:
		fmt.Fprintf(&b, "in_progress: intent %s is held by worker %q", in.Key, a.Lease.Worker)
		if !a.Lease.ExpiresAt.IsZero() {
			fmt.Fprintf(&b, " until about %s unless it heartbeats", a.Lease.ExpiresAt.UTC().Format(time.RFC3339))
		}
		b.WriteString("; wait and acquire again")
	case intent.OutcomeNeedsReview:
		fmt.Fprintf(&b, "needs_review: intent %s waits for a human decision", in.Key)
	case intent.OutcomeExpired:
		fmt.Fprintf(&b, "expired: intent %s outlived its retention; it needs a new approval", in.Key)
	}
	if a.Outcome == intent.OutcomeExecute || a.Outcome == intent.OutcomeReconcile {
		return b.String()
	}
	return b.String() + "; action_taken: none"
}
