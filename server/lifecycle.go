package server

import (
	"context"
	"strings"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/vocab"
)

// Escalate implements IntentService.Escalate.
func (s *Server) Escalate(ctx context.Context, req *intentv1.EscalateRequest) (*intentv1.EscalateResponse, error) {
	tn, err := target(req.GetTenant(), req.GetKey())
	if err == nil {
		err = required("reason", req.GetReason(), MaxReasonLen)
	}
	if err == nil {
		err = maxLen("actor", req.GetActor(), MaxWorkerLen)
	}
	if err != nil {
		return nil, s.fail(err)
	}
	in, err := s.store.Escalate(ctx, intent.Escalation{
		Tenant: tn, Key: req.GetKey(), Token: fencing.Token(req.GetToken()),
		Reason: req.GetReason(), Actor: req.GetActor(), Force: req.GetForce(),
	})
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.EscalateResponse{Intent: intentToProto(in)}, nil
}

// decisions maps the API's verdicts to the states they lead to.
var decisions = map[intentv1.Decision]intent.State{
	intentv1.Decision_DECISION_COMPLETED: intent.StateCompleted,
	intentv1.Decision_DECISION_PENDING:   intent.StatePending,
	intentv1.Decision_DECISION_FAILED:    intent.StateFailed,
	intentv1.Decision_DECISION_CANCELLED: intent.StateCancelled,
}

// Resolve implements IntentService.Resolve.
func (s *Server) Resolve(ctx context.Context, req *intentv1.ResolveRequest) (*intentv1.ResolveResponse, error) {
	d, err := resolution(req)
	if err != nil {
		return nil, s.fail(err)
	}
	in, replayed, err := s.store.Resolve(ctx, *d)
	if err != nil {
		return nil, s.fail(err)
	}
	taken := vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_RECORDED)
	if replayed {
		taken = vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE)
	}
	return &intentv1.ResolveResponse{Intent: intentToProto(in), ActionTaken: taken}, nil
}

func resolution(req *intentv1.ResolveRequest) (*intent.Resolution, error) {
	tn, err := target(req.GetTenant(), req.GetKey())
	if err != nil {
		return nil, err
	}
	state, ok := decisions[req.GetDecision()]
	if !ok {
		return nil, intent.Invalid("decision", "required: COMPLETED, PENDING, FAILED or CANCELLED")
	}
	if err := required("actor", req.GetActor(), MaxWorkerLen); err != nil {
		return nil, err
	}
	if err := required("reason", req.GetReason(), MaxReasonLen); err != nil {
		return nil, err
	}
	if err := required("request_id", req.GetRequestId(), MaxRequestIDLen); err != nil {
		return nil, err
	}
	if err := channel(req.GetChannel()); err != nil {
		return nil, err
	}
	d := &intent.Resolution{Tenant: tn, Key: req.GetKey(), Decision: state, Actor: req.GetActor(), Reason: req.GetReason(), Force: req.GetForce(), RequestID: req.GetRequestId(), Channel: req.GetChannel(),
		ExpectedToken: fencing.Token(req.GetExpectedToken())}
	switch state {
	case intent.StateCompleted:
		if d.Result, err = result(req.GetResult()); err != nil {
			return nil, err
		}
	case intent.StateFailed:
		if err := required("failure.code", req.GetFailure().GetCode(), MaxFailureCodeLen); err != nil {
			return nil, err
		}
		if err := maxLen("failure.message", req.GetFailure().GetMessage(), MaxReasonLen); err != nil {
			return nil, err
		}
		d.Failure = &intent.Failure{Code: req.GetFailure().GetCode(), Message: req.GetFailure().GetMessage()}
	}
	if state != intent.StateCompleted && req.GetResult() != nil {
		return nil, intent.Invalid("result", "only a COMPLETED decision carries a result")
	}
	if state != intent.StateFailed && req.GetFailure() != nil {
		return nil, intent.Invalid("failure", "only a FAILED decision carries a failure")
	}
	return d, nil
}

// Cancel implements IntentService.Cancel.
func (s *Server) Cancel(ctx context.Context, req *intentv1.CancelRequest) (*intentv1.CancelResponse, error) {
	tn, err := target(req.GetTenant(), req.GetKey())
	if err == nil {
		err = maxLen("actor", req.GetActor(), MaxWorkerLen)
	}
	if err == nil {
		err = maxLen("reason", req.GetReason(), MaxReasonLen)
	}
	if err != nil {
		return nil, s.fail(err)
	}
	in, err := s.store.Cancel(ctx, intent.Cancellation{Tenant: tn, Key: req.GetKey(), Actor: req.GetActor(), Reason: req.GetReason()})
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.CancelResponse{Intent: intentToProto(in)}, nil
}

// filter validates the filter fields List and Watch share.
func filter(tenantField string, states []intentv1.State, label, parent string) (intent.Filter, error) {
	tn, err := tenant(tenantField)
	if err != nil {
		return intent.Filter{}, err
	}
	f := intent.Filter{Tenant: tn, ParentKey: parent}
	for _, st := range states {
		if _, ok := intentv1.State_name[int32(st)]; !ok || st == intentv1.State_STATE_UNSPECIFIED {
			return f, intent.Invalid("states", "%d is not a state", st)
		}
		f.States = append(f.States, intent.State(st))
	}
	if label != "" {
		name, value, ok := strings.Cut(label, "=")
		if !ok || name == "" {
			return f, intent.Invalid("label", "want name=value")
		}
		if err := labels("label", map[string]string{name: value}); err != nil {
			return f, err
		}
		f.Label = &intent.Label{Name: name, Value: value}
	}
	if parent != "" {
		if err := intent.ValidateKey(parent); err != nil {
			return f, nested("parent_", err)
		}
	}
	return f, nil
}

// List implements IntentService.List.
func (s *Server) List(ctx context.Context, req *intentv1.ListRequest) (*intentv1.ListResponse, error) {
	f, err := filter(req.GetTenant(), req.GetStates(), req.GetLabel(), req.GetParentKey())
	if err == nil {
		err = maxLen("page_token", req.GetPageToken(), 1024)
	}
	if err != nil {
		return nil, s.fail(err)
	}
	page, err := s.store.List(ctx, intent.ListQuery{Filter: f, PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken()})
	if err != nil {
		return nil, s.fail(err)
	}
	out := &intentv1.ListResponse{NextPageToken: page.NextPageToken, Revision: page.Revision}
	for _, in := range page.Intents {
		out.Intents = append(out.Intents, intentToProto(in))
	}
	return out, nil
}

// Watch implements IntentService.Watch.
func (s *Server) Watch(req *intentv1.WatchRequest, stream intentv1.IntentService_WatchServer) error {
	f, err := filter(req.GetTenant(), req.GetStates(), req.GetLabel(), req.GetParentKey())
	if err == nil && req.GetKey() != "" {
		err = intent.ValidateKey(req.GetKey())
	}
	if err == nil && req.GetStartRevision() < 0 {
		err = intent.Invalid("start_revision", "must not be negative")
	}
	if err != nil {
		return s.fail(err)
	}
	q := intent.WatchQuery{Filter: f, Key: req.GetKey(), StartRevision: req.GetStartRevision(), NotifyCreated: req.GetCreatedNotify()}
	err = s.store.Watch(stream.Context(), q, func(e intent.WatchEvent) error {
		typ := intentv1.WatchResponse_TYPE_PUT
		switch {
		case e.Created:
			typ = intentv1.WatchResponse_TYPE_CREATED
		case e.Deleted:
			typ = intentv1.WatchResponse_TYPE_DELETED
		}
		return stream.Send(&intentv1.WatchResponse{Type: typ, Intent: intentToProto(e.Intent), Revision: e.Revision})
	})
	return s.fail(err)
}
