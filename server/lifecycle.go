package server

import (
	"context"
	"strings"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

// Escalate implements IntentService.Escalate.
func (s *Server) Escalate(ctx context.Context, req *intentv1.EscalateRequest) (*intentv1.EscalateResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.store.Escalate(ctx, intent.Escalation{
		Tenant: tenantOr(req.GetTenant()), Key: req.GetKey(), Token: fencing.Token(req.GetToken()),
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
	if err := s.valid(req); err != nil {
		return nil, err
	}
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

// resolution returns the domain form of a ResolveRequest the rules have
// checked, after the check they leave to the server: a result with a
// COMPLETED decision only, a failure with a FAILED one only.
func resolution(req *intentv1.ResolveRequest) (*intent.Resolution, error) {
	state, ok := decisions[req.GetDecision()]
	if !ok {
		return nil, intent.Invalid("decision", "required: COMPLETED, PENDING, FAILED or CANCELLED")
	}
	d := &intent.Resolution{Tenant: tenantOr(req.GetTenant()), Key: req.GetKey(), Decision: state, Actor: req.GetActor(), Reason: req.GetReason(), Force: req.GetForce(), RequestID: req.GetRequestId(), Channel: req.GetChannel(),
		ExpectedToken: fencing.Token(req.GetExpectedToken())}
	switch state {
	case intent.StateCompleted:
		if req.GetResult() == nil {
			return nil, intent.Invalid("result", "required: what the side effect produced")
		}
		d.Result = result(req.GetResult())
	case intent.StateFailed:
		if req.GetFailure() == nil {
			return nil, intent.Invalid("failure.code", "required")
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
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.store.Cancel(ctx, intent.Cancellation{Tenant: tenantOr(req.GetTenant()), Key: req.GetKey(), Actor: req.GetActor(), Reason: req.GetReason()})
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.CancelResponse{Intent: intentToProto(in)}, nil
}

// filter returns the domain form of the filter fields List and Watch
// share, which the rules have checked but for the label's value.
func filter(tenant string, states []intentv1.State, label, parent string) (intent.Filter, error) {
	f := intent.Filter{Tenant: tenantOr(tenant), ParentKey: parent}
	for _, st := range states {
		f.States = append(f.States, intent.State(st))
	}
	if label != "" {
		name, value, _ := strings.Cut(label, "=")
		if err := labelFilter(name, value); err != nil {
			return f, err
		}
		f.Label = &intent.Label{Name: name, Value: value}
	}
	return f, nil
}

// List implements IntentService.List.
func (s *Server) List(ctx context.Context, req *intentv1.ListRequest) (*intentv1.ListResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	f, err := filter(req.GetTenant(), req.GetStates(), req.GetLabel(), req.GetParentKey())
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
	if err := s.valid(req); err != nil {
		return err
	}
	f, err := filter(req.GetTenant(), req.GetStates(), req.GetLabel(), req.GetParentKey())
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
