package client_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// keyFor is a new intent key for t (and suffix): the test's name, with every
// byte a key may not hold replaced by '-', and a sequence number after the
// first, so that each call (and each run under -count) has a key of its own.
func keyFor(t testing.TB, suffix string) string {
	const punct = "-_.:/=@+"
	b := []byte(t.Name() + suffix)
	for i, c := range b {
		alnum := ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
		if !alnum && strings.IndexByte(punct, c) < 0 {
			b[i] = '-'
		}
	}
	keysMu.Lock()
	defer keysMu.Unlock()
	n := keys[string(b)]
	keys[string(b)] = n + 1
	if n == 0 {
		return string(b)
	}
	return fmt.Sprintf("%s.%d", b, n)
}

var (
	keysMu sync.Mutex
	keys   = map[string]int{} // keys handed out, by their base
)

// testContext bounds a test's calls, so that a client that retries what it
// should not fails the test instead of hanging it.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newClient dials the test intentd; the connection closes with t.
func newClient(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	conn := dial()
	t.Cleanup(func() { _ = conn.Close() })
	return client.New(conn, opts...)
}

// newFaultyClient dials the test intentd through f's interceptor.
func newFaultyClient(t testing.TB, f *faults, opts ...client.Option) *client.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(f.intercept))
	if err != nil {
		t.Fatalf("grpc.NewClient(%q) = %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return client.New(conn, opts...)
}

// openSession opens a worker session that closes with t.
func openSession(t testing.TB, c *client.Client, worker string, ttl time.Duration) *client.Session {
	t.Helper()
	s, err := c.OpenSession(testContext(t), worker, ttl)
	if err != nil {
		t.Fatalf("OpenSession(%q, %v) = %v", worker, ttl, err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// requestID is a fresh Acquire request id.
func requestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// params are approved terms; quantity tells two approvals apart.
func params(t testing.TB, quantity int) *structpb.Struct {
	t.Helper()
	p, err := structpb.NewStruct(map[string]any{"item": "desk lamp", "quantity": quantity, "merchant": "M", "max_amount": "89.00"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func register(t testing.TB, c *client.Client, key string) *intentv1.Intent {
	t.Helper()
	resp, err := c.Register(testContext(t), &intentv1.RegisterRequest{Key: key, Params: params(t, 1)})
	if err != nil {
		t.Fatalf("Register(%q) = %v", key, err)
	}
	return resp.GetIntent()
}

func acquire(t testing.TB, c *client.Client, sessionID, key string) *intentv1.AcquireResponse {
	t.Helper()
	resp, err := c.Acquire(testContext(t), &intentv1.AcquireRequest{Key: key, SessionId: sessionID, RequestId: requestID()})
	if err != nil {
		t.Fatalf("Acquire(%q) = %v", key, err)
	}
	return resp
}

func get(t testing.TB, c *client.Client, key string) *intentv1.Intent {
	t.Helper()
	resp, err := c.Get(testContext(t), &intentv1.GetRequest{Key: key})
	if err != nil {
		t.Fatalf("Get(%q) = %v", key, err)
	}
	return resp.GetIntent()
}

// entries lists the history entries of one kind with the given acceptance.
func entries(in *intentv1.Intent, kind intentv1.HistoryEntry_Kind, accepted bool) []*intentv1.HistoryEntry {
	var out []*intentv1.HistoryEntry
	for _, e := range in.GetHistory() {
		if e.GetKind() == kind && e.GetAccepted() == accepted {
			out = append(out, e)
		}
	}
	return out
}

// orderResult is what a merchant's order id becomes in a Result.
func orderResult(id string) *intentv1.Result {
	return &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": id}}
}

// sentinels are every error a refused call may match.
var sentinels = map[string]error{
	"ErrInvalidArgument":     client.ErrInvalidArgument,
	"ErrNotFound":            client.ErrNotFound,
	"ErrSessionNotFound":     client.ErrSessionNotFound,
	"ErrFingerprintMismatch": client.ErrFingerprintMismatch,
	"ErrInvalidTransition":   client.ErrInvalidTransition,
	"ErrResultMismatch":      client.ErrResultMismatch,
	"ErrStaleToken":          client.ErrStaleToken,
	"ErrExpired":             client.ErrExpired,
	"ErrLeaseHeld":           client.ErrLeaseHeld,
	"ErrCompacted":           client.ErrCompacted,
	"ErrUnavailable":         client.ErrUnavailable,
	"ErrUnauthenticated":     client.ErrUnauthenticated,
	"ErrPermissionDenied":    client.ErrPermissionDenied,
	"ErrResourceExhausted":   client.ErrResourceExhausted,
	"ErrInternal":            client.ErrInternal,
}

// checkSentinel fails t unless err matches want and no other sentinel.
func checkSentinel(t testing.TB, err, want error) {
	t.Helper()
	for name, s := range sentinels {
		if got := errors.Is(err, s); got != (s == want) {
			t.Errorf("errors.Is(%v, client.%s) = %t, want %t", err, name, got, s == want)
		}
	}
}

// TestErrorMapping drives real refusals out of intentd and checks that each
// matches exactly its sentinel, with the code, field, current token and
// statement that come with it.
func TestErrorMapping(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "mapper", 0)

	tests := []struct {
		name  string
		call  func(t *testing.T, key string) error
		want  error
		code  codes.Code
		field string                                          // for ErrInvalidArgument
		check func(t *testing.T, key string, e *client.Error) // extra checks
	}{
		{
			name: "register with other params",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: params(t, 2)})
				return err
			},
			want: client.ErrFingerprintMismatch, code: codes.FailedPrecondition,
		},
		{
			name: "acquire with another expected fingerprint",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				_, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: sess.ID(), RequestId: requestID(), ExpectedFingerprint: strings.Repeat("0", 64)})
				return err
			},
			want: client.ErrFingerprintMismatch, code: codes.FailedPrecondition,
		},
		{
			name: "get of an unregistered key",
			call: func(t *testing.T, key string) error {
				_, err := c.Get(ctx, &intentv1.GetRequest{Key: key})
				return err
			},
			want: client.ErrNotFound, code: codes.NotFound,
		},
		{
			name: "acquire of an unregistered key",
			call: func(t *testing.T, key string) error {
				_, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: sess.ID(), RequestId: requestID()})
				return err
			},
			want: client.ErrNotFound, code: codes.NotFound,
		},
		{
			name: "acquire under a closed session",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				open, err := c.RPC().OpenSession(ctx, &intentv1.OpenSessionRequest{Worker: "short-lived"})
				if err != nil {
					t.Fatalf("OpenSession = %v", err)
				}
				if _, err := c.RPC().CloseSession(ctx, &intentv1.CloseSessionRequest{SessionId: open.GetSessionId()}); err != nil {
					t.Fatalf("CloseSession = %v", err)
				}
				_, err = c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: open.GetSessionId(), RequestId: requestID()})
				return err
			},
			want: client.ErrSessionNotFound, code: codes.NotFound,
		},
		{
			name: "register without params",
			call: func(t *testing.T, key string) error {
				_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: key})
				return err
			},
			want: client.ErrInvalidArgument, code: codes.InvalidArgument, field: "params",
		},
		{
			name: "acquire registering without params",
			call: func(t *testing.T, key string) error {
				_, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: sess.ID(), RequestId: requestID(), Register: &intentv1.RegisterRequest{Key: key}})
				return err
			},
			want: client.ErrInvalidArgument, code: codes.InvalidArgument, field: "register.params",
		},
		{
			name: "complete without a token",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				_, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Result: orderResult("SO-1")})
				return err
			},
			want: client.ErrInvalidArgument, code: codes.InvalidArgument, field: "token",
		},
		{
			name: "get with a malformed key",
			call: func(t *testing.T, key string) error {
				_, err := c.Get(ctx, &intentv1.GetRequest{Key: key + " with spaces"})
				return err
			},
			want: client.ErrInvalidArgument, code: codes.InvalidArgument, field: "key",
		},
		{
			name: "complete under a superseded token",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				first := acquire(t, c, sess.ID(), key)
				if _, err := c.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Key: key, Token: first.GetLease().GetToken(), Reason: "timeout"}); err != nil {
					t.Fatalf("MarkUnknown = %v", err)
				}
				second := acquire(t, c, sess.ID(), key)
				if second.GetOutcome() != intentv1.Outcome_OUTCOME_RECONCILE {
					t.Fatalf("second Acquire outcome = %v, want OUTCOME_RECONCILE", second.GetOutcome())
				}
				_, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: first.GetLease().GetToken(), Result: orderResult("SO-1")})
				return err
			},
			want: client.ErrStaleToken, code: codes.Aborted,
			check: func(t *testing.T, key string, e *client.Error) {
				in := get(t, c, key)
				current := in.GetLease().GetToken()
				if got := e.CurrentToken(); got != fencing.Token(current) {
					t.Errorf("CurrentToken() = %v, want %v (the reconciler's)", got, current)
				}
				if e.Statement == nil {
					t.Fatalf("Statement = nil, want the intent's account")
				}
				if got := e.Statement.GetIntentKey(); got != key {
					t.Errorf("Statement.IntentKey = %q, want %q", got, key)
				}
				if got := e.Statement.GetCurrentToken(); got != current {
					t.Errorf("Statement.CurrentToken = %d, want %d", got, current)
				}
				if got := e.Statement.GetActionTaken(); got != "evidence_recorded" {
					t.Errorf("Statement.ActionTaken = %q, want evidence_recorded", got)
				}
				if got := len(entries(in, intentv1.HistoryEntry_KIND_COMPLETED, false)); got != 1 {
					t.Errorf("refused completions in history = %d, want 1 (kept as evidence)", got)
				}
			},
		},
		{
			name: "cancel a completed intent",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				a := acquire(t, c, sess.ID(), key)
				if _, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: a.GetLease().GetToken(), Result: orderResult("SO-1")}); err != nil {
					t.Fatalf("Complete = %v", err)
				}
				_, err := c.Cancel(ctx, &intentv1.CancelRequest{Key: key, Actor: "approver", Reason: "changed my mind"})
				return err
			},
			want: client.ErrInvalidTransition, code: codes.FailedPrecondition,
			check: func(t *testing.T, key string, e *client.Error) {
				if got := e.Statement.GetState(); got != intentv1.State_STATE_COMPLETED {
					t.Errorf("Statement.State = %v, want STATE_COMPLETED", got)
				}
			},
		},
		{
			name: "complete again with another result",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				a := acquire(t, c, sess.ID(), key)
				if _, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: a.GetLease().GetToken(), Result: orderResult("SO-1")}); err != nil {
					t.Fatalf("Complete = %v", err)
				}
				_, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: a.GetLease().GetToken(), Result: orderResult("SO-2")})
				return err
			},
			want: client.ErrResultMismatch, code: codes.FailedPrecondition,
		},
		{
			name: "resolve a held intent without force",
			call: func(t *testing.T, key string) error {
				register(t, c, key)
				acquire(t, c, sess.ID(), key)
				_, err := c.Resolve(ctx, &intentv1.ResolveRequest{Key: key, Decision: intentv1.Decision_DECISION_PENDING, Actor: "reviewer", Reason: "retry it"})
				return err
			},
			want: client.ErrLeaseHeld, code: codes.FailedPrecondition,
		},
		{
			name: "register again after retention",
			call: func(t *testing.T, key string) error {
				reg := &intentv1.RegisterRequest{Key: key, Params: params(t, 1), Retention: durationpb.New(time.Second)}
				if _, err := c.Register(ctx, reg); err != nil {
					t.Fatalf("Register = %v", err)
				}
				a := acquire(t, c, sess.ID(), key)
				if _, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: a.GetLease().GetToken(), Result: orderResult("SO-1")}); err != nil {
					t.Fatalf("Complete = %v", err)
				}
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					if _, err := c.Get(ctx, &intentv1.GetRequest{Key: key}); err != nil {
						break // removed: a tombstone remains
					}
				}
				_, err := c.Register(ctx, reg)
				return err
			},
			want: client.ErrExpired, code: codes.FailedPrecondition,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key := keyFor(t, "")
			err := tt.call(t, key)
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("error = %v (%T), want a *client.Error matching %v", err, err, tt.want)
			}
			checkSentinel(t, err, tt.want)
			if e.Code != tt.code {
				t.Errorf("Code = %v, want %v", e.Code, tt.code)
			}
			if e.Field != tt.field {
				t.Errorf("Field = %q, want %q", e.Field, tt.field)
			}
			if tt.check != nil {
				tt.check(t, key, e)
			}
		})
	}
}

// faults is a unary client interceptor that injects failures into the calls
// of the methods it has rules for, and counts their attempts.
type faults struct {
	mu    sync.Mutex
	rules map[string]*rule // by method name: "Acquire"
}

// rule is what faults does to one method's attempts. Its settings are fixed
// once set; attempts and lost change under faults.mu.
type rule struct {
	hang   int           // the first hang attempts wait out their deadline, unsent
	fail   int           // then the first fail attempts get code, unsent (-1: every one)
	code   codes.Code    // what fail returns
	reason string        // and the ErrorInfo reason it carries, if any
	lose   int           // the first lose attempts are sent, and their reply is lost
	onLose func()        // called after a reply is lost
	notify chan struct{} // gets a value on every attempt, if there is room

	attempts int
	lost     []proto.Message
}

func (f *faults) set(method string, r *rule) *rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rules == nil {
		f.rules = map[string]*rule{}
	}
	f.rules[method] = r
	return r
}

func (f *faults) attempts(r *rule) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return r.attempts
}

func (f *faults) lost(r *rule) []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), r.lost...)
}

func (f *faults) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	f.mu.Lock()
	r := f.rules[path.Base(method)]
	if r == nil {
		f.mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	r.attempts++
	n := r.attempts
	f.mu.Unlock()
	if r.notify != nil {
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}
	if n <= r.hang {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	if r.fail < 0 || n-r.hang <= r.fail {
		st := status.New(r.code, "injected "+r.code.String())
		if r.reason != "" {
			st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: r.reason, Domain: "intentd"})
		}
		return st.Err()
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && n <= r.lose {
		f.mu.Lock()
		r.lost = append(r.lost, proto.Clone(reply.(proto.Message)))
		f.mu.Unlock()
		if r.onLose != nil {
			r.onLose()
		}
		return status.Error(codes.Unavailable, "injected: the reply was lost")
	}
	return err
}

// TestRetryUntilAnswered: a call intentd did not answer (UNAVAILABLE before
// sending, or an attempt that ran out its own deadline) is sent again until
// it is answered.
func TestRetryUntilAnswered(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		rule         rule
		wantAttempts int
	}{
		{name: "unavailable three times", rule: rule{fail: 3, code: codes.Unavailable}, wantAttempts: 4},
		{name: "deadline exceeded twice", rule: rule{fail: 2, code: codes.DeadlineExceeded}, wantAttempts: 3},
		{name: "attempt hangs past its deadline", rule: rule{hang: 1}, wantAttempts: 2},
		{name: "hang then unavailable", rule: rule{hang: 1, fail: 2, code: codes.Unavailable}, wantAttempts: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &faults{}
			c := newFaultyClient(t, f, client.WithBackoff(time.Millisecond, 5*time.Millisecond), client.WithCallTimeout(300*time.Millisecond))
			key := keyFor(t, "")
			r := f.set("Register", &tt.rule)
			resp, err := c.Register(testContext(t), &intentv1.RegisterRequest{Key: key, Params: params(t, 1)})
			if err != nil {
				t.Fatalf("Register = %v, want success after retries", err)
			}
			if got := f.attempts(r); got != tt.wantAttempts {
				t.Errorf("attempts = %d, want %d", got, tt.wantAttempts)
			}
			if got := resp.GetIntent().GetState(); got != intentv1.State_STATE_PENDING {
				t.Errorf("state = %v, want STATE_PENDING", got)
			}
		})
	}
}

// TestReportsResentWhileRateLimited: a report under a token is sent again
// while intentd refuses it as RATE_LIMITED (the effect it records may have
// happened; a rate-limited call did nothing); any other call returns the
// refusal after one attempt.
func TestReportsResentWhileRateLimited(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	setup := newClient(t)
	sess := openSession(t, setup, "rate-limited", 0)
	limited := func(n int) *rule { return &rule{fail: n, code: codes.ResourceExhausted, reason: "RATE_LIMITED"} }

	f := &faults{}
	c := newFaultyClient(t, f, client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	key := keyFor(t, "")
	register(t, setup, key)
	lease := acquire(t, setup, sess.ID(), key)
	r := f.set("Complete", limited(3))
	if _, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: lease.GetLease().GetToken(), Result: orderResult("SO-1")}); err != nil {
		t.Fatalf("Complete = %v, want it recorded once intentd took it", err)
	}
	if got := f.attempts(r); got != 4 {
		t.Errorf("Complete attempts = %d, want 4 (three refused, then recorded)", got)
	}
	if got := get(t, setup, key).GetState(); got != intentv1.State_STATE_COMPLETED {
		t.Errorf("state = %v, want STATE_COMPLETED", got)
	}

	r = f.set("Register", limited(-1))
	_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: keyFor(t, "other"), Params: params(t, 1)})
	if !errors.Is(err, client.ErrRateLimited) {
		t.Errorf("Register = %v, want ErrRateLimited", err)
	}
	if got := f.attempts(r); got != 1 {
		t.Errorf("Register attempts = %d, want 1 (only reports wait out a rate limit)", got)
	}
}

// TestRetryAfterLostReply: when intentd acted but its answer was lost, the
// retry gets the first answer back: Acquire the same lease (by request id),
// Complete the same completion, and the history shows each once.
func TestRetryAfterLostReply(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	f := &faults{}
	c := newFaultyClient(t, f, client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	sess := openSession(t, c, "lossy", 0)
	key := keyFor(t, "")
	register(t, c, key)

	acq := f.set("Acquire", &rule{lose: 2})
	got, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: sess.ID(), RequestId: requestID()})
	if err != nil {
		t.Fatalf("Acquire = %v, want success after lost replies", err)
	}
	if n := f.attempts(acq); n != 3 {
		t.Errorf("Acquire attempts = %d, want 3", n)
	}
	if got.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
		t.Fatalf("Acquire outcome = %v, want OUTCOME_EXECUTE", got.GetOutcome())
	}
	for i, m := range f.lost(acq) {
		lost := m.(*intentv1.AcquireResponse)
		if lost.GetLease().GetToken() != got.GetLease().GetToken() || lost.GetOutcome() != got.GetOutcome() {
			t.Errorf("lost reply %d: %v token %d; the retry got %v token %d, want the same lease",
				i, lost.GetOutcome(), lost.GetLease().GetToken(), got.GetOutcome(), got.GetLease().GetToken())
		}
	}
	if n := len(entries(get(t, c, key), intentv1.HistoryEntry_KIND_ACQUIRED, true)); n != 1 {
		t.Errorf("acquisitions in history = %d, want 1", n)
	}

	comp := f.set("Complete", &rule{lose: 2})
	done, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: got.GetLease().GetToken(), Result: orderResult("SO-7")})
	if err != nil {
		t.Fatalf("Complete = %v, want success after lost replies", err)
	}
	if n := f.attempts(comp); n != 3 {
		t.Errorf("Complete attempts = %d, want 3", n)
	}
	if lost := f.lost(comp); len(lost) == 0 || lost[0].(*intentv1.CompleteResponse).GetActionTaken() != "recorded" {
		t.Errorf("first Complete reply (lost) = %v, want action_taken recorded", lost)
	}
	if got, want := done.GetActionTaken(), "none"; got != want {
		t.Errorf("retried Complete action_taken = %q, want %q (a replay)", got, want)
	}
	in := get(t, c, key)
	if got := in.GetState(); got != intentv1.State_STATE_COMPLETED {
		t.Errorf("state = %v, want STATE_COMPLETED", got)
	}
	if n := len(entries(in, intentv1.HistoryEntry_KIND_COMPLETED, true)); n != 1 {
		t.Errorf("accepted completions in history = %d, want 1", n)
	}
	if n := len(entries(in, intentv1.HistoryEntry_KIND_COMPLETED, false)); n != 0 {
		t.Errorf("refused completions in history = %d, want 0", n)
	}
}

// TestRunAfterLostReplies: Run survives lost Acquire and Complete replies
// and still executes once, under one lease.
func TestRunAfterLostReplies(t *testing.T) {
	t.Parallel()
	f := &faults{}
	c := newFaultyClient(t, f, client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	sess := openSession(t, c, "lossy-runner", 0)
	key := keyFor(t, "")
	register(t, c, key)
	acq := f.set("Acquire", &rule{lose: 1})
	comp := f.set("Complete", &rule{lose: 1})
	shop := newShop()
	out, err := sess.Run(testContext(t), client.Task{Key: key, Execute: shop.execute})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || !out.Executed {
		t.Errorf("Run = %v executed %t, want OUTCOME_COMPLETED executed true", out.Outcome, out.Executed)
	}
	if a, c := f.attempts(acq), f.attempts(comp); a != 2 || c != 2 {
		t.Errorf("attempts: Acquire %d, Complete %d; want 2 and 2", a, c)
	}
	if n := shop.calls(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
	in := get(t, c, key)
	if n := len(entries(in, intentv1.HistoryEntry_KIND_ACQUIRED, true)); n != 1 {
		t.Errorf("acquisitions in history = %d, want 1", n)
	}
	if n := len(entries(in, intentv1.HistoryEntry_KIND_COMPLETED, true)); n != 1 {
		t.Errorf("accepted completions in history = %d, want 1", n)
	}
}

// TestNoRetryOnRefusal: a refusal is returned after one attempt, whether
// injected or intentd's own.
func TestNoRetryOnRefusal(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	setup := newClient(t)
	sess := openSession(t, setup, "refused", 0)
	tests := []struct {
		name   string
		method string
		rule   rule // fail 0: nothing injected, intentd itself refuses
		call   func(t *testing.T, c *client.Client, key string) error
		want   error
		code   codes.Code
	}{
		{
			name: "injected failed precondition", method: "Get", rule: rule{fail: 1, code: codes.FailedPrecondition},
			call: func(t *testing.T, c *client.Client, key string) error {
				_, err := c.Get(ctx, &intentv1.GetRequest{Key: key})
				return err
			},
			code: codes.FailedPrecondition,
		},
		{
			name: "injected invalid argument", method: "Get", rule: rule{fail: 1, code: codes.InvalidArgument},
			call: func(t *testing.T, c *client.Client, key string) error {
				_, err := c.Get(ctx, &intentv1.GetRequest{Key: key})
				return err
			},
			want: client.ErrInvalidArgument, code: codes.InvalidArgument,
		},
		{
			name: "injected permission denied", method: "Get", rule: rule{fail: 1, code: codes.PermissionDenied},
			call: func(t *testing.T, c *client.Client, key string) error {
				_, err := c.Get(ctx, &intentv1.GetRequest{Key: key})
				return err
			},
			want: client.ErrPermissionDenied, code: codes.PermissionDenied,
		},
		{
			name: "injected aborted", method: "Complete", rule: rule{fail: 1, code: codes.Aborted},
			call: func(t *testing.T, c *client.Client, key string) error {
				_, err := c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: 1, Result: orderResult("SO-1")})
				return err
			},
			code: codes.Aborted,
		},
		{
			name: "fingerprint mismatch", method: "Register",
			call: func(t *testing.T, c *client.Client, key string) error {
				register(t, setup, key)
				_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: params(t, 3)})
				return err
			},
			want: client.ErrFingerprintMismatch, code: codes.FailedPrecondition,
		},
		{
			name: "malformed key", method: "Get",
			call: func(t *testing.T, c *client.Client, key string) error {
				_, err := c.Get(ctx, &intentv1.GetRequest{Key: "not a key"})
				return err
			},
			want: client.ErrInvalidArgument, code: codes.InvalidArgument,
		},
		{
			name: "stale token", method: "Fail",
			call: func(t *testing.T, c *client.Client, key string) error {
				register(t, setup, key)
				first := acquire(t, setup, sess.ID(), key)
				if _, err := setup.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Key: key, Token: first.GetLease().GetToken(), Reason: "timeout"}); err != nil {
					t.Fatalf("MarkUnknown = %v", err)
				}
				acquire(t, setup, sess.ID(), key)
				_, err := c.Fail(ctx, &intentv1.FailRequest{Key: key, Token: first.GetLease().GetToken(), Failure: &intentv1.Failure{Code: "card_declined"}})
				return err
			},
			want: client.ErrStaleToken, code: codes.Aborted,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &faults{}
			c := newFaultyClient(t, f, client.WithBackoff(time.Millisecond, 5*time.Millisecond))
			r := f.set(tt.method, &tt.rule) // setup calls go through another client
			err := tt.call(t, c, keyFor(t, ""))
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("error = %v (%T), want a *client.Error", err, err)
			}
			if e.Code != tt.code {
				t.Errorf("Code = %v, want %v", e.Code, tt.code)
			}
			checkSentinel(t, err, tt.want) // nil: a code without a sentinel matches none
			if got := f.attempts(r); got != 1 {
				t.Errorf("attempts = %d, want 1 (a refusal is never retried)", got)
			}
		})
	}
}

// TestRetryStopsWhenContextEnds: against an intentd that never answers, a
// call returns promptly once the caller's context ends during a backoff.
func TestRetryStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	f := &faults{}
	c := newFaultyClient(t, f, client.WithBackoff(time.Second, 2*time.Second))
	r := f.set("Get", &rule{fail: -1, code: codes.Unavailable, notify: make(chan struct{}, 100)})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, &intentv1.GetRequest{Key: keyFor(t, "")})
		errc <- err
	}()
	<-r.notify                         // the first attempt failed;
	time.Sleep(100 * time.Millisecond) // the call backs off (at least 500ms)
	cancelled := time.Now()
	cancel()
	select {
	case err := <-errc:
		if took := time.Since(cancelled); took > 100*time.Millisecond {
			t.Errorf("returned %v after the context was cancelled, want within 100ms", took)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("call still retrying 5s after its context was cancelled")
	}
	if got := f.attempts(r); got != 1 {
		t.Errorf("attempts = %d, want 1 (none after the cancel)", got)
	}

	// A deadline ends the retries the same way.
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, &intentv1.GetRequest{Key: keyFor(t, "")})
	if took := time.Since(start); took > 400*time.Millisecond {
		t.Errorf("returned %v after start, want within 100ms of the 300ms deadline", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error = %v, want context.DeadlineExceeded", err)
	}
}

// A Watch whose context ends before its stream is open returns the
// context's error, as one that ends while it is read does: intentctl watch
// interrupted as it connected once exited 1 on gRPC's Canceled status.
func TestWatchCancelledWhileOpening(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	for name, ctx := range map[string]context.Context{
		"cancelled": func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}(),
		"deadline passed": func() context.Context {
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			t.Cleanup(cancel)
			return ctx
		}(),
	} {
		err := c.Watch(ctx, &intentv1.WatchRequest{Key: keyFor(t, name)}, func(*intentv1.WatchResponse) bool {
			t.Errorf("%s: fn called", name)
			return false
		})
		if !errors.Is(err, ctx.Err()) {
			t.Errorf("%s: Watch = %v, want %v", name, err, ctx.Err())
		}
	}
}

// Watch from now with CreatedNotify: fn first gets the created notice, and
// a change made after it reaches fn.
func TestWatchFromNowCreatedNotice(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	key := keyFor(t, "")
	register(t, c, key)
	got := make(chan *intentv1.WatchResponse, 2)
	errc := make(chan error, 1)
	go func() { // ends when fn has seen the change
		errc <- c.Watch(ctx, &intentv1.WatchRequest{Key: key, CreatedNotify: true}, func(ev *intentv1.WatchResponse) bool {
			got <- ev
			return ev.GetType() == intentv1.WatchResponse_TYPE_CREATED
		})
	}()
	var created *intentv1.WatchResponse
	select {
	case created = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no created notice within 10s")
	}
	if created.GetType() != intentv1.WatchResponse_TYPE_CREATED || created.GetIntent() != nil || created.GetRevision() == 0 {
		t.Fatalf("first response %v, want TYPE_CREATED with a revision and no intent", created)
	}
	if _, err := c.Cancel(ctx, &intentv1.CancelRequest{Key: key, Reason: "watched"}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if ev := <-got; ev.GetType() != intentv1.WatchResponse_TYPE_PUT || ev.GetIntent().GetState() != intentv1.State_STATE_CANCELLED || ev.GetRevision() <= created.GetRevision() {
		t.Fatalf("after the notice at %d saw %v, want the cancellation after it", created.GetRevision(), ev)
	}
}
