package server_test

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/server"
)

// etcdRevision is the etcd cluster's current revision.
func etcdRevision(t *testing.T, e *etcdtest.Server) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.Client(t).Get(ctx, "intentd-validation-test-probe")
	if err != nil {
		t.Fatalf("etcd Get: %v", err)
	}
	return resp.Header.Revision
}

// checkNothingWritten fails the test if any etcd key was put after revision
// rev. (etcd itself may delete keys meanwhile: the session keys of earlier
// subtests whose leases lapse. Every write of intentd puts a key.)
func checkNothingWritten(t *testing.T, e *etcdtest.Server, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.Client(t).Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithMinModRev(rev+1), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("etcd Get: %v", err)
	}
	for _, kv := range resp.Kvs {
		t.Errorf("the refused call wrote etcd key %q (revision %d, after %d)", kv.Key, kv.ModRevision, rev)
	}
}

// paramsOfSize returns approved terms whose canonical JSON is exactly n
// bytes: {"a":"xx…x"}. (It checks the arithmetic one byte short, where
// intent.Canonical still answers.)
func paramsOfSize(t *testing.T, n int) map[string]any {
	t.Helper()
	text := strings.Repeat("x", n-len(`{"a":""}`))
	b, err := intent.Canonical(map[string]any{"a": text[1:]})
	if err != nil || len(b) != n-1 {
		t.Fatalf("canonical params of %d bytes: one byte short got %d bytes, %v", n, len(b), err)
	}
	return map[string]any{"a": text}
}

// nLabels returns n labels l0…l(n-1).
func nLabels(n int) map[string]string {
	out := make(map[string]string, n)
	for i := range n {
		out[fmt.Sprintf("l%d", i)] = "v"
	}
	return out
}

// nRefs returns n external refs r0…r(n-1).
func nRefs(n int) map[string]string {
	out := make(map[string]string, n)
	for i := range n {
		out[fmt.Sprintf("r%d", i)] = "SO-1"
	}
	return out
}

// outboxCost mirrors the server's estimate of what a child adds to a
// completion's etcd transaction (see server.MaxOutboxBytes), so that the
// test can put an outbox exactly at the limit.
func outboxCost(key string, canonicalParams int) int {
	return 2<<10 + canonicalParams + 8*len(key)
}

// outbox returns children of parent whose estimated cost is exactly total
// bytes, in as few children as the params limit allows.
func outbox(t *testing.T, parent string, total int) []*intentv1.RegisterRequest {
	t.Helper()
	var out []*intentv1.RegisterRequest
	for i := 0; total > 0; i++ {
		key := fmt.Sprintf("%s-child-%d", parent, i)
		size := min(total-outboxCost(key, 0), intent.MaxParamsBytes)
		if size < len(`{"a":""}`) {
			t.Fatalf("outbox of %d bytes does not split into children", total)
		}
		out = append(out, &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, paramsOfSize(t, size))})
		total -= outboxCost(key, size)
	}
	return out
}

// withoutEstimates returns in without what Get computes anew on each read
// (the lease's estimated expiry).
func withoutEstimates(in *intentv1.Intent) *intentv1.Intent {
	if in.GetLease().GetExpiresAt() == nil {
		return in
	}
	in = proto.CloneOf(in)
	in.Lease.ExpiresAt = nil
	return in
}

// limitCase is one limit of the API: a request at the limit is accepted,
// one just past it refused naming field.
type limitCase struct {
	name  string
	setup func(f *fx, key string) prep
	// call makes the request at the limit (past false) or one past it.
	call func(f *fx, key string, p prep, past bool) error
	// field is what the refusal names.
	field string
	// atLimit, when set, accepts an error at the limit: validation let the
	// request through and the store answered (a session that does not
	// exist, for instance). nil insists on success.
	atLimit func(error) bool
}

// notInvalid accepts any answer but INVALID_ARGUMENT (and never an
// unmapped error).
func notInvalid(err error) bool {
	c := status.Code(err)
	return c != codes.InvalidArgument && c != codes.Unknown && c != codes.Internal
}

// pastBy returns n, or n+1 one past the limit.
func pastBy(n int, past bool) int {
	if past {
		return n + 1
	}
	return n
}

func limitCases(t *testing.T) []limitCase {
	register := func(mut func(r *intentv1.RegisterRequest, past bool)) func(*fx, string, prep, bool) error {
		return func(f *fx, key string, _ prep, past bool) error {
			r := &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1))}
			mut(r, past)
			_, err := f.c.Register(f.ctx, r)
			return err
		}
	}
	complete := func(mut func(r *intentv1.CompleteRequest, past bool)) func(*fx, string, prep, bool) error {
		return func(f *fx, key string, p prep, past bool) error {
			r := &intentv1.CompleteRequest{Key: key, Token: p.token, Result: &intentv1.Result{}}
			mut(r, past)
			_, err := f.c.Complete(f.ctx, r)
			return err
		}
	}
	list := func(mut func(r *intentv1.ListRequest, past bool)) func(*fx, string, prep, bool) error {
		return func(f *fx, _ string, _ prep, past bool) error {
			r := &intentv1.ListRequest{}
			mut(r, past)
			_, err := f.c.List(f.ctx, r)
			return err
		}
	}
	resolve := func(mut func(r *intentv1.ResolveRequest, past bool)) func(*fx, string, prep, bool) error {
		return func(f *fx, key string, _ prep, past bool) error {
			r := &intentv1.ResolveRequest{Key: key, Decision: intentv1.Decision_DECISION_PENDING, Actor: "alice", Reason: "no order", RequestId: "review-1"}
			mut(r, past)
			_, err := f.c.Resolve(f.ctx, r)
			return err
		}
	}
	x := strings.Repeat
	return []limitCase{
		{
			name: "Register key length", setup: nothing, field: "key",
			call: func(f *fx, key string, _ prep, past bool) error {
				long := key + x("k", pastBy(server.MaxKeyLen, past)-len(key))
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: long, Params: mustStruct(f.t, lamp(1))})
				return err
			},
		},
		{
			name: "Register key alphabet", setup: nothing, field: "key",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				if r.Key += "-_.:/=@+"; past {
					r.Key += " "
				}
			}),
		},
		{
			name: "Register tenant length", setup: nothing, field: "tenant",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				r.Tenant = x("t", pastBy(intent.MaxTenantLen, past))
			}),
		},
		{
			name: "Register tenant alphabet", setup: nothing, field: "tenant",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				if r.Tenant = "0a-b_c"; past {
					r.Tenant = "A-b"
				}
			}),
		},
		{
			name: "Register tenant first character", setup: nothing, field: "tenant",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				if r.Tenant = "a-"; past {
					r.Tenant = "-a"
				}
			}),
		},
		{
			name: "Register params canonical size", setup: nothing, field: "params",
			call: func(f *fx, key string, _ prep, past bool) error {
				params := paramsOfSize(f.t, pastBy(intent.MaxParamsBytes, past))
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, params)})
				return err
			},
		},
		{
			name: "Register params present", setup: nothing, field: "params",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				if past {
					r.Params = nil
				}
			}),
		},
		{
			name: "Register params_version length", setup: nothing, field: "params_version",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				r.ParamsVersion = x("v", pastBy(server.MaxParamsVersionLen, past))
			}),
		},
		{
			name: "Register label count", setup: nothing, field: "labels",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				r.Labels = nLabels(pastBy(server.MaxLabels, past))
			}),
		},
		{
			name: "Register label name length", setup: nothing, field: "labels[" + x("n", server.MaxLabelKeyLen+1) + "]",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				r.Labels = map[string]string{x("n", pastBy(server.MaxLabelKeyLen, past)): "v"}
			}),
		},
		{
			name: "Register label name alphabet", setup: nothing, field: "labels[team=a]",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				if r.Labels = map[string]string{"app.example/team_1:x-y": "v"}; past {
					r.Labels = map[string]string{"team=a": "v"}
				}
			}),
		},
		{
			name: "Register label value length", setup: nothing, field: "labels[team]",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				r.Labels = map[string]string{"team": x("v", pastBy(server.MaxLabelValueLen, past))}
			}),
		},
		{
			name: "Register parent_key alphabet", setup: pending, field: "parent_key",
			call: func(f *fx, key string, _ prep, past bool) error {
				parent := key
				if past {
					parent += "!"
				}
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key + "-sub", Params: mustStruct(f.t, lamp(1)), ParentKey: parent})
				return err
			},
		},
		{
			name: "Register retention positive", setup: nothing, field: "retention",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				if r.Retention = durationpb.New(time.Nanosecond); past {
					r.Retention = durationpb.New(0)
				}
			}),
		},
		{
			name: "Register max_attempts at most the limit", setup: nothing, field: "max_attempts",
			call: register(func(r *intentv1.RegisterRequest, past bool) {
				r.MaxAttempts = uint32(pastBy(intent.MaxAttemptsLimit, past))
			}),
		},
		{
			name: "DeriveKey action length", setup: nothing, field: "action",
			call: func(f *fx, _ string, _ prep, past bool) error {
				_, err := f.c.DeriveKey(f.ctx, &intentv1.DeriveKeyRequest{
					Action: x("a", pastBy(intent.MaxActionLen, past)), Identity: mustStruct(f.t, map[string]any{"cart": "c-1"}),
				})
				return err
			},
		},
		{
			name: "DeriveKey identity present", setup: nothing, field: "identity",
			call: func(f *fx, _ string, _ prep, past bool) error {
				r := &intentv1.DeriveKeyRequest{Action: "purchase", Identity: mustStruct(f.t, map[string]any{"cart": "c-1"})}
				if past {
					r.Identity = &structpb.Struct{}
				}
				_, err := f.c.DeriveKey(f.ctx, r)
				return err
			},
		},
		{
			name: "OpenSession worker length", setup: nothing, field: "worker",
			call: func(f *fx, _ string, _ prep, past bool) error {
				_, err := f.c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{Worker: x("w", pastBy(server.MaxWorkerLen, past))})
				return err
			},
		},
		{
			name: "OpenSession worker present", setup: nothing, field: "worker",
			call: func(f *fx, _ string, _ prep, past bool) error {
				r := &intentv1.OpenSessionRequest{Worker: "w"}
				if past {
					r.Worker = ""
				}
				_, err := f.c.OpenSession(f.ctx, r)
				return err
			},
		},
		{
			name: "OpenSession shortest ttl", setup: nothing, field: "ttl",
			call: func(f *fx, _ string, _ prep, past bool) error {
				ttl := server.MinSessionTTL
				if past {
					ttl -= time.Nanosecond
				}
				_, err := f.c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(ttl)})
				return err
			},
		},
		{
			name: "OpenSession longest ttl", setup: nothing, field: "ttl",
			call: func(f *fx, _ string, _ prep, past bool) error {
				ttl := server.MaxSessionTTL
				if past {
					ttl += time.Nanosecond
				}
				_, err := f.c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(ttl)})
				return err
			},
		},
		{
			name: "CloseSession session_id length", setup: nothing, field: "session_id", atLimit: notInvalid,
			call: func(f *fx, _ string, _ prep, past bool) error {
				_, err := f.c.CloseSession(f.ctx, &intentv1.CloseSessionRequest{SessionId: x("f", pastBy(server.MaxSessionIDLen, past))})
				return err
			},
		},
		{
			name: "CloseSession session_id alphabet", setup: nothing, field: "session_id", atLimit: notInvalid,
			call: func(f *fx, _ string, _ prep, past bool) error {
				id := "0123456789abcdef"
				if past {
					id = "0123456789ABCDEF"
				}
				_, err := f.c.CloseSession(f.ctx, &intentv1.CloseSessionRequest{SessionId: id})
				return err
			},
		},
		{
			name: "Acquire request_id length", setup: pending, field: "request_id",
			call: func(f *fx, key string, p prep, past bool) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session, RequestId: x("r", pastBy(server.MaxRequestIDLen, past))})
				return err
			},
		},
		{
			name: "Acquire expected_fingerprint form", setup: pending, field: "expected_fingerprint",
			call: func(f *fx, key string, p prep, past bool) error {
				fp := p.fingerprint
				if past {
					fp = strings.ToUpper(fp)
				}
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session, RequestId: "r1", ExpectedFingerprint: fp})
				return err
			},
		},
		{
			name: "Acquire register.key", setup: pending, field: "register.key",
			call: func(f *fx, key string, p prep, past bool) error {
				reg := &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1))}
				if past {
					reg.Key = "bad key"
				}
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session, RequestId: "r1", Register: reg})
				return err
			},
		},
		{
			name: "Acquire register.max_attempts", setup: pending, field: "register.max_attempts",
			call: func(f *fx, key string, p prep, past bool) error {
				reg := &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1)), MaxAttempts: uint32(pastBy(intent.MaxAttemptsLimit, past))}
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session, RequestId: "r1", Register: reg})
				return err
			},
		},
		{
			name: "Heartbeat lease count", setup: held, field: "leases",
			call: func(f *fx, key string, p prep, past bool) error {
				var leases []*intentv1.HeldLease
				for range pastBy(server.MaxHeldLeases, past) {
					leases = append(leases, &intentv1.HeldLease{Key: key, Token: p.token})
				}
				_, err := f.c.Heartbeat(f.ctx, &intentv1.HeartbeatRequest{SessionId: p.session, Leases: leases})
				return err
			},
		},
		{
			name: "Heartbeat lease token", setup: held, field: "leases[1].token",
			call: func(f *fx, key string, p prep, past bool) error {
				second := p.token
				if past {
					second = 0
				}
				_, err := f.c.Heartbeat(f.ctx, &intentv1.HeartbeatRequest{SessionId: p.session, Leases: []*intentv1.HeldLease{{Key: key, Token: p.token}, {Key: key, Token: second}}})
				return err
			},
		},
		{
			name: "Complete token", setup: held, field: "token",
			call: complete(func(r *intentv1.CompleteRequest, past bool) {
				if past {
					r.Token = 0
				}
			}),
		},
		{
			name: "Complete result present", setup: held, field: "result",
			call: complete(func(r *intentv1.CompleteRequest, past bool) {
				if past {
					r.Result = nil
				}
			}),
		},
		{
			name: "Complete payload size", setup: held, field: "result.payload",
			call: complete(func(r *intentv1.CompleteRequest, past bool) {
				r.Result.Payload = make([]byte, pastBy(server.MaxPayloadBytes, past))
			}),
		},
		{
			name: "Complete external_refs count", setup: held, field: "result.external_refs",
			call: complete(func(r *intentv1.CompleteRequest, past bool) {
				r.Result.ExternalRefs = nRefs(pastBy(server.MaxExternalRefs, past))
			}),
		},
		{
			name: "Complete external_refs value length", setup: held, field: "result.external_refs[order]",
			call: complete(func(r *intentv1.CompleteRequest, past bool) {
				r.Result.ExternalRefs = map[string]string{"order": x("o", pastBy(server.MaxExternalRefLen, past))}
			}),
		},
		{
			name: "Complete children count", setup: held, field: "children",
			call: func(f *fx, key string, p prep, past bool) error {
				var kids []*intentv1.RegisterRequest
				for i := range pastBy(server.MaxChildren, past) {
					kids = append(kids, child(f.t, fmt.Sprintf("%s-c%d", key, i), "mail"))
				}
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef, Children: kids})
				return err
			},
		},
		{
			name: "Complete child key", setup: held, field: "children[1].key",
			call: func(f *fx, key string, p prep, past bool) error {
				kids := []*intentv1.RegisterRequest{child(f.t, key+"-c0", "mail"), child(f.t, key+"-c1", "invoice")}
				if past {
					kids[1].Key = key + " c1"
				}
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef, Children: kids})
				return err
			},
		},
		{
			name: "Complete child params", setup: held, field: "children[0].params",
			call: func(f *fx, key string, p prep, past bool) error {
				kids := []*intentv1.RegisterRequest{child(f.t, key+"-c0", "mail")}
				if past {
					kids[0].Params = nil
				}
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef, Children: kids})
				return err
			},
		},
		{
			// The largest completion there is: the biggest params, labels and
			// payload, and the outbox at its limit. etcd must take it whole.
			name: "Complete outbox size",
			setup: func(f *fx, key string) prep {
				labels := map[string]string{}
				for i := range server.MaxLabels {
					name := fmt.Sprintf("%02d", i) + x("n", server.MaxLabelKeyLen-2)
					labels[name] = x("v", server.MaxLabelValueLen)
				}
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{
					Key: key, Params: mustStruct(f.t, paramsOfSize(f.t, intent.MaxParamsBytes)),
					ParamsVersion: x("v", server.MaxParamsVersionLen), Labels: labels,
				})
				if err != nil {
					f.t.Fatalf("Register(%q) with the largest params and labels: %v", key, err)
				}
				p := prep{session: f.session("w1")}
				p.token = f.acquire(key, p.session, "r1").GetLease().GetToken()
				return p
			},
			field: "children",
			call: func(f *fx, key string, p prep, past bool) error {
				refs := map[string]string{}
				for i := range server.MaxExternalRefs {
					refs[fmt.Sprintf("%03d", i)+x("r", server.MaxExternalRefLen-3)] = x("o", server.MaxExternalRefLen)
				}
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{
					Key: key, Token: p.token,
					Result:   &intentv1.Result{Payload: make([]byte, server.MaxPayloadBytes), ExternalRefs: refs},
					Children: outbox(f.t, key, pastBy(server.MaxOutboxBytes, past)),
				})
				return err
			},
		},
		{
			name: "MarkUnknown reason length", setup: held, field: "reason",
			call: func(f *fx, key string, p prep, past bool) error {
				_, err := f.c.MarkUnknown(f.ctx, &intentv1.MarkUnknownRequest{Key: key, Token: p.token, Reason: x("r", pastBy(server.MaxReasonLen, past))})
				return err
			},
		},
		{
			name: "Release reason length", setup: held, field: "reason",
			call: func(f *fx, key string, p prep, past bool) error {
				_, err := f.c.Release(f.ctx, &intentv1.ReleaseRequest{Key: key, Token: p.token, Reason: x("r", pastBy(server.MaxReasonLen, past))})
				return err
			},
		},
		{
			name: "Release token", setup: held, field: "token",
			call: func(f *fx, key string, p prep, past bool) error {
				token := p.token
				if past {
					token = 0
				}
				_, err := f.c.Release(f.ctx, &intentv1.ReleaseRequest{Key: key, Token: token})
				return err
			},
		},
		{
			name: "Fail failure present", setup: held, field: "failure",
			call: func(f *fx, key string, p prep, past bool) error {
				r := &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: "card_declined"}}
				if past {
					r.Failure = nil
				}
				_, err := f.c.Fail(f.ctx, r)
				return err
			},
		},
		{
			name: "Fail failure.code length", setup: held, field: "failure.code",
			call: func(f *fx, key string, p prep, past bool) error {
				_, err := f.c.Fail(f.ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: x("c", pastBy(server.MaxFailureCodeLen, past))}})
				return err
			},
		},
		{
			name: "Fail failure.message length", setup: held, field: "failure.message",
			call: func(f *fx, key string, p prep, past bool) error {
				_, err := f.c.Fail(f.ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: "declined", Message: x("m", pastBy(server.MaxReasonLen, past))}})
				return err
			},
		},
		{
			name: "Get key length", setup: nothing, field: "key", atLimit: notInvalid,
			call: func(f *fx, _ string, _ prep, past bool) error {
				_, err := f.c.Get(f.ctx, &intentv1.GetRequest{Key: x("k", pastBy(server.MaxKeyLen, past))})
				return err
			},
		},
		{
			name: "Escalate reason length", setup: held, field: "reason",
			call: func(f *fx, key string, p prep, past bool) error {
				_, err := f.c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Token: p.token, Actor: "w1", Reason: x("r", pastBy(server.MaxReasonLen, past))})
				return err
			},
		},
		{
			name: "Escalate actor length", setup: held, field: "actor",
			call: func(f *fx, key string, p prep, past bool) error {
				_, err := f.c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Token: p.token, Reason: "two orders", Actor: x("a", pastBy(server.MaxWorkerLen, past))})
				return err
			},
		},
		{
			name: "Resolve decision defined", setup: markedUnknown, field: "decision",
			call: resolve(func(r *intentv1.ResolveRequest, past bool) {
				if past {
					r.Decision = 99
				}
			}),
		},
		{
			name: "Resolve actor length", setup: markedUnknown, field: "actor",
			call: resolve(func(r *intentv1.ResolveRequest, past bool) {
				r.Actor = x("a", pastBy(server.MaxWorkerLen, past))
			}),
		},
		{
			name: "Resolve request_id length", setup: markedUnknown, field: "request_id",
			call: resolve(func(r *intentv1.ResolveRequest, past bool) {
				r.RequestId = x("r", pastBy(server.MaxRequestIDLen, past))
			}),
		},
		{
			name: "Resolve reason length", setup: markedUnknown, field: "reason",
			call: resolve(func(r *intentv1.ResolveRequest, past bool) {
				r.Reason = x("r", pastBy(server.MaxReasonLen, past))
			}),
		},
		{
			name: "Cancel reason length", setup: pending, field: "reason",
			call: func(f *fx, key string, _ prep, past bool) error {
				_, err := f.c.Cancel(f.ctx, &intentv1.CancelRequest{Key: key, Actor: "alice", Reason: x("r", pastBy(server.MaxReasonLen, past))})
				return err
			},
		},
		{
			name: "Cancel actor length", setup: pending, field: "actor",
			call: func(f *fx, key string, _ prep, past bool) error {
				_, err := f.c.Cancel(f.ctx, &intentv1.CancelRequest{Key: key, Actor: x("a", pastBy(server.MaxWorkerLen, past)), Reason: "withdrawn"})
				return err
			},
		},
		{
			name: "List page_size", setup: nothing, field: "page_size",
			call: list(func(r *intentv1.ListRequest, past bool) {
				r.PageSize = int32(pastBy(etcdstore.MaxPageSize, past))
			}),
		},
		{
			name: "List page_size not negative", setup: nothing, field: "page_size",
			call: list(func(r *intentv1.ListRequest, past bool) {
				if past {
					r.PageSize = -1
				}
			}),
		},
		{
			name: "List page_token length", setup: nothing, field: "page_token",
			call: list(func(r *intentv1.ListRequest, past bool) {
				if past {
					r.PageToken = x("p", 1025)
				}
			}),
		},
		{
			name: "List states defined", setup: nothing, field: "states[1]",
			call: list(func(r *intentv1.ListRequest, past bool) {
				if r.States = []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_CANCELLED}; past {
					r.States[1] = 99
				}
			}),
		},
		{
			name: "List states not unspecified", setup: nothing, field: "states[0]",
			call: list(func(r *intentv1.ListRequest, past bool) {
				if r.States = []intentv1.State{intentv1.State_STATE_PENDING}; past {
					r.States[0] = intentv1.State_STATE_UNSPECIFIED
				}
			}),
		},
		{
			name: "List label value length", setup: nothing, field: "label[team]",
			call: list(func(r *intentv1.ListRequest, past bool) {
				r.Label = "team=" + x("v", pastBy(server.MaxLabelValueLen, past))
			}),
		},
		{
			name: "List label name", setup: nothing, field: "label",
			call: list(func(r *intentv1.ListRequest, past bool) {
				if r.Label = "team=a=b"; past {
					r.Label = "=team"
				}
			}),
		},
		{
			name: "Watch start_revision", setup: pending, field: "start_revision",
			call: func(f *fx, key string, _ prep, past bool) error {
				rev := int64(0)
				if past {
					rev = -1
				}
				return firstWatchError(f, &intentv1.WatchRequest{Key: key, StartRevision: rev})
			},
		},
		{
			name: "Watch key", setup: pending, field: "key",
			call: func(f *fx, key string, _ prep, past bool) error {
				if past {
					key += "?"
				}
				return firstWatchError(f, &intentv1.WatchRequest{Key: key})
			},
		},
	}
}

// firstWatchError opens a watch and returns the error that ends it, or nil
// when it is still open after a moment: a valid watch waits for changes.
func firstWatchError(f *fx, req *intentv1.WatchRequest) error {
	ctx, cancel := context.WithTimeout(f.ctx, 500*time.Millisecond)
	defer cancel()
	stream, err := f.c.Watch(ctx, req)
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if status.Code(err) == codes.DeadlineExceeded {
				return nil // the watch stayed open until the deadline, from either side
			}
			return err
		}
	}
}

// TestLimits puts every documented limit at its edge, which is accepted,
// and one past it, which is refused with INVALID_FIELD naming the field and
// writes nothing: no etcd key is put, and Get shows the intent unchanged.
// The server runs no validating interceptor: the handlers check the rules
// themselves, so every limit holds however they are called.
func TestLimits(t *testing.T) {
	e := etcdtest.Start(t)
	c := serve(t, e)
	for i, tc := range limitCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, c)
			base := fmt.Sprintf("limit-%d", i)

			at := base + "-at"
			err := tc.call(f, at, tc.setup(f, at), false)
			ok := err == nil
			if tc.atLimit != nil {
				ok = tc.atLimit(err)
			}
			if !ok {
				t.Errorf("at the limit: %v, want it accepted", err)
			}

			past := base + "-past"
			p := tc.setup(f, past)
			before := f.get(past)
			rev := etcdRevision(t, e)
			err = tc.call(f, past, p, true)
			checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", tc.field)
			checkNothingWritten(t, e, rev)
			if after := f.get(past); !proto.Equal(withoutEstimates(after), withoutEstimates(before)) {
				t.Errorf("Get(%q) changed: revision %d, state %v before; revision %d, state %v after",
					past, before.GetRevision(), before.GetState(), after.GetRevision(), after.GetState())
			}
		})
	}
}

// TestRulesCoverEveryRequestField insists that each field of every request
// message, and of the messages requests carry, has protovalidate rules or
// is named here with the reason it has none.
func TestRulesCoverEveryRequestField(t *testing.T) {
	unruled := map[protoreflect.FullName]string{
		"intent.v1.AcquireRequest.register":                    "a RegisterRequest: its own fields' rules apply",
		"intent.v1.EscalateRequest.token":                      "any value: 0 when a reviewer escalates",
		"intent.v1.EscalateRequest.force":                      "a flag",
		"intent.v1.ResolveRequest.result":                      "a Result, required with DECISION_COMPLETED only (the server checks the pairing)",
		"intent.v1.ResolveRequest.failure":                     "a Failure, required with DECISION_FAILED only (the server checks the pairing)",
		"intent.v1.ResolveRequest.force":                       "a flag",
		"intent.v1.ResolveRequest.expected_token":              "any value: 0 when the decision is not fenced",
		"intent.v1.WatchRequest.created_notify":                "a flag",
		"intent.v1.BeginSubmissionRequest.lookup":              "a flag",
		"intent.v1.BeginSubmissionRequest.upstream_has_lookup": "a flag",
		"intent.v1.RecordSubmissionRequest.response":           "an UpstreamResponse, required with the outcomes that have an answer (the server checks the pairing)",
	}
	requestFields(func(fd protoreflect.FieldDescriptor, rules *validate.FieldRules) {
		_, excused := unruled[fd.FullName()]
		switch has := rules != nil && proto.Size(rules) > 0; {
		case !has && !excused:
			t.Errorf("%s has no protovalidate rules: add them to intent.proto, or say here why it needs none", fd.FullName())
		case has && excused:
			t.Errorf("%s has rules but is listed as unruled", fd.FullName())
		}
	})
}

// junk fills every field of m with a value no limit allows: text with a
// space, a control character and a snowman, 2000 bytes long; negative or
// zero numbers; enum 99; an oversized payload; and so on, recursively.
func junk(m protoreflect.Message, depth int) {
	text := "junk value \x01 \u2603 " + strings.Repeat("x", 2000)
	switch m.Interface().(type) {
	case *durationpb.Duration:
		m.Set(m.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(-1))
		return
	case *structpb.Struct:
		return // empty: no approved terms
	}
	scalar := func(fd protoreflect.FieldDescriptor) protoreflect.Value {
		switch fd.Kind() {
		case protoreflect.StringKind:
			return protoreflect.ValueOfString(text)
		case protoreflect.BytesKind:
			return protoreflect.ValueOfBytes(make([]byte, server.MaxPayloadBytes+1))
		case protoreflect.BoolKind:
			return protoreflect.ValueOfBool(true)
		case protoreflect.EnumKind:
			return protoreflect.ValueOfEnum(99)
		case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
			return protoreflect.ValueOfInt32(-1)
		case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
			return protoreflect.ValueOfInt64(-1)
		case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
			return protoreflect.ValueOfUint32(0)
		case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
			return protoreflect.ValueOfUint64(0)
		}
		return fd.Default()
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			v := mp.NewValue()
			if fd.MapValue().Message() == nil {
				v = scalar(fd.MapValue())
			}
			mp.Set(protoreflect.ValueOfString(text).MapKey(), v)
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 3 {
				if fd.Message() != nil {
					v := l.NewElement()
					if depth < 3 {
						junk(v.Message(), depth+1)
					}
					l.Append(v)
				} else {
					l.Append(scalar(fd))
				}
			}
		case fd.Message() != nil:
			if depth < 3 {
				junk(m.Mutable(fd).Message(), depth+1)
			}
		default:
			m.Set(fd, scalar(fd))
		}
	}
}

// invoke calls the IntentService method named method on c with req, through
// the generated client, and returns the call's error; a stream's is its
// first Recv's (or nil when it stays open for a moment).
func invoke(ctx context.Context, c intentv1.IntentServiceClient, method string, req proto.Message) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := reflect.ValueOf(c).MethodByName(method).Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(req)})
	if err, _ := out[1].Interface().(error); err != nil {
		return err
	}
	stream, ok := out[0].Interface().(interface{ RecvMsg(any) error })
	if !ok {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- stream.RecvMsg(new(intentv1.WatchResponse)) }()
	select {
	case err := <-done:
		if err == io.EOF {
			return nil
		}
		return err
	case <-rctx.Done():
		return nil
	}
}

// TestMalformedRequestsNameAField sends every RPC an empty request and one
// whose every field is junk: each answers INVALID_ARGUMENT / INVALID_FIELD
// naming a field, never UNKNOWN or INTERNAL, from the handlers' own
// validation. (List and Watch accept an empty request: it lists or follows
// the whole default tenant.)
func TestMalformedRequestsNameAField(t *testing.T) {
	e := etcdtest.Start(t)
	c := serve(t, e)
	emptyIsValid := map[string]bool{"List": true, "Watch": true}
	methods := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods()
	for i := range methods.Len() {
		md := methods.Get(i)
		name := string(md.Name())
		mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
		if err != nil {
			t.Fatal(err)
		}
		garbage := mt.New()
		junk(garbage, 0)
		reqs := map[string]proto.Message{"junk": garbage.Interface()}
		if !emptyIsValid[name] {
			reqs["empty"] = mt.New().Interface()
		}
		for kind, req := range reqs {
			t.Run(name+"/"+kind, func(t *testing.T) {
				f := newFx(t, c)
				rev := etcdRevision(t, e)
				err := invoke(f.ctx, c, name, req)
				d := checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "")
				field := d.info.GetMetadata()["field"]
				if field == "" || len(d.field) != 1 || d.field[0] != field {
					t.Errorf("ErrorInfo field %q, BadRequest fields %q: want one field, named in both", field, d.field)
				}
				checkNothingWritten(t, e, rev)
			})
		}
	}
}
