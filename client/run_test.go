package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// shop is a fake merchant: it deduplicates orders by idempotency key, as a
// well-behaved provider does, and counts every call it gets.
type shop struct {
	mu     sync.Mutex
	keys   []string          // the idempotency key of every order call
	orders map[string]string // idempotency key → order id
}

func newShop() *shop { return &shop{orders: map[string]string{}} }

func (s *shop) order(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, key)
	if id, ok := s.orders[key]; ok {
		return id
	}
	id := fmt.Sprintf("SO-%d", 1000+len(s.orders))
	s.orders[key] = id
	return id
}

func (s *shop) lookup(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.orders[key]
	return id, ok
}

// calls is how many order calls the shop got.
func (s *shop) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// orderCount is how many distinct orders the shop holds.
func (s *shop) orderCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.orders)
}

// execute is an Execute that orders under the attempt's operation key.
func (s *shop) execute(_ context.Context, att *client.Attempt) (*intentv1.Result, error) {
	return orderResult(s.order(att.OperationKey("create-order"))), nil
}

// attempts records what every Execute or Reconcile was given.
type attempts struct {
	mu   sync.Mutex
	seen []client.Attempt
}

func (a *attempts) add(att *client.Attempt) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, client.Attempt{Key: att.Key, Token: att.Token, Reconciling: att.Reconciling, Intent: att.Intent})
}

func (a *attempts) all() []client.Attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen)
}

var errReadTimeout = errors.New("merchant: read timeout")

// TestRunExecutesOnceAndCompletes: the success path executes once under the
// lease, completes with the result, and a second Run replays it.
func TestRunExecutesOnceAndCompletes(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "runner", 0)
	key := keyFor(t, "")
	register(t, c, key)
	shop := newShop()
	var execs attempts
	task := client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		execs.add(att)
		return shop.execute(ctx, att)
	}}

	out, err := sess.Run(ctx, task)
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || !out.Executed {
		t.Errorf("Run = %v executed %t, want OUTCOME_COMPLETED executed true", out.Outcome, out.Executed)
	}
	if got, want := out.Result(), orderResult("SO-1000"); !proto.Equal(got, want) {
		t.Errorf("Result() = %v, want %v", got, want)
	}
	seen := execs.all()
	if len(seen) != 1 {
		t.Fatalf("Execute calls = %d, want 1", len(seen))
	}
	att := seen[0]
	if att.Key != key || att.Reconciling || att.Token == 0 {
		t.Errorf("Attempt = {Key %q, Reconciling %t, Token %v}, want {%q, false, non-zero}", att.Key, att.Reconciling, att.Token, key)
	}
	if got, want := att.OperationKey("create-order"), key+":create-order"; got != want {
		t.Errorf("OperationKey(create-order) = %q, want %q", got, want)
	}
	if !proto.Equal(att.Intent.GetParams(), params(t, 1)) {
		t.Errorf("Attempt.Intent.Params = %v, want the approved terms %v", att.Intent.GetParams(), params(t, 1))
	}

	in := get(t, c, key)
	if in.GetState() != intentv1.State_STATE_COMPLETED || !proto.Equal(in.GetResult(), out.Result()) {
		t.Errorf("Get = %v with %v, want STATE_COMPLETED with %v", in.GetState(), in.GetResult(), out.Result())
	}
	acquired := entries(in, intentv1.HistoryEntry_KIND_ACQUIRED, true)
	completed := entries(in, intentv1.HistoryEntry_KIND_COMPLETED, true)
	if len(acquired) != 1 || len(completed) != 1 {
		t.Errorf("history: %d acquisitions, %d completions; want 1 and 1", len(acquired), len(completed))
	} else if acquired[0].GetToken() != uint64(att.Token) || completed[0].GetToken() != uint64(att.Token) {
		t.Errorf("history tokens: acquired %d, completed %d; want both %v (Execute's)", acquired[0].GetToken(), completed[0].GetToken(), att.Token)
	}

	again, err := sess.Run(ctx, task)
	if err != nil {
		t.Fatalf("second Run = %v", err)
	}
	if again.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || again.Executed || !proto.Equal(again.Result(), out.Result()) {
		t.Errorf("second Run = %v executed %t result %v, want OUTCOME_COMPLETED executed false result %v", again.Outcome, again.Executed, again.Result(), out.Result())
	}
	if got := again.Statement.GetStatus(); got != "already_completed" {
		t.Errorf("second Run statement status = %q, want already_completed", got)
	}
	if n := shop.calls(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
}

// TestRunFinalFailure: Final(code, err) fails the intent for good with that
// code; a later Run replays FAILED without executing.
func TestRunFinalFailure(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "payer", 0)
	key := keyFor(t, "")
	register(t, c, key)
	var calls atomic.Int32
	task := client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		calls.Add(1)
		return nil, client.Final("card_declined", errors.New("issuer said no"))
	}}

	out, err := sess.Run(ctx, task)
	if err != nil {
		t.Fatalf("Run = %v, want the failure recorded without error", err)
	}
	if out.Outcome != intentv1.Outcome_OUTCOME_FAILED || !out.Executed {
		t.Errorf("Run = %v executed %t, want OUTCOME_FAILED executed true", out.Outcome, out.Executed)
	}
	in := get(t, c, key)
	if in.GetState() != intentv1.State_STATE_FAILED || in.GetFailure().GetCode() != "card_declined" {
		t.Errorf("Get = %v (%v), want STATE_FAILED with code card_declined", in.GetState(), in.GetFailure())
	}
	if n := len(entries(in, intentv1.HistoryEntry_KIND_FAILED, true)); n != 1 {
		t.Errorf("accepted failures in history = %d, want 1", n)
	}

	again, err := sess.Run(ctx, task)
	if err != nil {
		t.Fatalf("second Run = %v", err)
	}
	if again.Outcome != intentv1.Outcome_OUTCOME_FAILED || again.Executed {
		t.Errorf("second Run = %v executed %t, want OUTCOME_FAILED executed false", again.Outcome, again.Executed)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("Execute calls = %d, want 1", n)
	}
}

// TestRunNotAttemptedReleases: NotAttempted releases the intent to PENDING;
// a later Run executes it again under a new token and the same operation
// key.
func TestRunNotAttemptedReleases(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "careful", 0)
	key := keyFor(t, "")
	register(t, c, key)
	shop := newShop()
	var execs attempts
	errRefused := errors.New("merchant: connection refused")
	task := client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		execs.add(att)
		if len(execs.all()) == 1 {
			return nil, client.NotAttempted(errRefused) // nothing was sent
		}
		return shop.execute(ctx, att)
	}}

	out, err := sess.Run(ctx, task)
	var none *client.NotAttemptedError
	if !errors.As(err, &none) || !errors.Is(err, errRefused) {
		t.Errorf("Run error = %v, want the *client.NotAttemptedError wrapping %v", err, errRefused)
	}
	if got := out.Intent.GetState(); got != intentv1.State_STATE_PENDING {
		t.Errorf("Run left the intent %v, want STATE_PENDING", got)
	}
	in := get(t, c, key)
	if in.GetState() != intentv1.State_STATE_PENDING {
		t.Errorf("Get state = %v, want STATE_PENDING", in.GetState())
	}
	if n := len(entries(in, intentv1.HistoryEntry_KIND_RELEASED, true)); n != 1 {
		t.Errorf("accepted releases in history = %d, want 1", n)
	}

	out, err = sess.Run(ctx, task)
	if err != nil {
		t.Fatalf("second Run = %v", err)
	}
	if out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || !out.Executed {
		t.Errorf("second Run = %v executed %t, want OUTCOME_COMPLETED executed true", out.Outcome, out.Executed)
	}
	seen := execs.all()
	if len(seen) != 2 {
		t.Fatalf("Execute calls = %d, want 2", len(seen))
	}
	if seen[1].Token <= seen[0].Token {
		t.Errorf("tokens %v then %v, want the second higher", seen[0].Token, seen[1].Token)
	}
	if a, b := seen[0].OperationKey("create-order"), seen[1].OperationKey("create-order"); a != b {
		t.Errorf("operation keys %q then %q, want the same", a, b)
	}
	if n := shop.orderCount(); n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
}

// TestRunUncertainMarksUnknown: any other error marks the intent UNKNOWN;
// Run returns it, and does not try again on its own.
func TestRunUncertainMarksUnknown(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "unsure", 0)
	key := keyFor(t, "")
	register(t, c, key)
	shop := newShop()
	task := client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		shop.order(att.OperationKey("create-order"))
		return nil, errReadTimeout
	}}
	out, err := sess.Run(ctx, task)
	if !errors.Is(err, errReadTimeout) {
		t.Errorf("Run error = %v, want %v", err, errReadTimeout)
	}
	if out.Outcome != intentv1.Outcome_OUTCOME_UNSPECIFIED || out.Intent.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Errorf("Run = %v, intent %v; want OUTCOME_UNSPECIFIED, STATE_UNKNOWN", out.Outcome, out.Intent.GetState())
	}
	in := get(t, c, key)
	if in.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Errorf("Get state = %v, want STATE_UNKNOWN", in.GetState())
	}
	marked := entries(in, intentv1.HistoryEntry_KIND_MARKED_UNKNOWN, true)
	if len(marked) != 1 || marked[0].GetReason() != errReadTimeout.Error() {
		t.Errorf("accepted MarkUnknown entries = %v, want one with reason %q", marked, errReadTimeout)
	}
	if n := shop.calls(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
}

// TestRunReconciles: after an uncertain attempt, the next Run reconciles:
// Found completes with the evidence, Absent releases and executes again in
// the same Run, and anything undecided goes to a human, after which Runs
// no longer execute.
func TestRunReconciles(t *testing.T) {
	t.Parallel()
	found := func(s *shop) func(context.Context, *client.Attempt) (client.Evidence, error) {
		return func(_ context.Context, att *client.Attempt) (client.Evidence, error) {
			if id, ok := s.lookup(att.OperationKey("create-order")); ok {
				return client.Found(orderResult(id)), nil
			}
			return client.Absent("no order under " + att.OperationKey("create-order")), nil
		}
	}
	tests := []struct {
		name      string
		effect    bool // the first attempt's order reached the merchant
		reconcile func(*shop) func(context.Context, *client.Attempt) (client.Evidence, error)
		want      intentv1.Outcome
		wantErr   bool
		executed  bool // the second Run executed
		state     intentv1.State
		execs     int // Execute calls over all Runs
	}{
		{name: "found", effect: true, reconcile: found, want: intentv1.Outcome_OUTCOME_COMPLETED, state: intentv1.State_STATE_COMPLETED, execs: 1},
		{name: "absent", effect: false, reconcile: found, want: intentv1.Outcome_OUTCOME_COMPLETED, executed: true, state: intentv1.State_STATE_COMPLETED, execs: 2},
		{
			name: "undecided", effect: true,
			reconcile: func(*shop) func(context.Context, *client.Attempt) (client.Evidence, error) {
				return func(context.Context, *client.Attempt) (client.Evidence, error) {
					return client.Undecided("merchant offers no lookup"), nil
				}
			},
			want: intentv1.Outcome_OUTCOME_NEEDS_REVIEW, state: intentv1.State_STATE_NEEDS_REVIEW, execs: 1,
		},
		{name: "no reconcile function", effect: true, want: intentv1.Outcome_OUTCOME_NEEDS_REVIEW, state: intentv1.State_STATE_NEEDS_REVIEW, execs: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			c := newClient(t)
			sess := openSession(t, c, "reconciler", 0)
			key := keyFor(t, "")
			register(t, c, key)
			shop := newShop()
			var execs, recs attempts
			task := client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
				execs.add(att)
				if len(execs.all()) == 1 {
					if tt.effect {
						shop.order(att.OperationKey("create-order"))
					}
					return nil, errReadTimeout
				}
				return shop.execute(ctx, att)
			}}
			if _, err := sess.Run(ctx, task); !errors.Is(err, errReadTimeout) {
				t.Fatalf("first Run error = %v, want %v", err, errReadTimeout)
			}
			if tt.reconcile != nil {
				rec := tt.reconcile(shop)
				task.Reconcile = func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
					recs.add(att)
					return rec(ctx, att)
				}
			}

			out, err := sess.Run(ctx, task)
			if (err != nil) != tt.wantErr {
				t.Errorf("second Run error = %v, want error %t", err, tt.wantErr)
			}
			if out == nil {
				t.Fatalf("second Run outcome = nil, want %v", tt.want)
			}
			if out.Outcome != tt.want || out.Executed != tt.executed {
				t.Errorf("second Run = %v executed %t, want %v executed %t", out.Outcome, out.Executed, tt.want, tt.executed)
			}
			seen, reconciled := execs.all(), recs.all()
			if tt.reconcile != nil {
				if len(reconciled) != 1 {
					t.Fatalf("Reconcile calls = %d, want 1", len(reconciled))
				}
				if r := reconciled[0]; !r.Reconciling || r.Token <= seen[0].Token || r.OperationKey("create-order") != seen[0].OperationKey("create-order") {
					t.Errorf("Reconcile got {Reconciling %t, Token %v, %s}, want {true, above %v, %s}",
						r.Reconciling, r.Token, r.OperationKey("create-order"), seen[0].Token, seen[0].OperationKey("create-order"))
				}
			}
			if len(seen) == 2 {
				if seen[1].OperationKey("create-order") != seen[0].OperationKey("create-order") || seen[1].Token <= reconciled[0].Token {
					t.Errorf("execution after absence: %s token %v; want %s under a token above %v",
						seen[1].OperationKey("create-order"), seen[1].Token, seen[0].OperationKey("create-order"), reconciled[0].Token)
				}
			}
			in := get(t, c, key)
			if in.GetState() != tt.state {
				t.Errorf("Get state = %v, want %v", in.GetState(), tt.state)
			}
			if tt.state == intentv1.State_STATE_COMPLETED {
				if id, _ := shop.lookup(key + ":create-order"); !proto.Equal(in.GetResult(), orderResult(id)) {
					t.Errorf("Get result = %v, want the merchant's order %s", in.GetResult(), id)
				}
			}

			// Later Runs replay; they neither execute nor reconcile.
			for range 2 {
				later, err := sess.Run(ctx, task)
				if err != nil {
					t.Fatalf("later Run = %v", err)
				}
				if later.Outcome != tt.want || later.Executed {
					t.Errorf("later Run = %v executed %t, want %v executed false", later.Outcome, later.Executed, tt.want)
				}
			}
			if n := len(execs.all()); n != tt.execs {
				t.Errorf("Execute calls = %d, want %d", n, tt.execs)
			}
			if n := len(recs.all()); n != len(reconciled) {
				t.Errorf("Reconcile calls after the later Runs = %d, want %d", n, len(reconciled))
			}
			if n := shop.orderCount(); tt.execs == 2 && n != 1 {
				t.Errorf("orders = %d, want 1", n)
			}
		})
	}
}

// TestRunRegistersAndExecutes: with Task.Register, one Run approves and
// executes; other terms under the same key are refused without executing.
func TestRunRegistersAndExecutes(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "approver-worker", 0)
	key := keyFor(t, "")
	shop := newShop()
	task := client.Task{Key: key, Register: &intentv1.RegisterRequest{Params: params(t, 1), Labels: map[string]string{"team": "procurement"}}, Execute: shop.execute}
	out, err := sess.Run(ctx, task)
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || !out.Executed {
		t.Errorf("Run = %v executed %t, want OUTCOME_COMPLETED executed true", out.Outcome, out.Executed)
	}
	in := get(t, c, key)
	var kinds []intentv1.HistoryEntry_Kind
	for _, e := range in.GetHistory() {
		kinds = append(kinds, e.GetKind())
	}
	want := []intentv1.HistoryEntry_Kind{intentv1.HistoryEntry_KIND_REGISTERED, intentv1.HistoryEntry_KIND_ACQUIRED, intentv1.HistoryEntry_KIND_COMPLETED}
	if !slices.Equal(kinds, want) {
		t.Errorf("history = %v, want %v", kinds, want)
	}
	if !proto.Equal(in.GetParams(), params(t, 1)) || in.GetLabels()["team"] != "procurement" {
		t.Errorf("Get params %v labels %v, want the registered ones", in.GetParams(), in.GetLabels())
	}

	changed := task
	changed.Register = &intentv1.RegisterRequest{Params: params(t, 2)}
	if _, err := sess.Run(ctx, changed); !errors.Is(err, client.ErrFingerprintMismatch) {
		t.Errorf("Run with other terms = %v, want ErrFingerprintMismatch", err)
	}
	if n := shop.calls(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
}

// TestRunRegistersChildren: children asked for with RegisterChild exist if
// and only if the attempt completes.
func TestRunRegistersChildren(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "outbox", 0)
	key := keyFor(t, "")
	register(t, c, key)
	children := []string{key + "/authorize-payment", key + "/ship"}
	fail := true
	task := client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
		for _, k := range children {
			att.RegisterChild(&intentv1.RegisterRequest{Key: k, Params: params(t, 1)})
		}
		if fail {
			return nil, client.NotAttempted(errors.New("merchant: closed for the night"))
		}
		return orderResult("SO-1"), nil
	}}

	if _, err := sess.Run(ctx, task); err == nil {
		t.Fatalf("first Run = nil error, want the NotAttempted error")
	}
	for _, k := range children {
		if _, err := c.Get(ctx, &intentv1.GetRequest{Key: k}); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("Get(%q) after a released attempt = %v, want ErrNotFound", k, err)
		}
	}

	fail = false
	out, err := sess.Run(ctx, task)
	if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
		t.Fatalf("second Run = %v, %v; want OUTCOME_COMPLETED", out, err)
	}
	in := get(t, c, key)
	var got []string
	for _, ch := range in.GetChildren() {
		got = append(got, ch.GetKey())
		if ch.GetState() != intentv1.State_STATE_PENDING {
			t.Errorf("child %q state = %v, want STATE_PENDING", ch.GetKey(), ch.GetState())
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, children) {
		t.Errorf("Get children = %v, want %v", got, children)
	}
	if n := len(entries(in, intentv1.HistoryEntry_KIND_CHILD_REGISTERED, true)); n != len(children) {
		t.Errorf("child registrations in history = %d, want %d", n, len(children))
	}
	for _, k := range children {
		child := get(t, c, k)
		if child.GetParentKey() != key || child.GetState() != intentv1.State_STATE_PENDING {
			t.Errorf("Get(%q) = parent %q state %v, want parent %q STATE_PENDING", k, child.GetParentKey(), child.GetState(), key)
		}
	}
}

// runResult is what a Run returned, and when.
type runResult struct {
	out *client.Outcome
	err error
	at  time.Time
}

// runAsync runs task on sess in a goroutine.
func runAsync(sess *client.Session, task client.Task) <-chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := sess.Run(ctx, task)
		ch <- runResult{out, err, time.Now()}
	}()
	return ch
}

func waitRun(t *testing.T, ch <-chan runResult, within time.Duration) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("Run did not return within %v", within)
		return runResult{}
	}
}

// TestRunWaitsForHolder: a Run that finds another worker's attempt in
// progress watches the intent and returns its result as soon as it
// completes, without executing; past its bound it returns IN_PROGRESS.
func TestRunWaitsForHolder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		wait time.Duration
		want intentv1.Outcome
	}{
		{name: "holder completes within the bound", wait: 10 * time.Second, want: intentv1.Outcome_OUTCOME_COMPLETED},
		{name: "bound passes first", wait: 300 * time.Millisecond, want: intentv1.Outcome_OUTCOME_IN_PROGRESS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			var watches atomic.Int32
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
					watches.Add(1)
					return streamer(ctx, desc, cc, method, opts...)
				}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			a := openSession(t, c, "worker-a", 0)
			b := openSession(t, client.New(conn), "worker-b", 0)
			key := keyFor(t, "")
			register(t, c, key)

			started, release := make(chan struct{}), make(chan struct{})
			aDone := runAsync(a, client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
				close(started)
				select {
				case <-release:
					return orderResult("SO-A"), nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}})
			<-started
			var bCalls atomic.Int32
			bStart := time.Now()
			bDone := runAsync(b, client.Task{Key: key, WaitInProgress: tt.wait, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
				bCalls.Add(1)
				return orderResult("SO-B"), nil
			}})

			var br, ar runResult
			if tt.want == intentv1.Outcome_OUTCOME_IN_PROGRESS {
				br = waitRun(t, bDone, 5*time.Second)
				if took := br.at.Sub(bStart); took < tt.wait || took > tt.wait+2*time.Second {
					t.Errorf("B returned after %v, want soon after its %v bound", took, tt.wait)
				}
				close(release)
				ar = waitRun(t, aDone, 5*time.Second)
				if got := br.out.Intent.GetLease().GetWorker(); got != "worker-a" {
					t.Errorf("B's outcome names holder %q, want worker-a", got)
				}
				if got := br.out.Statement.GetStatus(); got != "in_progress" {
					t.Errorf("B's statement status = %q, want in_progress", got)
				}
			} else {
				for deadline := time.Now().Add(5 * time.Second); watches.Load() == 0; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("B opened no Watch within 5s")
					}
				}
				time.Sleep(200 * time.Millisecond)
				close(release)
				ar = waitRun(t, aDone, 5*time.Second)
				br = waitRun(t, bDone, 15*time.Second)
				if lag := br.at.Sub(ar.at); lag > 2*time.Second {
					t.Errorf("B returned %v after A completed, want within 2s (watching, not sleeping out its %v bound)", lag, tt.wait)
				}
				if !proto.Equal(br.out.Result(), ar.out.Result()) {
					t.Errorf("B's result = %v, want A's %v", br.out.Result(), ar.out.Result())
				}
			}
			if ar.err != nil || ar.out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
				t.Errorf("A's Run = %v, %v; want OUTCOME_COMPLETED", ar.out, ar.err)
			}
			if br.err != nil {
				t.Fatalf("B's Run = %v", br.err)
			}
			if br.out.Outcome != tt.want || br.out.Executed {
				t.Errorf("B's Run = %v executed %t, want %v executed false", br.out.Outcome, br.out.Executed, tt.want)
			}
			if n := bCalls.Load(); n != 0 {
				t.Errorf("B's Execute calls = %d, want 0", n)
			}
		})
	}
}

// TestRunConcurrentWorkers: sixteen workers Run the same task at once; it
// executes exactly once and every worker gets the same result.
func TestRunConcurrentWorkers(t *testing.T) {
	t.Parallel()
	const workers = 16
	c := newClient(t)
	key := keyFor(t, "")
	shop := newShop()
	var executions atomic.Int32
	var tokens sync.Map // fencing.Token → true
	task := client.Task{
		Key:      key,
		Register: &intentv1.RegisterRequest{Params: params(t, 1)},
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			executions.Add(1)
			tokens.Store(att.Token, true)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return shop.execute(ctx, att)
		},
	}
	sessions := make([]*client.Session, workers)
	for i := range sessions {
		sessions[i] = openSession(t, c, fmt.Sprintf("worker-%d", i), 0)
	}
	outs := make([]*client.Outcome, workers)
	errs := make([]error, workers)
	ctx := testContext(t)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			<-start
			outs[i], errs[i] = s.Run(ctx, task)
		})
	}
	close(start)
	wg.Wait()

	if n := executions.Load(); n != 1 {
		t.Errorf("Execute calls = %d, want 1", n)
	}
	executed := 0
	for i := range workers {
		if errs[i] != nil {
			t.Errorf("worker %d: Run = %v", i, errs[i])
			continue
		}
		if outs[i].Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
			t.Errorf("worker %d: outcome %v, want OUTCOME_COMPLETED", i, outs[i].Outcome)
		}
		if !proto.Equal(outs[i].Result(), orderResult("SO-1000")) {
			t.Errorf("worker %d: result %v, want %v", i, outs[i].Result(), orderResult("SO-1000"))
		}
		if outs[i].Executed {
			executed++
		}
	}
	if executed != 1 {
		t.Errorf("Runs that executed = %d, want 1", executed)
	}
	if n := shop.calls(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
	acquired := entries(get(t, c, key), intentv1.HistoryEntry_KIND_ACQUIRED, true)
	if len(acquired) != 1 {
		t.Fatalf("acquisitions in history = %d, want 1", len(acquired))
	}
	tokens.Range(func(k, _ any) bool {
		if k.(fencing.Token) != fencing.Token(acquired[0].GetToken()) {
			t.Errorf("Execute ran under token %v, the one lease issued has %d", k, acquired[0].GetToken())
		}
		return true
	})
}

// TestRunReportsAfterCallerGivesUp: a report outlives the caller's
// context: whatever Execute did is recorded, and the intent is never left
// IN_PROGRESS under a lease no one works on.
func TestRunReportsAfterCallerGivesUp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		effect  bool // Execute ordered before it noticed
		want    intentv1.State
		wantErr error
	}{
		{name: "effect done", effect: true, want: intentv1.State_STATE_COMPLETED},
		{name: "effect uncertain", want: intentv1.State_STATE_UNKNOWN, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			sess := openSession(t, c, "impatient", 0)
			key := keyFor(t, "")
			register(t, c, key)
			shop := newShop()
			ctx, cancel := context.WithCancel(testContext(t))
			_, err := sess.Run(ctx, client.Task{Key: key, Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
				cancel() // the caller stops waiting mid-flight
				if tt.effect {
					return shop.execute(ctx, att)
				}
				<-ctx.Done()
				return nil, ctx.Err()
			}})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("Run error = %v, want %v", err, tt.wantErr)
			}
			if got := get(t, c, key).GetState(); got != tt.want {
				t.Errorf("state = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRunCallerGivesUpDuringAcquire: when the caller's context ends while
// Run waits for Acquire's answer, a lease intentd did issue must not stay
// behind, held by the live session with no one to work on it.
func TestRunCallerGivesUpDuringAcquire(t *testing.T) {
	t.Parallel()
	f := &faults{}
	c := newFaultyClient(t, f, client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	sess := openSession(t, c, "impatient", 0)
	key := keyFor(t, "")
	register(t, c, key)
	shop := newShop()
	task := client.Task{Key: key, WaitInProgress: 2 * time.Second, Execute: shop.execute}

	ctx, cancel := context.WithCancel(testContext(t))
	f.set("Acquire", &rule{lose: 1, onLose: cancel}) // granted, but the answer comes too late
	if _, err := sess.Run(ctx, task); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	f.set("Acquire", nil)

	out, err := sess.Run(testContext(t), task)
	if err != nil {
		t.Fatalf("next Run = %v", err)
	}
	if out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || !out.Executed {
		t.Errorf("next Run = %v executed %t (holder %q, live %t), want OUTCOME_COMPLETED executed true",
			out.Outcome, out.Executed, out.Intent.GetLease().GetWorker(), out.Intent.GetLease().GetLive())
	}
	if n := shop.calls(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
}

// TestRunReconcileLookupFails: a Reconcile that cannot reach the provider
// learns nothing; the intent stays UNKNOWN for the next reconcile, not for a
// human, and a later Run with the provider back completes it without
// executing again.
func TestRunReconcileLookupFails(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "worker-r", 10*time.Second)
	key := keyFor(t, "")
	register(t, c, key)
	executions := 0
	task := client.Task{
		Key: key,
		Execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) {
			executions++
			return nil, errors.New("merchant: read timeout")
		},
		Reconcile: func(context.Context, *client.Attempt) (client.Evidence, error) {
			return client.Evidence{}, errors.New("merchant: lookup failed")
		},
	}
	if _, err := sess.Run(ctx, task); err == nil {
		t.Fatal("first Run: want the read timeout")
	}
	out, err := sess.Run(ctx, task)
	if err == nil || out == nil || out.Intent.GetState() != intentv1.State_STATE_UNKNOWN {
		t.Fatalf("Run with a failing lookup = %+v, %v; want the intent left UNKNOWN and the lookup error", out, err)
	}
	task.Reconcile = func(context.Context, *client.Attempt) (client.Evidence, error) {
		return client.Found(orderResult("SO-5")), nil
	}
	out, err = sess.Run(ctx, task)
	if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED || out.Executed {
		t.Fatalf("Run with the provider back = %+v, %v; want COMPLETED without executing", out, err)
	}
	if executions != 1 {
		t.Fatalf("Execute ran %d times, want 1", executions)
	}
}

// A poison intent (every attempt ends without a report: a timeout, then a
// lookup that fails) reaches its max_attempts and is handed to a human by
// intentd: the next Run returns NEEDS_REVIEW without executing, with the
// count and the limit on the intent.
func TestRunPoisonIntentGoesToReview(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t)
	sess := openSession(t, c, "worker-p", 10*time.Second)
	key := keyFor(t, "")
	if _, err := c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: params(t, 1), MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	executions := 0
	task := client.Task{
		Key: key,
		Execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) {
			executions++
			return nil, errors.New("merchant: read timeout")
		},
		Reconcile: func(context.Context, *client.Attempt) (client.Evidence, error) {
			return client.Evidence{}, errors.New("merchant: lookup failed")
		},
	}
	if _, err := sess.Run(ctx, task); err == nil {
		t.Fatal("first Run: want the read timeout")
	}
	out, err := sess.Run(ctx, task)
	if err == nil || out == nil || out.Outcome != intentv1.Outcome_OUTCOME_NEEDS_REVIEW || out.Intent.GetState() != intentv1.State_STATE_NEEDS_REVIEW {
		t.Fatalf("second Run (its lookup fails too) = %+v, %v; want the lookup error, NEEDS_REVIEW and the intent in it", out, err)
	}
	out, err = sess.Run(ctx, task)
	if err != nil || out.Outcome != intentv1.Outcome_OUTCOME_NEEDS_REVIEW || out.Executed {
		t.Fatalf("third Run = %+v, %v; want NEEDS_REVIEW without executing", out, err)
	}
	if in := out.Intent; in.GetAttempts() != 2 || in.GetMaxAttempts() != 2 {
		t.Errorf("intent attempts %d of %d, want 2 of 2", in.GetAttempts(), in.GetMaxAttempts())
	}
	if executions != 1 {
		t.Fatalf("Execute ran %d times, want 1", executions)
	}
}

// TestRunReportsWhatCannotBeRecorded: a report intentd would refuse for
// what it carries never leaves the intent held by the session's lease
// (IN_PROGRESS for as long as the worker lives). Free text is cut to its
// limit at a character boundary; a result or failure that cannot be
// recorded leaves the intent UNKNOWN, for the next worker to reconcile at
// once; a found result that cannot be recorded goes to a person.
func TestRunReportsWhatCannotBeRecorded(t *testing.T) {
	t.Parallel()
	euros := strings.Repeat("€", 2000) // 6,000 bytes: more than a reason's 1,024
	big := &intentv1.Result{Payload: make([]byte, 300_000)}
	for _, tc := range []struct {
		name      string
		execute   func(context.Context, *client.Attempt) (*intentv1.Result, error)
		reconcile func(context.Context, *client.Attempt) (client.Evidence, error) // after execute, by a second worker
		state     intentv1.State
		errIs     error
		reason    string // the start of the report's reason in the history
	}{
		{name: "a result too large", execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) { return big, nil },
			state: intentv1.State_STATE_UNKNOWN, errIs: client.ErrInvalidArgument, reason: "the result could not be recorded: "},
		{name: "a reference that is not UTF-8", execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) {
			return &intentv1.Result{ExternalRefs: map[string]string{"order_id": "SO-\xff"}}, nil
		}, state: intentv1.State_STATE_UNKNOWN, reason: "the result could not be recorded: "},
		{name: "a long error in euros", execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) { return nil, errors.New(euros) },
			state: intentv1.State_STATE_UNKNOWN, reason: "€€€"},
		{name: "nothing attempted, at length", execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) {
			return nil, client.NotAttempted(errors.New(euros))
		}, state: intentv1.State_STATE_PENDING},
		{name: "a final failure with a long message", execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) {
			return nil, client.Final("card_declined", errors.New(euros))
		}, state: intentv1.State_STATE_FAILED},
		{name: "a final failure without a code", execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) {
			return nil, client.Final("", errors.New("declined"))
		}, state: intentv1.State_STATE_UNKNOWN, errIs: client.ErrInvalidArgument, reason: "the failure could not be recorded: "},
		{name: "found, too large", execute: func(context.Context, *client.Attempt) (*intentv1.Result, error) { return nil, errReadTimeout },
			reconcile: func(context.Context, *client.Attempt) (client.Evidence, error) { return client.Found(big), nil },
			state:     intentv1.State_STATE_NEEDS_REVIEW, errIs: client.ErrInvalidArgument, reason: "found downstream, but the result could not be recorded: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			c := newClient(t)
			key := keyFor(t, "")
			register(t, c, key)
			sess := openSession(t, c, "recorder", 0)
			out, err := sess.Run(ctx, client.Task{Key: key, Execute: tc.execute})
			if tc.errIs != nil && tc.reconcile == nil && !errors.Is(err, tc.errIs) {
				t.Errorf("Run error = %v; want %v", err, tc.errIs)
			}
			if out == nil {
				t.Fatalf("Run = nil, %v: the report was not made", err)
			}
			if tc.reconcile != nil {
				// Another worker reconciles at once: the intent is not held.
				other := openSession(t, c, "reconciler", 0)
				out, err = other.Run(ctx, client.Task{Key: key, Execute: tc.execute, Reconcile: tc.reconcile, WaitInProgress: time.Millisecond})
				if !errors.Is(err, tc.errIs) || out == nil || out.Outcome != intentv1.Outcome_OUTCOME_NEEDS_REVIEW {
					t.Fatalf("reconcile: %+v, %v; want NEEDS_REVIEW and %v", out, err, tc.errIs)
				}
			}
			in := get(t, c, key)
			if in.GetState() != tc.state {
				t.Fatalf("state %v; want %v (%v)", in.GetState(), tc.state, err)
			}
			if tc.reason != "" {
				h := in.GetHistory()
				if last := h[len(h)-1].GetReason(); !strings.HasPrefix(last, tc.reason) || len(last) > 1024 || !utf8.ValidString(last) {
					t.Errorf("the report's reason: %.80q… (%d bytes); want it to start %q, within 1,024 bytes", last, len(last), tc.reason)
				}
			}
			if tc.state == intentv1.State_STATE_UNKNOWN {
				// Not held: the next worker reconciles now.
				other := openSession(t, c, "next", 0)
				looked := false
				_, _ = other.Run(ctx, client.Task{Key: key, WaitInProgress: time.Millisecond, Execute: tc.execute,
					Reconcile: func(context.Context, *client.Attempt) (client.Evidence, error) {
						looked = true
						return client.Undecided("test"), nil
					}})
				if !looked {
					t.Errorf("the next worker did not reconcile")
				}
			}
		})
	}
}
