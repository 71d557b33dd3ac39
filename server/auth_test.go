package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/internal/testing/testlog"
	"github.com/intentd/intentd/server"
)

// member is a principal of a test tokens file with its bearer token.
type member struct {
	name    string
	tenants []string
	roles   []access.Role
	token   string
}

func (m member) principal() *access.Principal {
	return &access.Principal{Name: m.name, Tenants: m.tenants, Roles: m.roles}
}

// directory builds the tokens file of members (hashes only) and parses it
// as intentd would.
func directory(t *testing.T, members ...member) *access.Directory {
	t.Helper()
	var f access.File
	for _, m := range members {
		f.Principals = append(f.Principals, access.Entry{
			Name: m.name, Tenants: m.tenants, Roles: m.roles,
			TokenSHA256: []string{access.HashToken(m.token)},
		})
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	d, err := access.Parse(b)
	if err != nil {
		t.Fatalf("access.Parse(%s): %v", b, err)
	}
	return d
}

// serveGuarded starts one intentd replica with the guard in front of the
// IntentService, principals from dir and the given rate limits; the guard
// logs into the returned buffer. The client sends no credentials of its
// own: calls carry them in their context (asMember).
func serveGuarded(t *testing.T, e *etcdtest.Server, dir *access.Directory, rates server.RateLimits) (intentv1.IntentServiceClient, *testlog.Buffer) {
	t.Helper()
	logs := &testlog.Buffer{}
	guard, err := server.NewGuard(func() *access.Directory { return dir }, rates, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	_, c := serveStore(t, e, etcdstore.DefaultConfig(),
		grpc.ChainUnaryInterceptor(guard.Unary()...),
		grpc.ChainStreamInterceptor(guard.Stream()...))
	return c, logs
}

// asMember returns ctx carrying m's bearer token.
func asMember(ctx context.Context, m member) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.token)
}

// callAs returns a fresh call context carrying m's token and nothing else.
func callAs(t *testing.T, m member) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return asMember(ctx, m)
}

// fxAs is a fixture whose calls are made by m.
func fxAs(t *testing.T, c intentv1.IntentServiceClient, m member) *fx {
	f := newFx(t, c)
	f.ctx = asMember(f.ctx, m)
	return f
}

// serviceMethods lists the short names of every IntentService RPC, from the
// generated descriptor: a new RPC shows up here without anyone updating a
// list.
func serviceMethods() []string {
	var out []string
	for _, m := range intentv1.IntentService_ServiceDesc.Methods {
		out = append(out, m.MethodName)
	}
	for _, s := range intentv1.IntentService_ServiceDesc.Streams {
		out = append(out, s.StreamName)
	}
	slices.Sort(out)
	return out
}

// documentedMatrix is the role matrix of docs/SECURITY.md ("Roles and
// tenants") and of issue 5, written out literally: changing server's
// matrix must change this test.
func documentedMatrix() map[access.Role][]string {
	return map[access.Role][]string{
		access.RoleApprover: {"Register", "Cancel", "DeriveKey"},
		access.RoleWorker:   {"OpenSession", "CloseSession", "Heartbeat", "Acquire", "Complete", "MarkUnknown", "Release", "Fail", "Escalate", "DeriveKey", "BeginSubmission", "RecordSubmission"},
		access.RoleReviewer: {"Resolve", "Escalate", "List", "Get", "Watch", "DeriveKey"},
		access.RoleReader:   {"Get", "List", "Watch", "DeriveKey"},
		access.RoleAdmin:    serviceMethods(), // all
	}
}

// mayCall reports what server.Matrix says: whether p may make method.
func mayCall(p *access.Principal, method string) bool {
	return p.Has(access.RoleAdmin) || slices.ContainsFunc(server.Matrix(method), p.Has)
}

// TestRoleMatrixIsDocumented compares server.Matrix with the documented
// matrix, method by method, for every RPC the service has.
func TestRoleMatrixIsDocumented(t *testing.T) {
	doc := documentedMatrix()
	for _, method := range serviceMethods() {
		var want []access.Role
		for _, r := range access.Roles {
			if slices.Contains(doc[r], method) {
				want = append(want, r)
			}
		}
		var got []access.Role
		for _, r := range access.Roles {
			if mayCall(&access.Principal{Roles: []access.Role{r}}, method) {
				got = append(got, r)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("roles that may call %s: server.Matrix gives %v, the documented matrix %v", method, got, want)
		}
	}
	for r, methods := range doc {
		for _, m := range methods {
			if !slices.Contains(serviceMethods(), m) {
				t.Errorf("documented matrix gives %s the RPC %s, which IntentService does not have", r, m)
			}
		}
	}
	if got := server.Matrix("NoSuchMethod"); len(got) != 0 {
		t.Errorf("Matrix(NoSuchMethod) = %v, want no role (only admin)", got)
	}
}

// reconciling leaves key IN_PROGRESS in reconcile mode: its first holder
// marked it unknown, and a second worker acquired it to find out.
func reconciling(f *fx, key string) prep {
	p := markedUnknown(f, key)
	p.session, p.token = f.lease(key, "w2", intentv1.Outcome_OUTCOME_RECONCILE)
	return p
}

// submissionOf is the fencing gateway's BeginSubmission of key's pickup
// under token, as submission "sub-<key>".
func submissionOf(key string, token uint64) *intentv1.BeginSubmissionRequest {
	return &intentv1.BeginSubmissionRequest{Key: key, Operation: "create-pickup", Token: token, SubmissionId: "sub-" + key,
		Request: &intentv1.SubmittedRequest{Upstream: "courier", Method: "POST", Target: "/pickups", BodySha256: strings.Repeat("0", 64), BodyBytes: 2, BodyKept: []byte("{}")},
		Timeout: durationpb.New(time.Minute)}
}

// submitting leaves key held with a submission of its pickup in flight.
func submitting(f *fx, key string) prep {
	f.t.Helper()
	p := held(f, key)
	if _, err := f.c.BeginSubmission(f.ctx, submissionOf(key, p.token)); err != nil {
		f.t.Fatalf("BeginSubmission(%q): %v", key, err)
	}
	return p
}

// sessionOnly opens a session and leaves key absent.
func sessionOnly(f *fx, _ string) prep { return prep{session: f.session("w1")} }

// labelled registers key with the label case=<key>, for a List that finds
// it alone.
func labelled(f *fx, key string) prep {
	f.t.Helper()
	if _, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1)), Labels: map[string]string{"case": key}}); err != nil {
		f.t.Fatalf("Register(%q): %v", key, err)
	}
	return prep{}
}

// rpcCase is one IntentService call in the matrix test: admin prepares the
// intent at key, then the principal under test calls with ctx.
type rpcCase struct {
	name    string // subtest name
	method  string // the RPC, as server.Matrix names it
	setup   func(f *fx, key string) prep
	call    func(ctx context.Context, f *fx, key string, p prep) error
	creates bool                           // an allowed call creates the intent at key
	audited bool                           // an allowed call writes a history entry naming its caller
	extra   func(p *access.Principal) bool // a further condition for the call to be allowed
}

func matrixCases() []rpcCase {
	return []rpcCase{
		{name: "Register", method: "Register", setup: nothing, creates: true, audited: true,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				_, err := f.c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1))})
				return err
			}},
		{name: "DeriveKey", method: "DeriveKey", setup: nothing,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				_, err := f.c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: "buy", Identity: mustStruct(f.t, map[string]any{"order": key})})
				return err
			}},
		{name: "OpenSession", method: "OpenSession", setup: nothing,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				_, err := f.c.OpenSession(ctx, &intentv1.OpenSessionRequest{Worker: key})
				return err
			}},
		{name: "CloseSession", method: "CloseSession", setup: sessionOnly,
			call: func(ctx context.Context, f *fx, _ string, p prep) error {
				_, err := f.c.CloseSession(ctx, &intentv1.CloseSessionRequest{SessionId: p.session})
				return err
			}},
		{name: "Acquire", method: "Acquire", setup: pending, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				resp, err := f.c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session, RequestId: "r1"})
				if err == nil && resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
					return fmt.Errorf("outcome %v, want EXECUTE", resp.GetOutcome())
				}
				return err
			}},
		{name: "Acquire with register", method: "Acquire", setup: sessionOnly, creates: true, audited: true,
			extra: func(p *access.Principal) bool { return p.Has(access.RoleApprover) },
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				resp, err := f.c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: p.session, RequestId: "r1",
					Register: &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1))}})
				if err == nil && resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
					return fmt.Errorf("outcome %v, want EXECUTE", resp.GetOutcome())
				}
				return err
			}},
		{name: "Heartbeat", method: "Heartbeat", setup: held,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				_, err := f.c.Heartbeat(ctx, &intentv1.HeartbeatRequest{SessionId: p.session, Leases: []*intentv1.HeldLease{{Key: key, Token: p.token}}})
				return err
			}},
		{name: "Complete", method: "Complete", setup: held, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				_, err := f.c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef})
				return err
			}},
		{name: "MarkUnknown", method: "MarkUnknown", setup: held, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				_, err := f.c.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Key: key, Token: p.token, Reason: "timeout"})
				return err
			}},
		{name: "Release", method: "Release", setup: reconciling, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				_, err := f.c.Release(ctx, &intentv1.ReleaseRequest{Key: key, Token: p.token, Reason: "no order at the merchant"})
				return err
			}},
		{name: "Fail", method: "Fail", setup: held, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				_, err := f.c.Fail(ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: "card_declined"}})
				return err
			}},
		{name: "Escalate", method: "Escalate", setup: held, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				_, err := f.c.Escalate(ctx, &intentv1.EscalateRequest{Key: key, Token: p.token, Reason: "cannot tell"})
				return err
			}},
		{name: "Resolve", method: "Resolve", setup: markedUnknown, audited: true,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				_, err := f.c.Resolve(ctx, &intentv1.ResolveRequest{Key: key, Decision: intentv1.Decision_DECISION_PENDING,
					Actor: "alice", Reason: "no order", RequestId: "review-1"})
				return err
			}},
		{name: "Cancel", method: "Cancel", setup: pending, audited: true,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				_, err := f.c.Cancel(ctx, &intentv1.CancelRequest{Key: key, Reason: "customer withdrew"})
				return err
			}},
		{name: "Get", method: "Get", setup: pending,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				resp, err := f.c.Get(ctx, &intentv1.GetRequest{Key: key})
				if err == nil && resp.GetIntent().GetKey() != key {
					return fmt.Errorf("Get returned %q", resp.GetIntent().GetKey())
				}
				return err
			}},
		{name: "List", method: "List", setup: labelled,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				resp, err := f.c.List(ctx, &intentv1.ListRequest{Label: "case=" + key})
				if err == nil && !slices.Equal(keysOf(resp.GetIntents()), []string{key}) {
					return fmt.Errorf("List returned %q, want [%q]", keysOf(resp.GetIntents()), key)
				}
				return err
			}},
		{name: "BeginSubmission", method: "BeginSubmission", setup: held, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				resp, err := f.c.BeginSubmission(ctx, submissionOf(key, p.token))
				if err == nil && resp.GetVerdict() != intentv1.SubmissionVerdict_SUBMISSION_VERDICT_FORWARD {
					return fmt.Errorf("verdict %v, want FORWARD", resp.GetVerdict())
				}
				return err
			}},
		{name: "RecordSubmission", method: "RecordSubmission", setup: submitting, audited: true,
			call: func(ctx context.Context, f *fx, key string, p prep) error {
				_, err := f.c.RecordSubmission(ctx, &intentv1.RecordSubmissionRequest{Key: key, Operation: "create-pickup", Token: p.token, SubmissionId: "sub-" + key,
					Outcome: intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_ANSWERED, Response: &intentv1.UpstreamResponse{Status: 201, Body: []byte("{}"), BodyBytes: 2}})
				return err
			}},
		{name: "Watch", method: "Watch", setup: pending,
			call: func(ctx context.Context, f *fx, key string, _ prep) error {
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				stream, err := f.c.Watch(ctx, &intentv1.WatchRequest{Key: key, StartRevision: f.get(key).GetRevision()})
				if err != nil {
					return err
				}
				ev, err := stream.Recv()
				if err == nil && ev.GetIntent().GetKey() != key {
					return fmt.Errorf("Watch sent an event for %q", ev.GetIntent().GetKey())
				}
				return err
			}},
	}
}

// matrixMembers has one principal per role in tenant acme, and one holding
// both approver and worker (who may register inside Acquire).
func matrixMembers() []member {
	var out []member
	for _, r := range access.Roles {
		out = append(out, member{name: string(r) + "-1", tenants: []string{"acme"}, roles: []access.Role{r}, token: "tok-" + string(r) + "-5f2c9a"})
	}
	return append(out, member{name: "clerk", tenants: []string{"acme"}, roles: []access.Role{access.RoleApprover, access.RoleWorker}, token: "tok-clerk-81d0e4"})
}

// TestRoleMatrix makes every IntentService call as every role. A denied
// call is PERMISSION_DENIED with that reason and leaves the intent as it
// was (same revision, or still absent); an allowed call succeeds, and a
// state change it makes names its caller in the intent's history.
func TestRoleMatrix(t *testing.T) {
	e := etcdtest.Start(t)
	root := member{name: "root", tenants: []string{"acme"}, roles: []access.Role{access.RoleAdmin}, token: "tok-root-0b7e13"}
	members := matrixMembers()
	c, _ := serveGuarded(t, e, directory(t, append(members, root)...), server.RateLimits{})

	cases := matrixCases()
	var covered []string
	for _, rc := range cases {
		covered = append(covered, rc.method)
	}
	for _, m := range serviceMethods() {
		if !slices.Contains(covered, m) {
			t.Errorf("IntentService.%s has no case in the matrix test", m)
		}
	}

	for _, rc := range cases {
		for _, m := range members {
			p := m.principal()
			allowed := mayCall(p, rc.method) && (rc.extra == nil || rc.extra(p))
			verdict := "denied"
			if allowed {
				verdict = "allowed"
			}
			t.Run(fmt.Sprintf("%s/%s/%s", rc.name, m.name, verdict), func(t *testing.T) {
				admin := fxAs(t, c, root)
				key := strings.ReplaceAll(strings.ToLower(rc.name), " ", "-") + "." + m.name
				p := rc.setup(admin, key)
				before := admin.get(key)

				err := rc.call(callAs(t, m), admin, key, p)

				after := admin.get(key)
				if !allowed {
					checkError(t, err, codes.PermissionDenied, "PERMISSION_DENIED", "")
					switch {
					case before == nil && after != nil:
						t.Errorf("denied %s created intent %q (%v)", rc.name, key, after.GetState())
					case before != nil && (after.GetRevision() != before.GetRevision() || after.GetState() != before.GetState()):
						t.Errorf("denied %s changed intent %q: %v at revision %d, was %v at %d",
							rc.name, key, after.GetState(), after.GetRevision(), before.GetState(), before.GetRevision())
					}
					if rc.method == "CloseSession" {
						if _, err := admin.c.Heartbeat(admin.ctx, &intentv1.HeartbeatRequest{SessionId: p.session}); err != nil {
							t.Errorf("session after a denied CloseSession: Heartbeat = %v, want it alive", err)
						}
					}
					return
				}
				if err != nil {
					t.Fatalf("allowed %s by %s: %v", rc.name, m.name, err)
				}
				if rc.creates && after == nil {
					t.Errorf("allowed %s left no intent at %q", rc.name, key)
				}
				if rc.audited && !hasEntry(after, func(h *intentv1.HistoryEntry) bool { return strings.HasPrefix(h.GetPrincipal(), m.name) }) {
					t.Errorf("no history entry of %q names its caller %s: %v", key, m.name, after.GetHistory())
				}
				if rc.method == "CloseSession" {
					_, err := admin.c.Heartbeat(admin.ctx, &intentv1.HeartbeatRequest{SessionId: p.session})
					checkError(t, err, codes.NotFound, "SESSION_NOT_FOUND", "")
				}
			})
		}
	}
}

// answer is a status as a client receives it, serialized deterministically
// for a byte-for-byte comparison: code, message and every detail.
func answer(t *testing.T, err error) []byte {
	t.Helper()
	if err == nil {
		return nil
	}
	b, merr := proto.MarshalOptions{Deterministic: true}.Marshal(status.Convert(err).Proto())
	if merr != nil {
		t.Fatal(merr)
	}
	return b
}

// renamed is err with from replaced by to in its message.
func renamed(err error, from, to string) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err).Proto()
	st.Message = strings.ReplaceAll(st.GetMessage(), from, to)
	return status.FromProto(st).Err()
}

// TestTenantIsolation: bob (admin of globex) cannot read, change, list,
// watch or even detect alice's intent in acme; every answer he gets for it
// is byte for byte the answer for a key that exists nowhere.
func TestTenantIsolation(t *testing.T) {
	e := etcdtest.Start(t)
	alice := member{name: "alice", tenants: []string{"acme"}, roles: []access.Role{access.RoleAdmin}, token: "tok-alice-6c1d"}
	bob := member{name: "bob", tenants: []string{"globex"}, roles: []access.Role{access.RoleAdmin}, token: "tok-bob-93fa"}
	carol := member{name: "carol", tenants: []string{"acme", "globex"}, roles: []access.Role{access.RoleAdmin}, token: "tok-carol-27be"}
	c, _ := serveGuarded(t, e, directory(t, alice, bob, carol), server.RateLimits{})
	a, b := fxAs(t, c, alice), fxAs(t, c, bob)
	const key, ghost = "k", "ghost-key"

	// Bob's own things, before he starts watching.
	bobSession := b.session("bob-worker")
	b.register("bob-own", lamp(1))
	wctx, cancelWatches := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancelWatches()
	watchTenant, err := c.Watch(wctx, &intentv1.WatchRequest{})
	if err != nil {
		t.Fatalf("bob Watch(tenant): %v", err)
	}
	watchKey, err := c.Watch(wctx, &intentv1.WatchRequest{Key: key})
	if err != nil {
		t.Fatalf("bob Watch(%q): %v", key, err)
	}

	// Alice registers and acquires k, then holds it.
	aliceSession := a.session("alice-worker")
	resp, err := c.Acquire(a.ctx, &intentv1.AcquireRequest{Key: key, SessionId: aliceSession, RequestId: "r1",
		Register: &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, lamp(1)), Labels: map[string]string{"team": "checkout"}}})
	if err != nil {
		t.Fatalf("alice Acquire(%q) with register: %v", key, err)
	}
	aliceToken := resp.GetLease().GetToken()
	aliceIntent := a.get(key)

	probes := []struct {
		name   string
		call   func(key string) error
		reason string // the reason of the answer, for a missing intent
	}{
		{"Get", func(k string) error {
			_, err := c.Get(b.ctx, &intentv1.GetRequest{Key: k})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Acquire", func(k string) error {
			_, err := c.Acquire(b.ctx, &intentv1.AcquireRequest{Key: k, SessionId: bobSession, RequestId: "probe-1"})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Acquire expecting alice's fingerprint", func(k string) error {
			_, err := c.Acquire(b.ctx, &intentv1.AcquireRequest{Key: k, SessionId: bobSession, RequestId: "probe-2", ExpectedFingerprint: aliceIntent.GetFingerprint()})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Complete with alice's token", func(k string) error {
			_, err := c.Complete(b.ctx, &intentv1.CompleteRequest{Key: k, Token: aliceToken, Result: orderRef})
			return err
		}, "INTENT_NOT_FOUND"},
		{"MarkUnknown with alice's token", func(k string) error {
			_, err := c.MarkUnknown(b.ctx, &intentv1.MarkUnknownRequest{Key: k, Token: aliceToken, Reason: "x"})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Release with alice's token", func(k string) error {
			_, err := c.Release(b.ctx, &intentv1.ReleaseRequest{Key: k, Token: aliceToken, Reason: "x"})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Fail with alice's token", func(k string) error {
			_, err := c.Fail(b.ctx, &intentv1.FailRequest{Key: k, Token: aliceToken, Failure: &intentv1.Failure{Code: "x"}})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Escalate with alice's token", func(k string) error {
			_, err := c.Escalate(b.ctx, &intentv1.EscalateRequest{Key: k, Token: aliceToken, Reason: "x"})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Escalate with force", func(k string) error {
			_, err := c.Escalate(b.ctx, &intentv1.EscalateRequest{Key: k, Reason: "x", Actor: "bob", Force: true})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Resolve with force", func(k string) error {
			_, err := c.Resolve(b.ctx, &intentv1.ResolveRequest{Key: k, Decision: intentv1.Decision_DECISION_COMPLETED, Result: orderRef,
				Actor: "bob", Reason: "x", RequestId: "probe-3", Force: true})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Resolve as cancelled", func(k string) error {
			_, err := c.Resolve(b.ctx, &intentv1.ResolveRequest{Key: k, Decision: intentv1.Decision_DECISION_CANCELLED,
				Actor: "bob", Reason: "x", RequestId: "probe-4", Force: true})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Cancel", func(k string) error {
			_, err := c.Cancel(b.ctx, &intentv1.CancelRequest{Key: k})
			return err
		}, "INTENT_NOT_FOUND"},
		{"Heartbeat naming alice's lease", func(k string) error {
			_, err := c.Heartbeat(b.ctx, &intentv1.HeartbeatRequest{SessionId: bobSession, Leases: []*intentv1.HeldLease{{Key: k, Token: aliceToken}}})
			return err
		}, ""},
	}
	for _, pr := range probes {
		t.Run(pr.name, func(t *testing.T) {
			// A missing key's message names it: the ghost's answer, named
			// key, is what a key that exists nowhere answers.
			got, missing := pr.call(key), renamed(pr.call(ghost), ghost, key)
			if !bytes.Equal(answer(t, got), answer(t, missing)) {
				t.Errorf("bob's answer for alice's %q differs from the answer for a key that exists nowhere:\n got %v\nwant %v", key, got, missing)
			}
			if pr.reason != "" {
				checkError(t, got, codes.NotFound, pr.reason, "")
			}
		})
	}

	t.Run("List", func(t *testing.T) {
		for _, req := range []*intentv1.ListRequest{
			{},
			{States: []intentv1.State{intentv1.State_STATE_IN_PROGRESS}},
			{Label: "team=checkout"},
			{ParentKey: key},
		} {
			resp, err := c.List(b.ctx, req)
			if err != nil {
				t.Fatalf("bob List(%v): %v", req, err)
			}
			for _, in := range resp.GetIntents() {
				if in.GetTenant() != "globex" || in.GetKey() == key {
					t.Errorf("bob List(%v) shows %s/%s", req, in.GetTenant(), in.GetKey())
				}
			}
		}
	})

	t.Run("naming acme", func(t *testing.T) {
		calls := map[string]func(tenant string) error{
			"Get": func(tn string) error {
				_, err := c.Get(b.ctx, &intentv1.GetRequest{Tenant: tn, Key: key})
				return err
			},
			"List": func(tn string) error {
				_, err := c.List(b.ctx, &intentv1.ListRequest{Tenant: tn})
				return err
			},
			"Watch": func(tn string) error {
				ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
				defer cancel()
				stream, err := c.Watch(ctx, &intentv1.WatchRequest{Tenant: tn, Key: key, StartRevision: 1})
				if err != nil {
					return err
				}
				_, err = stream.Recv()
				return err
			},
			"Acquire": func(tn string) error {
				_, err := c.Acquire(b.ctx, &intentv1.AcquireRequest{Tenant: tn, Key: key, SessionId: aliceSession, RequestId: "probe-5"})
				return err
			},
			"Register": func(tn string) error {
				_, err := c.Register(b.ctx, &intentv1.RegisterRequest{Tenant: tn, Key: key, Params: mustStruct(t, lamp(2))})
				return err
			},
			"Complete": func(tn string) error {
				_, err := c.Complete(b.ctx, &intentv1.CompleteRequest{Tenant: tn, Key: key, Token: aliceToken, Result: orderRef})
				return err
			},
			"OpenSession": func(tn string) error {
				_, err := c.OpenSession(b.ctx, &intentv1.OpenSessionRequest{Tenant: tn, Worker: "bob"})
				return err
			},
		}
		for _, name := range slices.Sorted(maps.Keys(calls)) {
			t.Run(name, func(t *testing.T) {
				got := calls[name]("acme")
				checkError(t, got, codes.PermissionDenied, "PERMISSION_DENIED", "")
				// A tenant that exists nowhere gets the same answer: the
				// refusal says nothing about whether acme exists.
				other := calls[name]("initech")
				if g, w := strings.ReplaceAll(status.Convert(got).Message(), "acme", "T"), strings.ReplaceAll(status.Convert(other).Message(), "initech", "T"); g != w || status.Code(got) != status.Code(other) {
					t.Errorf("naming acme: %v; naming initech: %v; want the same answer", got, other)
				}
			})
		}
	})

	t.Run("alice's session", func(t *testing.T) {
		const madeUp = "694d5f8c1e2a3b40"
		calls := map[string]func(session string) error{
			"Heartbeat": func(s string) error {
				_, err := c.Heartbeat(b.ctx, &intentv1.HeartbeatRequest{SessionId: s})
				return err
			},
			"Acquire": func(s string) error {
				_, err := c.Acquire(b.ctx, &intentv1.AcquireRequest{Key: "bob-own", SessionId: s, RequestId: "probe-6"})
				return err
			},
			"CloseSession": func(s string) error {
				_, err := c.CloseSession(b.ctx, &intentv1.CloseSessionRequest{SessionId: s})
				return err
			},
		}
		for _, name := range slices.Sorted(maps.Keys(calls)) {
			t.Run(name, func(t *testing.T) {
				got, missing := calls[name](aliceSession), calls[name](madeUp)
				checkError(t, got, codes.NotFound, "SESSION_NOT_FOUND", "")
				if !bytes.Equal(answer(t, got), answer(t, missing)) {
					t.Errorf("bob using alice's session: %v; a made-up session: %v; want the same answer", got, missing)
				}
			})
		}
		if _, err := c.Heartbeat(a.ctx, &intentv1.HeartbeatRequest{SessionId: aliceSession, Leases: []*intentv1.HeldLease{{Key: key, Token: aliceToken}}}); err != nil {
			t.Errorf("alice's Heartbeat after bob's attempts: %v, want her session alive", err)
		}
	})

	t.Run("alice's intent is untouched", func(t *testing.T) {
		now := a.get(key)
		if now.GetRevision() != aliceIntent.GetRevision() || now.GetState() != intentv1.State_STATE_IN_PROGRESS || now.GetLease().GetToken() != aliceToken {
			t.Errorf("alice's %q is %v at revision %d token %d, want IN_PROGRESS at %d token %d as she left it",
				key, now.GetState(), now.GetRevision(), now.GetLease().GetToken(), aliceIntent.GetRevision(), aliceToken)
		}
		for _, h := range now.GetHistory() {
			if strings.Contains(h.GetPrincipal(), "bob") {
				t.Errorf("alice's history records bob: %v", h)
			}
		}
	})

	t.Run("nested registrations stay in the caller's tenant", func(t *testing.T) {
		s := a.session("alice-2")
		_, err := c.Acquire(a.ctx, &intentv1.AcquireRequest{Key: "nested", SessionId: s, RequestId: "r1",
			Register: &intentv1.RegisterRequest{Tenant: "globex", Key: "nested", Params: mustStruct(t, lamp(1))}})
		if code := status.Code(err); code != codes.InvalidArgument && code != codes.PermissionDenied {
			t.Errorf("alice Acquire registering into globex: %v, want INVALID_ARGUMENT or PERMISSION_DENIED", err)
		}
		_, err = c.Complete(a.ctx, &intentv1.CompleteRequest{Key: key, Token: aliceToken, Result: orderRef,
			Children: []*intentv1.RegisterRequest{{Tenant: "globex", Key: "child", Params: mustStruct(t, lamp(1))}}})
		if code := status.Code(err); code != codes.InvalidArgument && code != codes.PermissionDenied {
			t.Errorf("alice Complete with a child in globex: %v, want INVALID_ARGUMENT or PERMISSION_DENIED", err)
		}
		if now := a.get(key); now.GetRevision() != aliceIntent.GetRevision() {
			t.Errorf("the refused Complete changed alice's %q (revision %d, was %d)", key, now.GetRevision(), aliceIntent.GetRevision())
		}
		for _, k := range []string{"nested", "child"} {
			_, err := c.Get(b.ctx, &intentv1.GetRequest{Key: k})
			checkError(t, err, codes.NotFound, "INTENT_NOT_FOUND", "")
		}
	})

	t.Run("Watch", func(t *testing.T) {
		// Bob registers his own k, with other terms: it is new to him (no
		// fingerprint conflict gives alice's away), and it is the first
		// event either of his watches may see.
		reg, err := c.Register(b.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, lamp(7))})
		if err != nil {
			t.Fatalf("bob Register(%q): %v", key, err)
		}
		if !reg.GetCreated() || reg.GetIntent().GetTenant() != "globex" {
			t.Errorf("bob Register(%q): created=%v tenant %q, want a new intent in globex", key, reg.GetCreated(), reg.GetIntent().GetTenant())
		}
		marker := reg.GetIntent().GetRevision()
		replayKey, err := c.Watch(wctx, &intentv1.WatchRequest{Key: key, StartRevision: 1})
		if err != nil {
			t.Fatalf("bob Watch(%q, from 1): %v", key, err)
		}
		replayTenant, err := c.Watch(wctx, &intentv1.WatchRequest{StartRevision: aliceIntent.GetRevision()})
		if err != nil {
			t.Fatalf("bob Watch(tenant, from %d): %v", aliceIntent.GetRevision(), err)
		}
		for name, stream := range map[string]intentv1.IntentService_WatchClient{
			"tenant, live": watchTenant, "key, live": watchKey, "key, from revision 1": replayKey, "tenant, from alice's revision": replayTenant,
		} {
			ev, err := stream.Recv()
			if err != nil {
				t.Errorf("bob's watch (%s): %v, want his own registration", name, err)
				continue
			}
			if got := ev.GetIntent(); got.GetTenant() != "globex" || got.GetKey() != key || ev.GetRevision() != marker {
				t.Errorf("bob's watch (%s) first sees %s/%s at revision %d, want globex/%s at %d (nothing of acme before it)",
					name, got.GetTenant(), got.GetKey(), ev.GetRevision(), key, marker)
			}
		}
	})

	t.Run("two tenants must name one", func(t *testing.T) {
		cc := callAs(t, carol)
		_, err := c.Get(cc, &intentv1.GetRequest{Key: key})
		checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "tenant")
		_, err = c.List(cc, &intentv1.ListRequest{})
		checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "tenant")
		_, err = c.OpenSession(cc, &intentv1.OpenSessionRequest{Worker: "carol"})
		checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "tenant")
		stream, err := c.Watch(cc, &intentv1.WatchRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "tenant")

		got, err := c.Get(cc, &intentv1.GetRequest{Tenant: "acme", Key: key})
		if err != nil || got.GetIntent().GetRevision() != aliceIntent.GetRevision() {
			t.Errorf("carol Get(acme/%s) = %v, %v; want alice's intent", key, got.GetIntent().GetState(), err)
		}
	})
}

// TestAuthentication: no credentials, a wrong token and malformed
// authorization headers are UNAUTHENTICATED, for unary and streaming calls;
// the guard logs each failure without the credential it was given.
func TestAuthentication(t *testing.T) {
	reader := member{name: "reader-1", tenants: []string{"acme"}, roles: []access.Role{access.RoleReader}, token: "tok-reader-c0ffee-4bd2"}
	c, logs := serveGuarded(t, etcdtest.Start(t), directory(t, reader), server.RateLimits{})
	basic := base64.StdEncoding.EncodeToString([]byte("reader-1:" + reader.token))
	tests := []struct {
		name   string
		header []string // authorization header values; none: no credentials
		secret string   // what must never appear in the log
	}{
		{"no credentials", nil, ""},
		{"wrong token", []string{"Bearer wrong-token-7e11"}, "wrong-token-7e11"},
		{"the right token with a suffix", []string{"Bearer " + reader.token + "x"}, reader.token},
		{"the right token's hash", []string{"Bearer " + access.HashToken(reader.token)}, access.HashToken(reader.token)},
		{"empty bearer", []string{"Bearer "}, ""},
		{"scheme only", []string{"Bearer"}, ""},
		{"no scheme", []string{reader.token}, reader.token},
		{"basic scheme", []string{"Basic " + basic}, basic},
		{"scheme glued to the token", []string{"Bearer" + reader.token}, reader.token},
		{"two spaces", []string{"Bearer  " + reader.token}, reader.token},
		{"empty header", []string{""}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, h := range tc.header {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", h)
			}
			_, err := c.Get(ctx, &intentv1.GetRequest{Key: "k"})
			checkError(t, err, codes.Unauthenticated, "UNAUTHENTICATED", "")
			stream, err := c.Watch(ctx, &intentv1.WatchRequest{Key: "k"})
			if err == nil {
				_, err = stream.Recv()
			}
			checkError(t, err, codes.Unauthenticated, "UNAUTHENTICATED", "")
			_, err = c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: "buy", Identity: mustStruct(t, map[string]any{"order": "1"})})
			checkError(t, err, codes.Unauthenticated, "UNAUTHENTICATED", "")
			if tc.secret != "" {
				if _, detail, _ := strings.Cut(status.Convert(err).Message(), "unauthenticated"); strings.Contains(detail, tc.secret) {
					t.Errorf("the refusal repeats the credential: %v", err)
				}
			}
		})
	}

	t.Run("the right token", func(t *testing.T) {
		ctx := asMember(context.Background(), reader)
		_, err := c.Get(ctx, &intentv1.GetRequest{Key: "k"})
		checkError(t, err, codes.NotFound, "INTENT_NOT_FOUND", "")
		if _, err := c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: "buy", Identity: mustStruct(t, map[string]any{"order": "1"})}); err != nil {
			t.Errorf("DeriveKey with the right token: %v", err)
		}
	})

	out := logs.String()
	if n, want := strings.Count(out, "authentication failed"), 3*len(tests); n != want {
		t.Errorf("the log records %d authentication failures, want %d:\n%s", n, want, out)
	}
	for _, tc := range tests {
		if tc.secret != "" && strings.Contains(out, tc.secret) {
			t.Errorf("the log contains the credential of %q (%s):\n%s", tc.name, tc.secret, out)
		}
	}
	if strings.Contains(out, reader.token) {
		t.Errorf("the log contains the reader's token:\n%s", out)
	}
}

// retryDelay returns the RetryInfo delay a status carries, 0 without one.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// rateLimited reports whether err is a rate limit refusal as documented:
// RESOURCE_EXHAUSTED, reason RATE_LIMITED, a positive RetryInfo delay. It
// returns the limit named.
func rateLimited(err error) (limit string, ok bool) {
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		return "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.GetReason() == "RATE_LIMITED" && retryDelay(err) > 0 {
			return info.GetMetadata()["limit"], true
		}
	}
	return "", false
}

// TestNoisyTenantCannotStarveAnother: tenant noisy fires many times its
// limit from several goroutines and two principals; each refusal is
// RATE_LIMITED with a retry delay, no more than its budget gets through,
// and tenant quiet's calls in the same second all succeed.
func TestNoisyTenantCannotStarveAnother(t *testing.T) {
	const tenantRate, tenantBurst = 20, 20
	noisy1 := member{name: "noisy-1", tenants: []string{"noisy"}, roles: []access.Role{access.RoleReader}, token: "tok-noisy-1-aa"}
	noisy2 := member{name: "noisy-2", tenants: []string{"noisy"}, roles: []access.Role{access.RoleReader}, token: "tok-noisy-2-bb"}
	quiet := member{name: "quiet-1", tenants: []string{"quiet"}, roles: []access.Role{access.RoleReader}, token: "tok-quiet-1-cc"}
	quietAdmin := member{name: "quiet-admin", tenants: []string{"quiet"}, roles: []access.Role{access.RoleAdmin}, token: "tok-quiet-admin-dd"}
	e := etcdtest.Start(t)
	c, _ := serveGuarded(t, e, directory(t, noisy1, noisy2, quiet, quietAdmin), server.RateLimits{
		PerTenant: tenantRate, TenantBurst: tenantBurst, PerPrincipal: 100, PrincipalBurst: 100,
	})
	fxAs(t, c, quietAdmin).register("q", lamp(1))
	time.Sleep(100 * time.Millisecond) // quiet's bucket refills the registration

	const window = time.Second
	var passed, limited, attempts atomic.Int64
	var mu sync.Mutex
	var odd []error
	limits := map[string]int{}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 8 {
		m := noisy1
		if i%2 == 1 {
			m = noisy2
		}
		wg.Go(func() {
			ctx := asMember(context.Background(), m)
			// At least the window, and on a loaded machine (slow calls)
			// on until noisy has asked twice what it may, up to 5s.
			enough := func() bool {
				el := time.Since(start)
				return el >= 5*time.Second || (el >= window && attempts.Load() >= 2*int64(tenantBurst+tenantRate*el.Seconds()+1))
			}
			for !enough() {
				attempts.Add(1)
				_, err := c.Get(ctx, &intentv1.GetRequest{Key: "n"})
				if limit, ok := rateLimited(err); ok {
					limited.Add(1)
					mu.Lock()
					limits[limit]++
					mu.Unlock()
					continue
				}
				if status.Code(err) != codes.NotFound {
					mu.Lock()
					odd = append(odd, err)
					mu.Unlock()
					continue
				}
				passed.Add(1)
			}
		})
	}
	var quietErrs []error
	wg.Go(func() {
		ctx := asMember(context.Background(), quiet)
		for i := range 20 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * window / 20)))
			if _, err := c.Get(ctx, &intentv1.GetRequest{Key: "q"}); err != nil {
				quietErrs = append(quietErrs, err)
			}
		}
	})
	wg.Wait()
	elapsed := time.Since(start)

	if len(quietErrs) > 0 {
		t.Errorf("%d of quiet's 20 Gets failed while noisy was throttled, first: %v", len(quietErrs), quietErrs[0])
	}
	if len(odd) > 0 {
		t.Errorf("%d noisy calls failed neither NOT_FOUND nor RATE_LIMITED with a retry delay, first: %v", len(odd), odd[0])
	}
	budget := int64(tenantBurst + tenantRate*elapsed.Seconds() + 1)
	if got := attempts.Load(); got < 2*budget {
		t.Errorf("noisy made %d calls in %v, want at least twice its budget of %d to test anything", got, elapsed, budget)
	}
	if got := passed.Load(); got > budget {
		t.Errorf("%d of noisy's calls got through in %v, want at most its budget of %d", got, elapsed, budget)
	}
	if limited.Load() == 0 {
		t.Error("no noisy call was rate limited")
	}
	if limits["tenant:noisy"] == 0 {
		t.Errorf("refusals by limit %v, want the tenant:noisy limit among them", limits)
	}
	t.Logf("noisy: %d calls, %d through, %d limited %v, in %v", attempts.Load(), passed.Load(), limited.Load(), limits, elapsed)
}

// TestPrincipalRateLimit: one principal past its own limit is refused with
// the principal's limit named, while another principal of the same tenant
// is not.
func TestPrincipalRateLimit(t *testing.T) {
	greedy := member{name: "greedy", tenants: []string{"acme"}, roles: []access.Role{access.RoleReader}, token: "tok-greedy-ee"}
	modest := member{name: "modest", tenants: []string{"acme"}, roles: []access.Role{access.RoleReader}, token: "tok-modest-ff"}
	c, _ := serveGuarded(t, etcdtest.Start(t), directory(t, greedy, modest), server.RateLimits{PerPrincipal: 5, PrincipalBurst: 5})
	var through int
	for range 50 {
		_, err := c.DeriveKey(asMember(context.Background(), greedy), &intentv1.DeriveKeyRequest{Action: "a", Identity: mustStruct(t, map[string]any{"x": 1})})
		if err == nil {
			through++
			continue
		}
		if limit, ok := rateLimited(err); !ok || limit != "principal:greedy" {
			t.Fatalf("greedy's call: %v (limit %q), want RATE_LIMITED on principal:greedy with a retry delay", err, limit)
		}
	}
	if through < 5 || through > 7 {
		t.Errorf("%d of greedy's 50 quick calls got through, want its burst of 5 (give or take the refill)", through)
	}
	for i := range 5 {
		if _, err := c.Get(asMember(context.Background(), modest), &intentv1.GetRequest{Key: "k"}); status.Code(err) != codes.NotFound {
			t.Errorf("modest's call %d: %v, want NOT_FOUND (past the guard)", i, err)
		}
	}
}

// A rate-limit refusal said "retry in 0s": the delay to the next token is
// often under a millisecond, and the text rounded it down (the RetryInfo
// said a few hundred microseconds). At 2,000 calls a second every delay is
// under half a millisecond; each refusal must now say at least 1ms, in
// whole milliseconds, the same in its text and its RetryInfo.
func TestRateLimitRetryIsNotZero(t *testing.T) {
	hasty := member{name: "hasty", tenants: []string{"acme"}, roles: []access.Role{access.RoleReader}, token: "tok-hasty-aa"}
	c, _ := serveGuarded(t, etcdtest.Start(t), directory(t, hasty), server.RateLimits{PerPrincipal: 2000, PrincipalBurst: 1})
	var mu sync.Mutex
	var refusals []error
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 40 {
				_, err := c.DeriveKey(callAs(t, hasty), &intentv1.DeriveKeyRequest{Action: "buy", Identity: mustStruct(t, map[string]any{"order": "1"})})
				if status.Code(err) == codes.ResourceExhausted {
					mu.Lock()
					refusals = append(refusals, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(refusals) == 0 {
		t.Fatal("320 calls at 2,000/s with a burst of 1 were never rate limited")
	}
	for _, err := range refusals {
		delay := retryDelay(err)
		_, text, _ := strings.Cut(status.Convert(err).Message(), "retry in ")
		said, perr := time.ParseDuration(text)
		if delay < time.Millisecond || delay%time.Millisecond != 0 || perr != nil || said != delay {
			t.Fatalf("refusal %q with RetryInfo %v: want a whole number of milliseconds, at least 1ms, the same in the text", status.Convert(err).Message(), delay)
		}
	}
}
