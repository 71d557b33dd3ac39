package server

import (
	"context"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

// Escalate implements IntentService.Escalate.
func (s *Server) Escalate(ctx context.Context, req *intentv1.EscalateRequest) (*intentv1.EscalateResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.store.Escalate(ctx, escalation(callTenant(ctx, req.GetTenant()), req))
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.EscalateResponse{Intent: intentToProto(in)}, nil
}

// Resolve implements IntentService.Resolve.
func (s *Server) Resolve(ctx context.Context, req *intentv1.ResolveRequest) (*intentv1.ResolveResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	d, err := resolution(callTenant(ctx, req.GetTenant()), req)
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

// Cancel implements IntentService.Cancel.
func (s *Server) Cancel(ctx context.Context, req *intentv1.CancelRequest) (*intentv1.CancelResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.store.Cancel(ctx, cancellation(callTenant(ctx, req.GetTenant()), req))
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.CancelResponse{Intent: intentToProto(in)}, nil
}

// List implements IntentService.List.
func (s *Server) List(ctx context.Context, req *intentv1.ListRequest) (*intentv1.ListResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	q, err := listQuery(callTenant(ctx, req.GetTenant()), req)
	if err != nil {
		return nil, s.fail(err)
	}
	page, err := s.store.List(ctx, q)
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
	ctx := stream.Context()
	q, err := watchQuery(callTenant(ctx, req.GetTenant()), req)
	if err != nil {
		return s.fail(err)
	}
	err = s.store.Watch(ctx, q, func(e intent.WatchEvent) error {
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
