// Package server implements intent.v1.IntentService on top of a Store.
// Each handler validates its request, makes one domain call, and builds the
// response; errors become gRPC statuses in errors.go and nowhere else.
package server

import (
	"context"
	"log/slog"
	"time"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

// Store is what the server needs from storage. etcdstore.Store implements
// it; the server never sees etcd.
type Store interface {
	Register(ctx context.Context, reg intent.Registration) (*intent.Intent, bool, error)
	OpenSession(ctx context.Context, tenant, worker string, ttl time.Duration) (*intent.Session, error)
	CloseSession(ctx context.Context, tenant, id string) error
	Heartbeat(ctx context.Context, tenant, id string, held []intent.HeldLease) (time.Duration, error)
	Acquire(ctx context.Context, req intent.AcquireRequest) (*intent.Acquisition, error)
	Report(ctx context.Context, r intent.Report) (*intent.ReportOutcome, error)
	Get(ctx context.Context, tenant, key string) (*intent.Intent, error)
	Escalate(ctx context.Context, e intent.Escalation) (*intent.Intent, error)
	Resolve(ctx context.Context, d intent.Resolution) (*intent.Intent, bool, error)
	Cancel(ctx context.Context, c intent.Cancellation) (*intent.Intent, error)
	List(ctx context.Context, q intent.ListQuery) (*intent.Page, error)
	Watch(ctx context.Context, q intent.WatchQuery, send func(intent.WatchEvent) error) error
	SubmissionStore
}

// Server is the gRPC IntentService.
type Server struct {
	intentv1.UnimplementedIntentServiceServer
	store Store
	log   *slog.Logger
	rules *requestValidator
}

// New returns a Server backed by store. Its error means a protovalidate
// rule of intent.proto does not compile: a build defect.
func New(store Store, log *slog.Logger) (*Server, error) {
	rules, err := compiledRules()
	if err != nil {
		return nil, err
	}
	if k, ok := store.(answerKeeper); ok {
		k.KeepsAnswers()
	}
	return &Server{store: store, log: log, rules: rules}, nil
}

// answerKeeper is a store that can be told its caller keeps each replay's
// answer in the memo handed out with it (acquireResponse does), as
// etcdstore's can: it then caches a replayed final record compact at
// once, however rarely it is replayed from memory.
type answerKeeper interface{ KeepsAnswers() }

func (s *Server) fail(err error) error { return toStatus(s.log, err) }

// Register implements IntentService.Register.
func (s *Server) Register(ctx context.Context, req *intentv1.RegisterRequest) (*intentv1.RegisterResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	reg, err := registration(callTenant(ctx, req.GetTenant()), "", req)
	if err != nil {
		return nil, s.fail(err)
	}
	in, created, err := s.store.Register(ctx, *reg)
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.RegisterResponse{Intent: intentToProto(in), Created: created}, nil
}

// DeriveKey implements IntentService.DeriveKey.
func (s *Server) DeriveKey(_ context.Context, req *intentv1.DeriveKeyRequest) (*intentv1.DeriveKeyResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	resp, err := derivation(req)
	if err != nil {
		return nil, s.fail(err)
	}
	return resp, nil
}

// derivation computes DeriveKey's answer: the key of action and identity
// when either is given, the fingerprint of params when they are, each as
// Register would compute it.
func derivation(req *intentv1.DeriveKeyRequest) (*intentv1.DeriveKeyResponse, error) {
	if req.GetIdentity() == nil && req.GetParams() == nil {
		return nil, intent.Invalid("identity", "required: the fields that identify the action, for a key (or params, for a fingerprint)")
	}
	resp := &intentv1.DeriveKeyResponse{}
	if req.GetIdentity() != nil || req.GetAction() != "" {
		if len(req.GetIdentity().GetFields()) == 0 {
			return nil, intent.Invalid("identity", "required with action: the fields that identify the action")
		}
		key, canonical, err := intent.DeriveKey(req.GetAction(), req.GetIdentity().AsMap())
		if err != nil {
			return nil, err
		}
		resp.Key, resp.Canonical = key, string(canonical)
	}
	if req.GetParams() != nil {
		params, err := canonicalParams("", req.GetParams())
		if err != nil {
			return nil, err
		}
		resp.Fingerprint, resp.CanonicalParams = intent.Fingerprint(params), string(params)
	}
	return resp, nil
}

// OpenSession implements IntentService.OpenSession.
func (s *Server) OpenSession(ctx context.Context, req *intentv1.OpenSessionRequest) (*intentv1.OpenSessionResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	sess, err := s.store.OpenSession(ctx, callTenant(ctx, req.GetTenant()), req.GetWorker(), sessionTTL(req))
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.OpenSessionResponse{SessionId: sess.ID, Ttl: durationToProto(sess.TTL)}, nil
}

// CloseSession implements IntentService.CloseSession.
func (s *Server) CloseSession(ctx context.Context, req *intentv1.CloseSessionRequest) (*intentv1.CloseSessionResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	if err := s.store.CloseSession(ctx, callTenant(ctx, req.GetTenant()), req.GetSessionId()); err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.CloseSessionResponse{}, nil
}

// Acquire implements IntentService.Acquire.
func (s *Server) Acquire(ctx context.Context, req *intentv1.AcquireRequest) (*intentv1.AcquireResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	ar, err := acquireRequest(callTenant(ctx, req.GetTenant()), req)
	if err != nil {
		return nil, s.fail(err)
	}
	a, err := s.store.Acquire(ctx, *ar)
	if err != nil {
		return nil, s.fail(err)
	}
	traceAcquire(ctx, ar.Tenant, ar.Key, a)
	return acquireResponse(a), nil
}

// acquireResponse is Acquire's answer on the wire. A replay of a final
// record is converted once per version of that record and kept in the
// version's memo (intent.Memo) as its encoding (see keep): converting the
// record (its params above all) and encoding the answer were the largest
// part of a replay's own work. Every replay of the version, the first
// included, returns a stand-in that encodes to those bytes and decodes
// only the outcome (kept.response); nothing may modify an AcquireResponse
// once returned.
func acquireResponse(a *intent.Acquisition) *intentv1.AcquireResponse {
	if a.Memo != nil {
		if r, ok := keptResponse(a.Memo); ok {
			return r
		}
	}
	taken := vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE)
	if a.Outcome == intent.OutcomeExecute || a.Outcome == intent.OutcomeReconcile {
		taken = vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_LEASE_ISSUED)
	}
	r := &intentv1.AcquireResponse{
		Outcome:     outcomeToProto(a.Outcome),
		Intent:      intentToProto(a.Intent),
		Lease:       leaseToProto(a.Lease),
		ActionTaken: taken,
		Statement:   statement(a),
	}
	if a.Memo != nil {
		if k, ok := keep(a.Memo, r); ok {
			// What every later replay of the version returns, so that
			// this one's message is garbage once sent.
			return k.response()
		}
	}
	return r
}

// Heartbeat implements IntentService.Heartbeat.
func (s *Server) Heartbeat(ctx context.Context, req *intentv1.HeartbeatRequest) (*intentv1.HeartbeatResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	ttl, err := s.store.Heartbeat(ctx, callTenant(ctx, req.GetTenant()), req.GetSessionId(), heldLeases(req))
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.HeartbeatResponse{Ttl: durationToProto(ttl)}, nil
}

// Complete implements IntentService.Complete.
func (s *Server) Complete(ctx context.Context, req *intentv1.CompleteRequest) (*intentv1.CompleteResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	r, err := completion(callTenant(ctx, req.GetTenant()), req)
	if err != nil {
		return nil, s.fail(err)
	}
	out, err := s.store.Report(ctx, *r)
	if err != nil {
		return nil, s.fail(err)
	}
	taken := vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_RECORDED)
	if out.Replayed {
		taken = vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE)
	}
	return &intentv1.CompleteResponse{Intent: intentToProto(out.Intent), ActionTaken: taken}, nil
}

// MarkUnknown implements IntentService.MarkUnknown.
func (s *Server) MarkUnknown(ctx context.Context, req *intentv1.MarkUnknownRequest) (*intentv1.MarkUnknownResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.report(ctx, unknownReport(callTenant(ctx, req.GetTenant()), req))
	if err != nil {
		return nil, err
	}
	return &intentv1.MarkUnknownResponse{Intent: in}, nil
}

// Release implements IntentService.Release.
func (s *Server) Release(ctx context.Context, req *intentv1.ReleaseRequest) (*intentv1.ReleaseResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.report(ctx, releaseReport(callTenant(ctx, req.GetTenant()), req))
	if err != nil {
		return nil, err
	}
	return &intentv1.ReleaseResponse{Intent: in}, nil
}

// report hands a fenced report without children to the store and answers
// with the intent as it is after it.
func (s *Server) report(ctx context.Context, r *intent.Report) (*intentv1.Intent, error) {
	out, err := s.store.Report(ctx, *r)
	if err != nil {
		return nil, s.fail(err)
	}
	return intentToProto(out.Intent), nil
}

// Fail implements IntentService.Fail.
func (s *Server) Fail(ctx context.Context, req *intentv1.FailRequest) (*intentv1.FailResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.report(ctx, failReport(callTenant(ctx, req.GetTenant()), req))
	if err != nil {
		return nil, err
	}
	return &intentv1.FailResponse{Intent: in}, nil
}

// Get implements IntentService.Get.
func (s *Server) Get(ctx context.Context, req *intentv1.GetRequest) (*intentv1.GetResponse, error) {
	if err := s.valid(req); err != nil {
		return nil, err
	}
	in, err := s.store.Get(ctx, callTenant(ctx, req.GetTenant()), req.GetKey())
	if err != nil {
		return nil, s.fail(err)
	}
	return &intentv1.GetResponse{Intent: intentToProto(in)}, nil
}
