package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/internal/testing/intentdtest"
	"github.com/intentd/intentd/server"
)

// serve starts one intentd replica on the etcd member e: a Store, the
// IntentService on a real gRPC server listening on a loopback port, and a
// client connected to it over TCP. Everything stops when the test ends.
// Two replicas on one member share nothing but etcd, as two intentd
// processes would.
func serve(t *testing.T, e *etcdtest.Server) intentv1.IntentServiceClient {
	t.Helper()
	return serveWith(t, e, etcdstore.DefaultConfig())
}

// serveWith is serve with the store configured by cfg.
func serveWith(t *testing.T, e *etcdtest.Server, cfg etcdstore.Config) intentv1.IntentServiceClient {
	t.Helper()
	_, c := serveStore(t, e, cfg)
	return c
}

// serveStore is serveWith that also returns the replica's Store, for tests
// that drive it directly (a janitor pass), and passes opts to the gRPC
// server. The server decodes requests as intentd's does (RequestCodec,
// DecodedService, DecodeInterceptors ahead of the interceptors in opts).
func serveStore(t *testing.T, e *etcdtest.Server, cfg etcdstore.Config, opts ...grpc.ServerOption) (*etcdstore.Store, intentv1.IntentServiceClient) {
	t.Helper()
	store, conn := serveConn(t, e, cfg, opts...)
	return store, intentv1.NewIntentServiceClient(conn)
}

// serveConn is serveStore returning the client connection itself, for
// tests that send raw bytes.
func serveConn(t testing.TB, e *etcdtest.Server, cfg etcdstore.Config, opts ...grpc.ServerOption) (*etcdstore.Store, *grpc.ClientConn) {
	t.Helper()
	in := intentdtest.Serve(t, e, cfg, opts...)
	return in.Store, in.Dial(t)
}

// newClient starts a fresh embedded etcd and one intentd replica on it.
func newClient(t *testing.T) intentv1.IntentServiceClient {
	t.Helper()
	return serve(t, etcdtest.Start(t))
}

// fx holds what the steps of one (sub)test share; its helpers stop the test
// when a step that is setup, not the subject, fails.
type fx struct {
	t   *testing.T
	ctx context.Context
	c   intentv1.IntentServiceClient
}

func newFx(t *testing.T, c intentv1.IntentServiceClient) *fx {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return &fx{t: t, ctx: ctx, c: c}
}

// lamp is approved terms for buying desk lamps.
func lamp(quantity float64) map[string]any {
	return map[string]any{
		"item": "desk lamp", "quantity": quantity, "merchant": "M",
		"max_amount": "89.00", "currency": "EUR",
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatalf("structpb.NewStruct(%v): %v", m, err)
	}
	return s
}

func fingerprintOf(t *testing.T, m map[string]any) string {
	t.Helper()
	b, err := intent.Canonical(m)
	if err != nil {
		t.Fatalf("intent.Canonical(%v): %v", m, err)
	}
	return intent.Fingerprint(b)
}

func (f *fx) register(key string, params map[string]any) *intentv1.Intent {
	f.t.Helper()
	resp, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, params)})
	if err != nil {
		f.t.Fatalf("Register(%q): %v", key, err)
	}
	return resp.GetIntent()
}

func (f *fx) session(worker string) string {
	f.t.Helper()
	resp, err := f.c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{Worker: worker})
	if err != nil {
		f.t.Fatalf("OpenSession(%q): %v", worker, err)
	}
	return resp.GetSessionId()
}

func (f *fx) acquire(key, session, requestID string) *intentv1.AcquireResponse {
	f.t.Helper()
	resp, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: session, RequestId: requestID})
	if err != nil {
		f.t.Fatalf("Acquire(%q, session %s, request %s): %v", key, session, requestID, err)
	}
	return resp
}

// lease acquires key for a new session and insists on outcome want; it
// returns the session and the lease's token.
func (f *fx) lease(key, worker string, want intentv1.Outcome) (string, uint64) {
	f.t.Helper()
	sess := f.session(worker)
	resp := f.acquire(key, sess, worker+"-req")
	if got := resp.GetOutcome(); got != want {
		f.t.Fatalf("Acquire(%q) by %s: outcome %v, want %v", key, worker, got, want)
	}
	if resp.GetLease().GetToken() == 0 {
		f.t.Fatalf("Acquire(%q) by %s: lease without token: %v", key, worker, resp.GetLease())
	}
	return sess, resp.GetLease().GetToken()
}

func (f *fx) complete(key string, token uint64, res *intentv1.Result) *intentv1.CompleteResponse {
	f.t.Helper()
	resp, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: token, Result: res})
	if err != nil {
		f.t.Fatalf("Complete(%q, %d): %v", key, token, err)
	}
	return resp
}

func (f *fx) markUnknown(key string, token uint64) {
	f.t.Helper()
	if _, err := f.c.MarkUnknown(f.ctx, &intentv1.MarkUnknownRequest{Key: key, Token: token, Reason: "provider timeout"}); err != nil {
		f.t.Fatalf("MarkUnknown(%q, %d): %v", key, token, err)
	}
}

// get returns the intent at key, or nil when there is none.
func (f *fx) get(key string) *intentv1.Intent {
	f.t.Helper()
	resp, err := f.c.Get(f.ctx, &intentv1.GetRequest{Key: key})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		f.t.Fatalf("Get(%q): %v", key, err)
	}
	return resp.GetIntent()
}

// details is what a status error carries for a program to switch on.
type details struct {
	code  codes.Code
	info  *errdetails.ErrorInfo
	field []string // BadRequest field violations
}

func detailsOf(t *testing.T, err error) details {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a gRPC status", err)
	}
	d := details{code: st.Code()}
	for _, x := range st.Details() {
		switch x := x.(type) {
		case *errdetails.ErrorInfo:
			if d.info != nil {
				t.Errorf("status %v carries more than one ErrorInfo", st)
			}
			d.info = x
		case *errdetails.BadRequest:
			for _, v := range x.GetFieldViolations() {
				d.field = append(d.field, v.GetField())
			}
		case error:
			t.Errorf("status detail does not decode: %v", x)
		}
	}
	return d
}

// prep is what an error case's setup left behind for its call.
type prep struct {
	session     string
	token       uint64 // the caller's token
	newer       uint64 // a newer token, where one was issued
	fingerprint string // the registered fingerprint, where registered
}

// Setups for the error cases: the intent at key in a given state.
func nothing(*fx, string) prep { return prep{} }

func pending(f *fx, key string) prep {
	in := f.register(key, lamp(1))
	return prep{session: f.session("w1"), fingerprint: in.GetFingerprint()}
}

func held(f *fx, key string) prep {
	p := pending(f, key)
	resp := f.acquire(key, p.session, "r1")
	p.token = resp.GetLease().GetToken()
	return p
}

func completed(f *fx, key string) prep {
	p := held(f, key)
	f.complete(key, p.token, &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-1"}})
	return p
}

// superseded leaves key IN_PROGRESS under a newer token than p.token: the
// first holder marked it unknown and a second worker acquired it.
func superseded(f *fx, key string) prep {
	p := held(f, key)
	f.markUnknown(key, p.token)
	_, p.newer = f.lease(key, "w2", intentv1.Outcome_OUTCOME_RECONCILE)
	return p
}

// effect is what an erring call may leave behind on the intent it addresses.
type effect int

const (
	// untouched: no write at all; the record keeps its revision (or stays
	// absent).
	untouched effect = iota
	// evidence: the state is kept, and the call is recorded in history as
	// a report that was not accepted.
	evidence
)

func TestErrorMapping(t *testing.T) {
	c := newClient(t)
	otherFP := fingerprintOf(t, lamp(2))
	manyLabels := map[string]string{}
	for i := range server.MaxLabels + 1 {
		manyLabels[fmt.Sprintf("l%d", i)] = "v"
	}
	tests := []struct {
		name   string
		setup  func(f *fx, key string) prep
		call   func(f *fx, key string, p prep) error
		code   codes.Code
		reason string
		field  string                         // for INVALID_FIELD: the field named
		meta   func(p prep) map[string]string // ErrorInfo metadata that must be there
		effect effect
	}{
		{
			name:  "Register without key",
			setup: nothing,
			call: func(f *fx, _ string, _ prep) error {
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Params: mustStruct(f.t, lamp(1))})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "key",
		},
		{
			name:  "Register with bad tenant",
			setup: nothing,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Tenant: "Bad Tenant", Key: key, Params: mustStruct(f.t, lamp(1))})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "tenant",
		},
		{
			name:  "Register with empty params",
			setup: pending,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: &structpb.Struct{}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "params",
		},
		{
			name:  "Register with too many labels",
			setup: pending,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1)), Labels: manyLabels})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "labels",
		},
		{
			name:  "Register with bad parent key",
			setup: pending,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1)), ParentKey: "no spaces allowed"})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "parent_key",
		},
		{
			name:  "OpenSession with ttl 1s",
			setup: nothing,
			call: func(f *fx, _ string, _ prep) error {
				_, err := f.c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(time.Second)})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "ttl",
		},
		{
			name:  "OpenSession without worker",
			setup: nothing,
			call: func(f *fx, _ string, _ prep) error {
				_, err := f.c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "worker",
		},
		{
			name:  "Acquire without request_id",
			setup: pending,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "request_id",
		},
		{
			name:  "Acquire with empty register.params",
			setup: pending,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{
					Key: key, SessionId: p.session, RequestId: "r1",
					Register: &intentv1.RegisterRequest{Key: key},
				})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "register.params",
		},
		{
			name:  "Acquire with malformed register.key",
			setup: pending,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{
					Key: key, SessionId: p.session, RequestId: "r1",
					Register: &intentv1.RegisterRequest{Key: "bad key!", Params: mustStruct(f.t, lamp(1))},
				})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "register.key",
		},
		{
			name:  "Acquire with register for another key",
			setup: pending,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{
					Key: key, SessionId: p.session, RequestId: "r1",
					Register: &intentv1.RegisterRequest{Key: key + "-other", Params: mustStruct(f.t, lamp(1))},
				})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "register",
		},
		{
			name:  "Complete with token 0",
			setup: held,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Result: &intentv1.Result{Payload: []byte("ok")}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "token",
		},
		{
			name:  "Complete with a token never issued",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token + 1000, Result: &intentv1.Result{Payload: []byte("ok")}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "token",
		},
		{
			name:  "Complete without result",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "result",
		},
		{
			name:  "Complete with oversize payload",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: &intentv1.Result{Payload: make([]byte, server.MaxPayloadBytes+1)}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "result.payload",
		},
		{
			name:  "Fail without failure code",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Fail(f.ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Message: "declined"}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "failure.code",
		},
		{
			name:  "Heartbeat naming a malformed lease key",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Heartbeat(f.ctx, &intentv1.HeartbeatRequest{SessionId: p.session, Leases: []*intentv1.HeldLease{
					{Key: key, Token: p.token}, {Key: "bad key!", Token: p.token},
				}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "leases[1].key",
		},
		{
			name:  "Heartbeat naming a lease without token",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Heartbeat(f.ctx, &intentv1.HeartbeatRequest{SessionId: p.session, Leases: []*intentv1.HeldLease{{Key: key}}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "leases[0].token",
		},
		{
			name:  "Get of a missing key",
			setup: nothing,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Get(f.ctx, &intentv1.GetRequest{Key: key})
				return err
			},
			code: codes.NotFound, reason: "INTENT_NOT_FOUND",
		},
		{
			name:  "Complete of a missing key",
			setup: nothing,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: 7, Result: &intentv1.Result{Payload: []byte("ok")}})
				return err
			},
			code: codes.NotFound, reason: "INTENT_NOT_FOUND",
		},
		{
			name:  "Acquire with a made-up session",
			setup: pending,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: "deadbeef", RequestId: "r1"})
				return err
			},
			code: codes.NotFound, reason: "SESSION_NOT_FOUND",
		},
		{
			name:  "Get from another tenant",
			setup: pending,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Get(f.ctx, &intentv1.GetRequest{Tenant: "acme", Key: key})
				return err
			},
			code: codes.NotFound, reason: "INTENT_NOT_FOUND",
		},
		{
			name:  "Acquire with another tenant's session",
			setup: pending,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Tenant: "acme", Key: key, SessionId: p.session, RequestId: "r1"})
				return err
			},
			code: codes.NotFound, reason: "SESSION_NOT_FOUND",
		},
		{
			name:  "CloseSession of a made-up session",
			setup: nothing,
			call: func(f *fx, _ string, _ prep) error {
				_, err := f.c.CloseSession(f.ctx, &intentv1.CloseSessionRequest{SessionId: "deadbeef"})
				return err
			},
			code: codes.NotFound, reason: "SESSION_NOT_FOUND",
		},
		{
			name:  "Register again with another quantity",
			setup: pending,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(2))})
				return err
			},
			code: codes.FailedPrecondition, reason: "FINGERPRINT_MISMATCH",
			meta: func(p prep) map[string]string {
				return map[string]string{"registered_fingerprint": p.fingerprint, "request_fingerprint": otherFP}
			},
		},
		{
			name:  "Acquire with a wrong expected_fingerprint",
			setup: pending,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session, RequestId: "r1", ExpectedFingerprint: strings.Repeat("0", 64)})
				return err
			},
			code: codes.FailedPrecondition, reason: "FINGERPRINT_MISMATCH",
			meta: func(p prep) map[string]string {
				return map[string]string{"registered_fingerprint": p.fingerprint, "request_fingerprint": strings.Repeat("0", 64)}
			},
		},
		{
			name:  "Acquire registering another quantity",
			setup: pending,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{
					Key: key, SessionId: p.session, RequestId: "r1",
					Register: &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(2))},
				})
				return err
			},
			code: codes.FailedPrecondition, reason: "FINGERPRINT_MISMATCH",
			meta: func(p prep) map[string]string {
				return map[string]string{"registered_fingerprint": p.fingerprint, "request_fingerprint": otherFP}
			},
		},
		{
			name:  "Complete under a superseded token",
			setup: superseded,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-9"}}})
				return err
			},
			code: codes.Aborted, reason: "STALE_TOKEN",
			meta: func(p prep) map[string]string {
				return map[string]string{"current_token": fmt.Sprint(p.newer), "token": fmt.Sprint(p.token)}
			},
			effect: evidence,
		},
		{
			name:  "Release under a superseded token",
			setup: superseded,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Release(f.ctx, &intentv1.ReleaseRequest{Key: key, Token: p.token, Reason: "no order found"})
				return err
			},
			code: codes.Aborted, reason: "STALE_TOKEN",
			meta: func(p prep) map[string]string {
				return map[string]string{"current_token": fmt.Sprint(p.newer), "token": fmt.Sprint(p.token)}
			},
			effect: evidence,
		},
		{
			name:  "MarkUnknown after Complete under the same token",
			setup: completed,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.MarkUnknown(f.ctx, &intentv1.MarkUnknownRequest{Key: key, Token: p.token})
				return err
			},
			code: codes.FailedPrecondition, reason: "INVALID_TRANSITION",
			meta: func(prep) map[string]string { return map[string]string{"state": "COMPLETED"} },
		},
		{
			name:  "Release after Complete under the same token",
			setup: completed,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Release(f.ctx, &intentv1.ReleaseRequest{Key: key, Token: p.token})
				return err
			},
			code: codes.FailedPrecondition, reason: "INVALID_TRANSITION",
			meta: func(prep) map[string]string { return map[string]string{"state": "COMPLETED"} },
		},
		{
			name:  "Fail after Complete under the same token",
			setup: completed,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Fail(f.ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: "card_declined"}})
				return err
			},
			code: codes.FailedPrecondition, reason: "INVALID_TRANSITION",
			meta: func(prep) map[string]string { return map[string]string{"state": "COMPLETED"} },
		},
		{
			name: "Fail after Release under the same token",
			setup: func(f *fx, key string) prep {
				p := held(f, key)
				if _, err := f.c.Release(f.ctx, &intentv1.ReleaseRequest{Key: key, Token: p.token, Reason: "no order found"}); err != nil {
					f.t.Fatalf("Release: %v", err)
				}
				return p
			},
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Fail(f.ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: "card_declined"}})
				return err
			},
			code: codes.FailedPrecondition, reason: "INVALID_TRANSITION",
			meta: func(prep) map[string]string { return map[string]string{"state": "PENDING"} },
		},
		{
			name:  "Complete twice with other external_refs",
			setup: completed,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-2"}}})
				return err
			},
			code: codes.FailedPrecondition, reason: "RESULT_MISMATCH",
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, c)
			key := fmt.Sprintf("err-%d", i)
			p := tc.setup(f, key)
			before := f.get(key)

			err := tc.call(f, key, p)
			if err == nil {
				t.Fatalf("call succeeded, want %v %s", tc.code, tc.reason)
			}
			d := detailsOf(t, err)
			if d.code != tc.code {
				t.Errorf("code = %v (%v), want %v", d.code, err, tc.code)
			}
			if d.info == nil {
				t.Fatalf("no ErrorInfo in %v", err)
			}
			if got := d.info.GetDomain(); got != server.ErrorDomain {
				t.Errorf("ErrorInfo.domain = %q, want %q", got, server.ErrorDomain)
			}
			if got := d.info.GetReason(); got != tc.reason {
				t.Errorf("ErrorInfo.reason = %q (%v), want %q", got, err, tc.reason)
			}
			if tc.field != "" {
				if got := d.info.GetMetadata()["field"]; got != tc.field {
					t.Errorf("ErrorInfo.metadata[field] = %q (%v), want %q", got, err, tc.field)
				}
				if len(d.field) != 1 || d.field[0] != tc.field {
					t.Errorf("BadRequest fields = %q, want [%q]", d.field, tc.field)
				}
			}
			if tc.meta != nil {
				for k, want := range tc.meta(p) {
					if got, ok := d.info.GetMetadata()[k]; !ok || got != want {
						t.Errorf("ErrorInfo.metadata[%s] = %q (present %t), want %q", k, got, ok, want)
					}
				}
			}

			after := f.get(key)
			switch {
			case before == nil && after != nil:
				t.Errorf("the call created %q: %v", key, after)
			case before == nil:
			case after == nil:
				t.Errorf("the call removed %q", key)
			case after.GetState() != before.GetState():
				t.Errorf("state after the call = %v, want %v as before", after.GetState(), before.GetState())
			case tc.effect == untouched && after.GetRevision() != before.GetRevision():
				t.Errorf("revision after the call = %d, want %d as before: a refused call wrote", after.GetRevision(), before.GetRevision())
			case tc.effect == evidence:
				if !hasEntry(after, func(e *intentv1.HistoryEntry) bool { return e.GetToken() == p.token && !e.GetAccepted() }) {
					t.Errorf("history has no unaccepted entry under token %d: %v", p.token, after.GetHistory())
				}
				if got := after.GetLease().GetToken(); got != p.newer {
					t.Errorf("lease token after the call = %d, want %d as before", got, p.newer)
				}
			}
		})
	}
}

func hasEntry(in *intentv1.Intent, match func(*intentv1.HistoryEntry) bool) bool {
	for _, e := range in.GetHistory() {
		if match(e) {
			return true
		}
	}
	return false
}

// TestRegisterFingerprintIsCanonical registers params and then the same
// terms spelled differently: the second call finds the first intent
// (created=false), and the fingerprint is the SHA-256 of the canonical form
// intent.Canonical computes locally.
func TestRegisterFingerprintIsCanonical(t *testing.T) {
	c := newClient(t)
	tests := []struct {
		name          string
		first, second map[string]any
	}{
		{"integer and float", map[string]any{"quantity": 40}, map[string]any{"quantity": 40.0}},
		{"exponent", map[string]any{"limit": 100}, map[string]any{"limit": 1e2}},
		{"negative zero", map[string]any{"discount": 0}, map[string]any{"discount": math.Copysign(0, -1)}},
		{
			"nested",
			map[string]any{"item": map[string]any{"sku": "L-1", "color": "black"}, "quantity": 1},
			map[string]any{"quantity": 1.0, "item": map[string]any{"color": "black", "sku": "L-1"}},
		},
		{"whole terms", lamp(40), lamp(40.0)},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, c)
			key := fmt.Sprintf("fp-%d", i)
			canonical, err := intent.Canonical(tc.first)
			if err != nil {
				t.Fatalf("intent.Canonical(%v): %v", tc.first, err)
			}
			want := intent.Fingerprint(canonical)

			first, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, tc.first)})
			if err != nil {
				t.Fatalf("first Register: %v", err)
			}
			if !first.GetCreated() {
				t.Errorf("first Register: created = false, want true")
			}
			second, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, tc.second)})
			if err != nil {
				t.Fatalf("second Register: %v", err)
			}
			if second.GetCreated() {
				t.Errorf("second Register: created = true, want false (same terms)")
			}
			for _, r := range []*intentv1.RegisterResponse{first, second} {
				if got := r.GetIntent().GetFingerprint(); got != want {
					t.Errorf("fingerprint = %s, want %s (SHA-256 of %s)", got, want, canonical)
				}
			}
			if got, want := second.GetIntent().GetRevision(), first.GetIntent().GetRevision(); got != want {
				t.Errorf("second Register revision = %d, want %d: an idempotent Register wrote", got, want)
			}
			// The stored params read back to the same canonical form.
			back, err := intent.Canonical(f.get(key).GetParams().AsMap())
			if err != nil {
				t.Fatalf("canonical of stored params: %v", err)
			}
			if !bytes.Equal(back, canonical) {
				t.Errorf("stored params canonicalize to %s, want %s", back, canonical)
			}
		})
	}
}

// TestDeriveKey sends one identity spelled as different JSON texts (key
// order, spacing, number spelling), as clients in other languages would:
// every spelling yields the same key, which is the SHA-256 of the canonical
// text the server returns.
func TestDeriveKey(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	const wantCanonical = `{"action":"purchase","identity":{"cart":{"lines":2,"sku":"L-1"},"customer":"c-17","rma":"R-5"}}`
	spellings := []string{
		`{"customer":"c-17","rma":"R-5","cart":{"sku":"L-1","lines":2}}`,
		`{"rma":"R-5","cart":{"lines":2.0,"sku":"L-1"},"customer":"c-17"}`,
		`{ "cart" : { "lines" : 2e0 , "sku" : "L-1" } , "customer" : "c-17" , "rma" : "R-5" }`,
	}
	sum := sha256.Sum256([]byte(wantCanonical))
	wantKey := hex.EncodeToString(sum[:])
	for _, js := range spellings {
		identity := &structpb.Struct{}
		if err := protojson.Unmarshal([]byte(js), identity); err != nil {
			t.Fatalf("protojson.Unmarshal(%s): %v", js, err)
		}
		resp, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Action: "purchase", Identity: identity})
		if err != nil {
			t.Fatalf("DeriveKey(%s): %v", js, err)
		}
		if got := resp.GetCanonical(); got != wantCanonical {
			t.Errorf("DeriveKey(%s).canonical = %s, want %s", js, got, wantCanonical)
		}
		if got := resp.GetKey(); got != wantKey {
			t.Errorf("DeriveKey(%s).key = %s, want %s", js, got, wantKey)
		}
		local, _, err := intent.DeriveKey("purchase", identity.AsMap())
		if err != nil || local != resp.GetKey() {
			t.Errorf("intent.DeriveKey(%s) = %s, %v; want %s as the server derived", js, local, err, resp.GetKey())
		}
	}

	other, err := c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{Action: "purchase", Identity: mustStruct(t, map[string]any{"customer": "c-17", "rma": "R-6"})})
	if err != nil {
		t.Fatalf("DeriveKey(other rma): %v", err)
	}
	if other.GetKey() == wantKey {
		t.Errorf("DeriveKey of another rma = %s, the same key as R-5", other.GetKey())
	}

	invalid := []struct {
		name  string
		req   *intentv1.DeriveKeyRequest
		field string
	}{
		{"no identity", &intentv1.DeriveKeyRequest{Action: "purchase"}, "identity"},
		{"empty identity", &intentv1.DeriveKeyRequest{Action: "purchase", Identity: &structpb.Struct{}}, "identity"},
		{"no action", &intentv1.DeriveKeyRequest{Identity: mustStruct(t, map[string]any{"customer": "c-17"})}, "action"},
		{"bad action", &intentv1.DeriveKeyRequest{Action: "buy now", Identity: mustStruct(t, map[string]any{"customer": "c-17"})}, "action"},
	}
	for _, tc := range invalid {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.DeriveKey(f.ctx, tc.req)
			if err == nil {
				t.Fatalf("DeriveKey succeeded, want INVALID_FIELD %q", tc.field)
			}
			d := detailsOf(t, err)
			if d.code != codes.InvalidArgument || d.info.GetReason() != "INVALID_FIELD" || d.info.GetDomain() != server.ErrorDomain {
				t.Errorf("error = %v %s/%s, want %v %s/%s", d.code, d.info.GetDomain(), d.info.GetReason(), codes.InvalidArgument, server.ErrorDomain, "INVALID_FIELD")
			}
			if len(d.field) != 1 || d.field[0] != tc.field {
				t.Errorf("BadRequest fields = %q, want [%q]", d.field, tc.field)
			}
		})
	}
}

// TestAcquireStatementsAndReplay follows one intent from EXECUTE to
// COMPLETED, then replays it from the replica that completed it (which may
// answer from memory) and from a second replica (which must read etcd):
// every replay says what happened, takes no action, and returns the
// completed result byte for byte.
func TestAcquireStatementsAndReplay(t *testing.T) {
	e := etcdtest.Start(t)
	a, b := serve(t, e), serve(t, e)
	f := newFx(t, a)
	const key = "replay"
	f.register(key, lamp(1))
	sess := f.session("w1")

	exec := f.acquire(key, sess, "r1")
	if got, want := exec.GetOutcome(), intentv1.Outcome_OUTCOME_EXECUTE; got != want {
		t.Fatalf("Acquire: outcome %v, want %v", got, want)
	}
	if got, want := exec.GetActionTaken(), "lease_issued"; got != want {
		t.Errorf("Acquire: action_taken %q, want %q", got, want)
	}
	if got := exec.GetStatement().GetText(); !strings.HasPrefix(got, "execute") || !strings.Contains(got, key) {
		t.Errorf("Acquire: statement %q, want one starting with execute and naming %q", got, key)
	}
	token := exec.GetLease().GetToken()
	if token == 0 || exec.GetLease().GetMode() != intentv1.LeaseMode_LEASE_MODE_EXECUTE || !exec.GetLease().GetLive() {
		t.Errorf("Acquire: lease %v, want a live EXECUTE lease with a token", exec.GetLease())
	}
	retry := f.acquire(key, sess, "r1")
	if got := retry.GetLease().GetToken(); retry.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE || got != token {
		t.Errorf("Acquire retried with the same request id: %v token %d, want EXECUTE token %d", retry.GetOutcome(), got, token)
	}

	sent := &intentv1.Result{
		Payload:      []byte{0x00, 0xff, 0xfe, '{', '"', '\n', 0x80, 0x00},
		ExternalRefs: map[string]string{"supplier_order_id": "SO-1042", "payment_id": "pi_3"},
	}
	done := f.complete(key, token, sent)
	if got, want := done.GetActionTaken(), "recorded"; got != want {
		t.Errorf("Complete: action_taken %q, want %q", got, want)
	}
	if !proto.Equal(done.GetIntent().GetResult(), sent) {
		t.Errorf("Complete: result %v, want %v", done.GetIntent().GetResult(), sent)
	}
	again := f.complete(key, token, sent)
	if got, want := again.GetActionTaken(), "none"; got != want {
		t.Errorf("Complete retried: action_taken %q, want %q", got, want)
	}

	var first *intentv1.Result
	replicas := []struct {
		name string
		c    intentv1.IntentServiceClient
	}{{"same replica", a}, {"other replica", b}}
	for _, r := range replicas {
		rf := newFx(t, r.c)
		rsess := rf.session("w2")
		for i := range 3 {
			got := rf.acquire(key, rsess, fmt.Sprintf("replay-%d", i))
			where := fmt.Sprintf("%s, replay %d", r.name, i)
			if got.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
				t.Errorf("%s: outcome %v, want %v", where, got.GetOutcome(), intentv1.Outcome_OUTCOME_COMPLETED)
			}
			if got.GetActionTaken() != "none" {
				t.Errorf("%s: action_taken %q, want %q", where, got.GetActionTaken(), "none")
			}
			if s := got.GetStatement().GetText(); !strings.HasPrefix(s, "already_completed") || !strings.Contains(s, "action_taken: none") || !strings.Contains(s, "SO-1042") {
				t.Errorf("%s: statement %q, want already_completed … SO-1042 … action_taken: none", where, s)
			}
			if got.GetLease() != nil {
				t.Errorf("%s: lease %v, want none", where, got.GetLease())
			}
			res := got.GetIntent().GetResult()
			if !bytes.Equal(res.GetPayload(), sent.GetPayload()) {
				t.Errorf("%s: payload %x, want %x", where, res.GetPayload(), sent.GetPayload())
			}
			if first == nil {
				first = res
			}
			if !proto.Equal(res, first) || !proto.Equal(res, sent) {
				t.Errorf("%s: result %v, want %v as completed and first replayed", where, res, sent)
			}
		}
	}
}

// TestHeartbeatFencing heartbeats naming a lease under the current, a
// superseded and a never-issued token: only the current one is accepted,
// the superseded one is kept as evidence and changes nothing.
func TestHeartbeatFencing(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	const key = "heartbeat"
	f.register(key, lamp(1))
	s1, t1 := f.lease(key, "w1", intentv1.Outcome_OUTCOME_EXECUTE)
	f.markUnknown(key, t1)
	s2, t2 := f.lease(key, "w2", intentv1.Outcome_OUTCOME_RECONCILE)
	if t2 <= t1 {
		t.Fatalf("reconcile token %d, want more than %d", t2, t1)
	}

	tests := []struct {
		name    string
		session string
		token   uint64
		code    codes.Code
		reason  string
		meta    map[string]string
	}{
		{"current token", s2, t2, codes.OK, "", nil},
		{"superseded token", s1, t1, codes.Aborted, "STALE_TOKEN", map[string]string{"current_token": fmt.Sprint(t2)}},
		{"superseded token again", s1, t1, codes.Aborted, "STALE_TOKEN", map[string]string{"current_token": fmt.Sprint(t2)}},
		{"token never issued", s2, t2 + 1000, codes.InvalidArgument, "INVALID_FIELD", map[string]string{"field": "leases[0].token"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Heartbeat(f.ctx, &intentv1.HeartbeatRequest{
				SessionId: tc.session,
				Leases:    []*intentv1.HeldLease{{Key: key, Token: tc.token}},
			})
			if got := status.Code(err); got != tc.code {
				t.Fatalf("Heartbeat: code %v (%v), want %v", got, err, tc.code)
			}
			if err == nil {
				return
			}
			d := detailsOf(t, err)
			if d.info.GetDomain() != server.ErrorDomain || d.info.GetReason() != tc.reason {
				t.Errorf("ErrorInfo %s/%s, want %s/%s", d.info.GetDomain(), d.info.GetReason(), server.ErrorDomain, tc.reason)
			}
			for k, want := range tc.meta {
				if got := d.info.GetMetadata()[k]; got != want {
					t.Errorf("ErrorInfo.metadata[%s] = %q, want %q", k, got, want)
				}
			}
		})
	}

	in := f.get(key)
	if in.GetState() != intentv1.State_STATE_IN_PROGRESS || in.GetLease().GetToken() != t2 || !in.GetLease().GetLive() {
		t.Errorf("after heartbeats: %v lease %v, want IN_PROGRESS under live token %d", in.GetState(), in.GetLease(), t2)
	}
	var stale []*intentv1.HistoryEntry
	for _, e := range in.GetHistory() {
		if e.GetKind() == intentv1.HistoryEntry_KIND_HEARTBEAT {
			stale = append(stale, e)
		}
	}
	if len(stale) != 1 {
		t.Fatalf("history has %d KIND_HEARTBEAT entries, want 1 (the superseded token, once): %v", len(stale), in.GetHistory())
	}
	if e := stale[0]; e.GetAccepted() || e.GetToken() != t1 || e.GetSessionId() != s1 {
		t.Errorf("heartbeat entry: accepted %t token %d session %s, want accepted false token %d session %s", e.GetAccepted(), e.GetToken(), e.GetSessionId(), t1, s1)
	}
}

// TestCloseSessionLeavesUnknown closes the session of a worker that holds an
// intent: the intent reads as UNKNOWN, never as PENDING, and the next worker
// gets RECONCILE under a higher token, never EXECUTE.
func TestCloseSessionLeavesUnknown(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	const key = "close"
	f.register(key, lamp(1))
	s1, t1 := f.lease(key, "w1", intentv1.Outcome_OUTCOME_EXECUTE)
	if got := f.get(key); got.GetState() != intentv1.State_STATE_IN_PROGRESS || !got.GetLease().GetLive() {
		t.Fatalf("before close: %v lease %v, want IN_PROGRESS with a live lease", got.GetState(), got.GetLease())
	}

	if _, err := c.CloseSession(f.ctx, &intentv1.CloseSessionRequest{SessionId: s1}); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	got := f.get(key)
	if got.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Errorf("after close: state %v, want %v", got.GetState(), intentv1.State_STATE_UNKNOWN)
	}
	if l := got.GetLease(); l.GetLive() || l.GetToken() != t1 {
		t.Errorf("after close: lease %v, want the lapsed lease under token %d", l, t1)
	}

	s2 := f.session("w2")
	next := f.acquire(key, s2, "r1")
	if got, want := next.GetOutcome(), intentv1.Outcome_OUTCOME_RECONCILE; got != want {
		t.Fatalf("Acquire after close: outcome %v, want %v", got, want)
	}
	if got := next.GetLease(); got.GetToken() <= t1 || got.GetMode() != intentv1.LeaseMode_LEASE_MODE_RECONCILE || got.GetSessionId() != s2 {
		t.Errorf("Acquire after close: lease %v, want RECONCILE for %s with a token above %d", got, s2, t1)
	}
	if s := next.GetStatement().GetText(); !strings.HasPrefix(s, "reconcile") || next.GetActionTaken() != "lease_issued" {
		t.Errorf("Acquire after close: statement %q action_taken %q, want reconcile… and lease_issued", s, next.GetActionTaken())
	}
	in := f.get(key)
	if !hasEntry(in, func(e *intentv1.HistoryEntry) bool {
		return e.GetKind() == intentv1.HistoryEntry_KIND_LEASE_LAPSED && e.GetToken() == t1
	}) {
		t.Errorf("history has no KIND_LEASE_LAPSED entry for token %d: %v", t1, in.GetHistory())
	}

	// The closed session is gone for good.
	_, err := c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: s1, RequestId: "r2"})
	if d := detailsOf(t, err); d.code != codes.NotFound || d.info.GetReason() != "SESSION_NOT_FOUND" {
		t.Errorf("Acquire with the closed session: %v, want NOT_FOUND %s", err, "SESSION_NOT_FOUND")
	}
}

// TestReplayedReportShowsCurrentState retries a MarkUnknown that was
// accepted, after a newer lease was issued to another live worker. Whether
// the retry is answered as a replay or refused as stale, it must not
// describe the intent as something it is not: the intent is IN_PROGRESS
// under the newer, live lease, as Get shows.
func TestReplayedReportShowsCurrentState(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	const key = "replayed-report"
	f.register(key, lamp(1))
	_, t1 := f.lease(key, "w1", intentv1.Outcome_OUTCOME_EXECUTE)
	f.markUnknown(key, t1)
	_, t2 := f.lease(key, "w2", intentv1.Outcome_OUTCOME_RECONCILE)
	if got := f.get(key); got.GetState() != intentv1.State_STATE_IN_PROGRESS || got.GetLease().GetToken() != t2 {
		t.Fatalf("Get: %v under token %d, want IN_PROGRESS under %d", got.GetState(), got.GetLease().GetToken(), t2)
	}

	resp, err := c.MarkUnknown(f.ctx, &intentv1.MarkUnknownRequest{Key: key, Token: t1, Reason: "provider timeout"})
	if err != nil {
		if d := detailsOf(t, err); d.code != codes.Aborted || d.info.GetReason() != "STALE_TOKEN" {
			t.Fatalf("MarkUnknown retried: %v, want success (a replay) or ABORTED %s", err, "STALE_TOKEN")
		}
		return
	}
	in := resp.GetIntent()
	if in.GetState() != intentv1.State_STATE_IN_PROGRESS || in.GetLease().GetToken() != t2 || !in.GetLease().GetLive() {
		t.Errorf("MarkUnknown retried: intent %v with lease token %d live %t, want IN_PROGRESS under live token %d as Get shows",
			in.GetState(), in.GetLease().GetToken(), in.GetLease().GetLive(), t2)
	}
}

// TestStoreUnavailable stops etcd under a running replica: calls fail with
// UNAVAILABLE / STORE_UNAVAILABLE (retrying is safe) once the store's
// operation timeout passes, and the etcd error text is not sent.
func TestStoreUnavailable(t *testing.T) {
	e := etcdtest.Start(t)
	cfg := etcdstore.DefaultConfig()
	cfg.RequestTimeout = 200 * time.Millisecond
	cfg.OperationTimeout = time.Second
	c := serveWith(t, e, cfg)
	f := newFx(t, c)
	f.register("up", lamp(1))
	e.Stop()

	tests := []struct {
		name string
		call func() error
	}{
		{"Get", func() error {
			_, err := c.Get(f.ctx, &intentv1.GetRequest{Key: "up"})
			return err
		}},
		{"Register", func() error {
			_, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: "down", Params: mustStruct(t, lamp(1))})
			return err
		}},
		{"OpenSession", func() error {
			_, err := c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{Worker: "w1"})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			d := detailsOf(t, err)
			if d.code != codes.Unavailable || d.info.GetReason() != "STORE_UNAVAILABLE" || d.info.GetDomain() != server.ErrorDomain {
				t.Errorf("%s with etcd down: %v (%s/%s), want %v %s/%s", tc.name, err, d.info.GetDomain(), d.info.GetReason(), codes.Unavailable, server.ErrorDomain, "STORE_UNAVAILABLE")
			}
			if msg := status.Convert(err).Message(); strings.Contains(msg, "etcdserver") || strings.Contains(msg, "127.0.0.1") {
				t.Errorf("%s with etcd down: message %q leaks the etcd error", tc.name, msg)
			}
		})
	}
}

// An etcd whose revision went back below one the replica saw (a restore
// without a revision bump) is refused as UNAVAILABLE / STORE_ROLLED_BACK,
// which names the cause, and nothing is decided.
func TestStoreRolledBack(t *testing.T) {
	e := etcdtest.Start(t)
	store, c := serveStore(t, e, etcdstore.DefaultConfig())
	f := newFx(t, c)
	f.register("before", lamp(1))
	store.RaiseFloor(store.HighestRevision() + 1000)
	for name, call := range map[string]func() error{
		"Get": func() error {
			_, err := c.Get(f.ctx, &intentv1.GetRequest{Key: "before"})
			return err
		},
		"Register": func() error {
			_, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: "after", Params: mustStruct(t, lamp(1))})
			return err
		},
	} {
		d := detailsOf(t, call())
		if d.code != codes.Unavailable || d.info.GetReason() != "STORE_ROLLED_BACK" {
			t.Errorf("%s on a rolled-back store: %v %s, want UNAVAILABLE %s", name, d.code, d.info.GetReason(), "STORE_ROLLED_BACK")
		}
	}
}
