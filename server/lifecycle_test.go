package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/server"
)

// fakeClock is the store's clock in retention tests: it moves only when the
// test says so. The store reads it for history times and retention, never
// for lease expiry, which etcd decides.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// statementOf returns the Statement detail a status error carries, or nil.
func statementOf(err error) *intentv1.Statement {
	for _, d := range status.Convert(err).Details() {
		if st, ok := d.(*intentv1.Statement); ok {
			return st
		}
	}
	return nil
}

// checkError insists that err is a status with code and an ErrorInfo in
// intentd's domain with reason; for a non-empty field, that ErrorInfo's
// metadata and the BadRequest both name it.
func checkError(t *testing.T, err error, code codes.Code, reason, field string) details {
	t.Helper()
	if err == nil {
		t.Fatalf("call succeeded, want %v %s", code, reason)
	}
	d := detailsOf(t, err)
	if d.code != code {
		t.Errorf("code = %v (%v), want %v", d.code, err, code)
	}
	if d.info == nil {
		t.Fatalf("no ErrorInfo in %v", err)
	}
	if got := d.info.GetDomain(); got != server.ErrorDomain {
		t.Errorf("ErrorInfo.domain = %q, want %q", got, server.ErrorDomain)
	}
	if got := d.info.GetReason(); got != reason {
		t.Errorf("ErrorInfo.reason = %q (%v), want %q", got, err, reason)
	}
	if field != "" {
		if got := d.info.GetMetadata()["field"]; got != field {
			t.Errorf("ErrorInfo.metadata[field] = %q (%v), want %q", got, err, field)
		}
		if len(d.field) != 1 || d.field[0] != field {
			t.Errorf("BadRequest fields = %q, want [%q]", d.field, field)
		}
	}
	return d
}

// markedUnknown leaves key UNKNOWN: its first holder timed out.
func markedUnknown(f *fx, key string) prep {
	p := held(f, key)
	f.markUnknown(key, p.token)
	return p
}

// escalated leaves key NEEDS_REVIEW: its holder escalated under its token.
func escalated(f *fx, key string) prep {
	p := held(f, key)
	if _, err := f.c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Token: p.token, Reason: "cannot tell", Actor: "w1"}); err != nil {
		f.t.Fatalf("Escalate(%q, %d): %v", key, p.token, err)
	}
	return p
}

func (f *fx) escalateAsReviewer(key string) {
	f.t.Helper()
	if _, err := f.c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Reason: "customer complaint", Actor: "alice"}); err != nil {
		f.t.Fatalf("Escalate(%q) as reviewer: %v", key, err)
	}
}

func (f *fx) list(req *intentv1.ListRequest) *intentv1.ListResponse {
	f.t.Helper()
	resp, err := f.c.List(f.ctx, req)
	if err != nil {
		f.t.Fatalf("List(%v): %v", req, err)
	}
	return resp
}

// child is an outbox child registration.
func child(t *testing.T, key, what string) *intentv1.RegisterRequest {
	return &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, map[string]any{"send": what})}
}

func keysOf(ins []*intentv1.Intent) []string {
	out := make([]string, 0, len(ins))
	for _, in := range ins {
		out = append(out, in.GetKey())
	}
	return out
}

func countEntries(in *intentv1.Intent, kind intentv1.HistoryEntry_Kind) int {
	n := 0
	for _, e := range in.GetHistory() {
		if e.GetKind() == kind {
			n++
		}
	}
	return n
}

var orderRef = &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-1"}}

// TestLifecycleErrorMapping calls Escalate, Resolve, Cancel, List, Watch,
// Complete with children and Register with a retention wrongly, and checks
// the status code, the ErrorInfo reason, the field named, a Statement on
// every INVALID_TRANSITION, and that the refused call wrote nothing.
func TestLifecycleErrorMapping(t *testing.T) {
	c := newClient(t)
	tooLong := durationpb.New(etcdstore.DefaultConfig().MaxRetention + time.Hour)
	resolve := func(req *intentv1.ResolveRequest) func(f *fx, key string, _ prep) error {
		return func(f *fx, key string, _ prep) error {
			req := proto.CloneOf(req)
			req.Key = key
			_, err := f.c.Resolve(f.ctx, req)
			return err
		}
	}
	list := func(req *intentv1.ListRequest) func(f *fx, key string, _ prep) error {
		return func(f *fx, _ string, _ prep) error {
			_, err := f.c.List(f.ctx, req)
			return err
		}
	}
	tests := []struct {
		name   string
		setup  func(f *fx, key string) prep
		call   func(f *fx, key string, p prep) error
		code   codes.Code
		reason string
		field  string // for INVALID_FIELD: the field named
	}{
		{
			name:  "Resolve without decision",
			setup: markedUnknown,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-1", Actor: "alice", Reason: "found it", Result: orderRef}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "decision",
		},
		{
			name:  "Resolve without actor",
			setup: markedUnknown,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-2", Decision: intentv1.Decision_DECISION_COMPLETED, Reason: "found it", Result: orderRef}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "actor",
		},
		{
			name:  "Resolve without request_id",
			setup: markedUnknown,
			call:  resolve(&intentv1.ResolveRequest{Decision: intentv1.Decision_DECISION_COMPLETED, Actor: "alice", Reason: "found it", Result: orderRef}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "request_id",
		},
		{
			name:  "Resolve without reason",
			setup: markedUnknown,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-3", Decision: intentv1.Decision_DECISION_COMPLETED, Actor: "alice", Result: orderRef}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "reason",
		},
		{
			name:  "Resolve COMPLETED without result",
			setup: markedUnknown,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-4", Decision: intentv1.Decision_DECISION_COMPLETED, Actor: "alice", Reason: "found it"}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "result",
		},
		{
			name:  "Resolve FAILED without failure code",
			setup: markedUnknown,
			call: resolve(&intentv1.ResolveRequest{RequestId: "review-5",
				Decision: intentv1.Decision_DECISION_FAILED, Actor: "alice", Reason: "card declined",
				Failure: &intentv1.Failure{Message: "declined"},
			}),
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "failure.code",
		},
		{
			name:  "Resolve PENDING with a result",
			setup: markedUnknown,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-6", Decision: intentv1.Decision_DECISION_PENDING, Actor: "alice", Reason: "no order", Result: orderRef}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "result",
		},
		{
			name:  "Escalate without reason",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Token: p.token, Actor: "w1"})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "reason",
		},
		{
			name:  "List with a label without value",
			setup: nothing,
			call:  list(&intentv1.ListRequest{Label: "novalue"}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "label",
		},
		{
			name:  "List with page_size 101",
			setup: nothing,
			call:  list(&intentv1.ListRequest{PageSize: etcdstore.MaxPageSize + 1}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "page_size",
		},
		{
			name:  "List with a garbage page_token",
			setup: nothing,
			call:  list(&intentv1.ListRequest{PageToken: "not-a-token!"}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "page_token",
		},
		{
			name:  "List with state 99",
			setup: nothing,
			call:  list(&intentv1.ListRequest{States: []intentv1.State{99}}),
			code:  codes.InvalidArgument, reason: "INVALID_FIELD", field: "states[0]", // as intentd always answered: the rule names the entry
		},
		{
			name:  "Watch from revision -1",
			setup: pending,
			call: func(f *fx, key string, _ prep) error {
				ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
				defer cancel()
				stream, err := f.c.Watch(ctx, &intentv1.WatchRequest{Key: key, StartRevision: -1})
				if err != nil {
					return err
				}
				_, err = stream.Recv()
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "start_revision",
		},
		{
			name:  "Complete with 17 children",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				var kids []*intentv1.RegisterRequest
				for i := range server.MaxChildren + 1 {
					kids = append(kids, child(f.t, fmt.Sprintf("%s:child-%d", key, i), "email"))
				}
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef, Children: kids})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "children",
		},
		{
			name:  "Complete with a child of another tenant",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				kid := child(f.t, key+":email", "email")
				kid.Tenant = "acme"
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef, Children: []*intentv1.RegisterRequest{kid}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "children[0].tenant",
		},
		{
			name:  "Register with retention over the server's maximum",
			setup: nothing,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1)), Retention: tooLong})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "retention",
		},
		{
			name:  "Acquire registering with retention over the server's maximum",
			setup: func(f *fx, _ string) prep { return prep{session: f.session("w1")} },
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{
					Key: key, SessionId: p.session, RequestId: "r1",
					Register: &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1)), Retention: tooLong},
				})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "register.retention",
		},
		{
			name:  "Complete with a child retained over the server's maximum",
			setup: held,
			call: func(f *fx, key string, p prep) error {
				kid := child(f.t, key+":email", "email")
				kid.Retention = tooLong
				_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef, Children: []*intentv1.RegisterRequest{kid}})
				return err
			},
			code: codes.InvalidArgument, reason: "INVALID_FIELD", field: "children[0].retention",
		},
		{
			name:  "Resolve of a live-leased intent without force",
			setup: held,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-7", Decision: intentv1.Decision_DECISION_COMPLETED, Actor: "alice", Reason: "found it", Result: orderRef}),
			code:  codes.FailedPrecondition, reason: "LEASE_HELD",
		},
		{
			name:  "Escalate by a reviewer of a live-leased intent without force",
			setup: held,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Reason: "customer complaint", Actor: "alice"})
				return err
			},
			code: codes.FailedPrecondition, reason: "LEASE_HELD",
		},
		{
			name:  "Cancel of an IN_PROGRESS intent",
			setup: held,
			call: func(f *fx, key string, _ prep) error {
				_, err := f.c.Cancel(f.ctx, &intentv1.CancelRequest{Key: key, Actor: "approver", Reason: "changed my mind"})
				return err
			},
			code: codes.FailedPrecondition, reason: "INVALID_TRANSITION",
		},
		{
			name:  "Resolve of a PENDING intent",
			setup: pending,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-8", Decision: intentv1.Decision_DECISION_CANCELLED, Actor: "alice", Reason: "duplicate"}),
			code:  codes.FailedPrecondition, reason: "INVALID_TRANSITION",
		},
		{
			name:  "Resolve of a COMPLETED intent",
			setup: completed,
			call:  resolve(&intentv1.ResolveRequest{RequestId: "review-9", Decision: intentv1.Decision_DECISION_PENDING, Actor: "alice", Reason: "no order"}),
			code:  codes.FailedPrecondition, reason: "INVALID_TRANSITION",
		},
		{
			name:  "Escalate under its token of a COMPLETED intent",
			setup: completed,
			call: func(f *fx, key string, p prep) error {
				_, err := f.c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Token: p.token, Reason: "second thoughts", Actor: "w1"})
				return err
			},
			code: codes.FailedPrecondition, reason: "INVALID_TRANSITION",
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, c)
			key := fmt.Sprintf("lc-err-%d", i)
			p := tc.setup(f, key)
			before := f.get(key)

			err := tc.call(f, key, p)
			checkError(t, err, tc.code, tc.reason, tc.field)
			if tc.reason == "INVALID_TRANSITION" {
				st := statementOf(err)
				if st.GetStatus() != "refused" || st.GetIntentKey() != key || st.GetState() != before.GetState() {
					t.Errorf("Statement = %v, want status refused for %s in state %v", st, key, before.GetState())
				}
				if got, want := st.GetActionTaken(), "none"; got != want || !strings.HasSuffix(st.GetText(), "action_taken: none") {
					t.Errorf("Statement action_taken %q text %q, want %q and a text ending so", got, st.GetText(), want)
				}
			}

			after := f.get(key)
			switch {
			case before == nil && after != nil:
				t.Errorf("the call created %q: %v", key, after)
			case before == nil:
			case after == nil:
				t.Errorf("the call removed %q", key)
			case after.GetRevision() != before.GetRevision() || after.GetState() != before.GetState():
				t.Errorf("after the call: %v at revision %d, want %v at %d as before: a refused call wrote",
					after.GetState(), after.GetRevision(), before.GetState(), before.GetRevision())
			}
		})
	}
}

// TestRetentionExpiry completes an intent, moves the store's clock past its
// retention and runs one janitor pass: the record goes (watchers see it
// deleted), a tombstone stays, and a late Register, Get or Acquire is told
// EXPIRED — nothing executes again. An intent that is not final is kept
// however old it is, and only reported as overdue.
func TestRetentionExpiry(t *testing.T) {
	e := etcdtest.Start(t)
	clock := newFakeClock()
	cfg := etcdstore.DefaultConfig()
	cfg.Now = clock.Now
	cfg.DefaultRetention = time.Hour
	store, c := serveStore(t, e, cfg)
	f := newFx(t, c)

	const key, waiting = "expiring", "still-pending"
	f.register(waiting, lamp(2))
	completed(f, key)
	done := f.get(key)
	if done.GetRetainUntil() == nil || !done.GetRetainUntil().AsTime().Equal(clock.Now().Add(time.Hour)) {
		t.Errorf("retain_until = %v, want completion time + 1h = %v", done.GetRetainUntil().AsTime(), clock.Now().Add(time.Hour))
	}

	wctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	watch, err := c.Watch(wctx, &intentv1.WatchRequest{Key: key, StartRevision: done.GetRevision() + 1})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}

	// Before the retention ends, a pass removes nothing.
	clock.Advance(59 * time.Minute)
	if r, err := store.Sweep(f.ctx); err != nil || r.Removed != 0 {
		t.Fatalf("Sweep before retention ended: %+v, %v; want nothing removed", r, err)
	}
	clock.Advance(2 * time.Hour)
	r, err := store.Sweep(f.ctx)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if r.Removed != 1 || r.Overdue != 1 {
		t.Errorf("Sweep = %+v, want Removed 1 (the completed intent) and Overdue 1 (the pending one)", r)
	}

	ev, err := watch.Recv()
	if err != nil {
		t.Fatalf("Watch.Recv after the sweep: %v", err)
	}
	if ev.GetType() != intentv1.WatchResponse_TYPE_DELETED || ev.GetIntent().GetKey() != key || ev.GetIntent().GetState() != intentv1.State_STATE_COMPLETED {
		t.Errorf("Watch event = %v %s %v, want TYPE_DELETED %s COMPLETED", ev.GetType(), ev.GetIntent().GetKey(), ev.GetIntent().GetState(), key)
	}

	// A tombstone says how the intent ended; packed, it keeps no
	// fingerprint, and the metadata then has no fingerprint key.
	meta := map[string]string{"final_state": "COMPLETED"}
	calls := []struct {
		name string
		call func() error
	}{
		{"Register", func() error {
			_, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, lamp(1))})
			return err
		}},
		{"Get", func() error {
			_, err := c.Get(f.ctx, &intentv1.GetRequest{Key: key})
			return err
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			d := checkError(t, tc.call(), codes.FailedPrecondition, "INTENT_EXPIRED", "")
			for k, want := range meta {
				if got := d.info.GetMetadata()[k]; got != want {
					t.Errorf("ErrorInfo.metadata[%s] = %q, want %q", k, got, want)
				}
			}
			if fp, ok := d.info.GetMetadata()["fingerprint"]; ok {
				t.Errorf("ErrorInfo.metadata[fingerprint] = %q, want no such key: a packed tombstone keeps none", fp)
			}
		})
	}

	late := f.acquire(key, f.session("late"), "late-1")
	if got, want := late.GetOutcome(), intentv1.Outcome_OUTCOME_EXPIRED; got != want {
		t.Fatalf("late Acquire: outcome %v, want %v", got, want)
	}
	if late.GetLease() != nil || late.GetActionTaken() != "none" {
		t.Errorf("late Acquire: lease %v action_taken %q, want no lease and none", late.GetLease(), late.GetActionTaken())
	}
	if st := late.GetStatement(); st.GetStatus() != "expired" || !strings.HasSuffix(st.GetText(), "action_taken: none") {
		t.Errorf("late Acquire: statement %v, want status expired ending in action_taken: none", st)
	}

	if got := f.get(waiting); got.GetState() != intentv1.State_STATE_PENDING {
		t.Errorf("Get(%q) past retention: %v, want it kept PENDING", waiting, got.GetState())
	}
}

// TestRefusalStatements checks the Statement a refused fenced call carries
// in its error details: what became of the intent, and what the call did.
func TestRefusalStatements(t *testing.T) {
	c := newClient(t)
	stale := &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-stale"}}

	t.Run("stale token after the newer lease completed", func(t *testing.T) {
		f := newFx(t, c)
		const key = "stale-completed"
		p := superseded(f, key)
		newer := &intentv1.Result{Payload: []byte("found"), ExternalRefs: map[string]string{"supplier_order_id": "SO-2"}}
		f.complete(key, p.newer, newer)
		in := f.get(key)

		_, err := c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: stale})
		d := checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
		if got, want := d.info.GetMetadata()["current_token"], fmt.Sprint(p.newer); got != want {
			t.Errorf("ErrorInfo.metadata[current_token] = %q, want %q", got, want)
		}
		st := statementOf(err)
		if st == nil {
			t.Fatalf("no Statement in %v", err)
		}
		if st.GetStatus() != "stale_token" || st.GetIntentKey() != key || st.GetCurrentToken() != p.newer || st.GetActionTaken() != "evidence_recorded" {
			t.Errorf("Statement = %v, want status stale_token, intent %s, current token %d, action_taken evidence_recorded", st, key, p.newer)
		}
		if st.GetState() != intentv1.State_STATE_COMPLETED || !proto.Equal(st.GetResult(), newer) || !proto.Equal(st.GetCompletedAt(), in.GetCompletedAt()) {
			t.Errorf("Statement state %v result %v completed_at %v, want COMPLETED %v %v", st.GetState(), st.GetResult(), st.GetCompletedAt(), newer, in.GetCompletedAt())
		}
		if !strings.HasSuffix(st.GetText(), "action_taken: evidence_recorded") {
			t.Errorf("Statement text %q, want it to end in action_taken: evidence_recorded", st.GetText())
		}
		after := f.get(key)
		if !proto.Equal(after.GetResult(), newer) {
			t.Errorf("result after the stale report = %v, want %v", after.GetResult(), newer)
		}
		if !hasEntry(after, func(e *intentv1.HistoryEntry) bool {
			return e.GetKind() == intentv1.HistoryEntry_KIND_COMPLETED && e.GetToken() == p.token && !e.GetAccepted()
		}) {
			t.Errorf("history has no unaccepted KIND_COMPLETED under token %d: %v", p.token, after.GetHistory())
		}
	})

	t.Run("stale token while the newer lease holds it", func(t *testing.T) {
		f := newFx(t, c)
		const key = "stale-held"
		p := superseded(f, key)
		_, err := c.Fail(f.ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: "card_declined"}})
		checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
		st := statementOf(err)
		if st.GetStatus() != "stale_token" || st.GetCurrentToken() != p.newer || st.GetActionTaken() != "evidence_recorded" {
			t.Errorf("Statement = %v, want stale_token, current token %d, evidence_recorded", st, p.newer)
		}
		if st.GetState() != intentv1.State_STATE_IN_PROGRESS || st.GetResult() != nil || st.GetCompletedAt() != nil {
			t.Errorf("Statement state %v result %v completed_at %v, want IN_PROGRESS without result or completion", st.GetState(), st.GetResult(), st.GetCompletedAt())
		}
	})

	t.Run("stale token after the newer holder lapsed", func(t *testing.T) {
		f := newFx(t, c)
		const key = "stale-lapsed"
		p := held(f, key)
		f.markUnknown(key, p.token)
		s2, t2 := f.lease(key, "w2", intentv1.Outcome_OUTCOME_RECONCILE)
		if _, err := c.CloseSession(f.ctx, &intentv1.CloseSessionRequest{SessionId: s2}); err != nil {
			t.Fatalf("CloseSession: %v", err)
		}
		if got := f.get(key).GetState(); got != intentv1.State_STATE_UNKNOWN {
			t.Fatalf("Get after the reconciler's session closed: %v, want UNKNOWN", got)
		}
		_, err := c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: stale})
		checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
		if st := statementOf(err); st.GetState() != intentv1.State_STATE_UNKNOWN || st.GetCurrentToken() != t2 {
			t.Errorf("Statement state %v current token %d, want UNKNOWN (as Get says) and %d", st.GetState(), st.GetCurrentToken(), t2)
		}
	})

	t.Run("refused report under the current token of an intent in review", func(t *testing.T) {
		f := newFx(t, c)
		const key = "refused-review"
		p := escalated(f, key)
		_, err := c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef})
		d := checkError(t, err, codes.FailedPrecondition, "INVALID_TRANSITION", "")
		if got := d.info.GetMetadata()["state"]; got != "NEEDS_REVIEW" {
			t.Errorf("ErrorInfo.metadata[state] = %q, want NEEDS_REVIEW", got)
		}
		st := statementOf(err)
		if st.GetStatus() != "refused" || st.GetIntentKey() != key || st.GetState() != intentv1.State_STATE_NEEDS_REVIEW || st.GetActionTaken() != "evidence_recorded" {
			t.Errorf("Statement = %v, want refused, %s, NEEDS_REVIEW, evidence_recorded", st, key)
		}
		if !strings.HasSuffix(st.GetText(), "action_taken: evidence_recorded") {
			t.Errorf("Statement text %q, want it to end in action_taken: evidence_recorded", st.GetText())
		}
		if in := f.get(key); !hasEntry(in, func(e *intentv1.HistoryEntry) bool {
			return e.GetKind() == intentv1.HistoryEntry_KIND_COMPLETED && e.GetToken() == p.token && !e.GetAccepted()
		}) {
			t.Errorf("history has no unaccepted KIND_COMPLETED under token %d: %v", p.token, in.GetHistory())
		}
	})
}

// TestAcquireOutcomeStatements brings an intent into each state and
// acquires it with a fresh session: every outcome carries a Statement whose
// status names it, whose action_taken agrees with the response, and whose
// text ends in "action_taken: none" unless a lease was issued.
func TestAcquireOutcomeStatements(t *testing.T) {
	e := etcdtest.Start(t)
	clock := newFakeClock()
	cfg := etcdstore.DefaultConfig()
	cfg.Now = clock.Now
	store, c := serveStore(t, e, cfg)
	tests := []struct {
		name    string
		setup   func(f *fx, key string)
		outcome intentv1.Outcome
		status  string
		lease   bool // a lease is issued to the caller
	}{
		{"execute", func(f *fx, key string) { pending(f, key) }, intentv1.Outcome_OUTCOME_EXECUTE, "execute", true},
		{"reconcile", func(f *fx, key string) { markedUnknown(f, key) }, intentv1.Outcome_OUTCOME_RECONCILE, "reconcile", true},
		{"already_completed", func(f *fx, key string) { completed(f, key) }, intentv1.Outcome_OUTCOME_COMPLETED, "already_completed", false},
		{"in_progress", func(f *fx, key string) { held(f, key) }, intentv1.Outcome_OUTCOME_IN_PROGRESS, "in_progress", false},
		{"needs_review", func(f *fx, key string) {
			pending(f, key)
			f.escalateAsReviewer(key)
		}, intentv1.Outcome_OUTCOME_NEEDS_REVIEW, "needs_review", false},
		{"expired", func(f *fx, key string) {
			if _, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(f.t, lamp(1)), Retention: durationpb.New(time.Minute)}); err != nil {
				f.t.Fatalf("Register: %v", err)
			}
			_, token := f.lease(key, "w1", intentv1.Outcome_OUTCOME_EXECUTE)
			f.complete(key, token, orderRef)
			clock.Advance(2 * time.Minute)
			if r, err := store.Sweep(f.ctx); err != nil || r.Removed != 1 {
				f.t.Fatalf("Sweep = %+v, %v; want the intent removed", r, err)
			}
		}, intentv1.Outcome_OUTCOME_EXPIRED, "expired", false},
		{"cancelled", func(f *fx, key string) {
			pending(f, key)
			if _, err := f.c.Cancel(f.ctx, &intentv1.CancelRequest{Key: key, Actor: "approver", Reason: "not needed"}); err != nil {
				f.t.Fatalf("Cancel: %v", err)
			}
		}, intentv1.Outcome_OUTCOME_CANCELLED, "cancelled", false},
		{"already_failed", func(f *fx, key string) {
			p := held(f, key)
			if _, err := f.c.Fail(f.ctx, &intentv1.FailRequest{Key: key, Token: p.token, Failure: &intentv1.Failure{Code: "card_declined"}}); err != nil {
				f.t.Fatalf("Fail: %v", err)
			}
		}, intentv1.Outcome_OUTCOME_FAILED, "already_failed", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, c)
			key := "outcome-" + tc.name
			tc.setup(f, key)

			resp := f.acquire(key, f.session("probe"), "probe-1")
			if got := resp.GetOutcome(); got != tc.outcome {
				t.Fatalf("outcome = %v, want %v", got, tc.outcome)
			}
			st := resp.GetStatement()
			if st.GetStatus() != tc.status || st.GetIntentKey() != key {
				t.Errorf("statement status %q intent %q, want %q %q", st.GetStatus(), st.GetIntentKey(), tc.status, key)
			}
			if !strings.HasPrefix(st.GetText(), tc.status+":") || !strings.Contains(st.GetText(), key) {
				t.Errorf("statement text %q, want it to start with %q and name %s", st.GetText(), tc.status+":", key)
			}
			if st.GetState() != resp.GetIntent().GetState() {
				t.Errorf("statement state %v, want %v as the response's intent", st.GetState(), resp.GetIntent().GetState())
			}
			wantTaken := "none"
			if tc.lease {
				wantTaken = "lease_issued"
				if st.GetCurrentToken() == 0 || st.GetCurrentToken() != resp.GetLease().GetToken() {
					t.Errorf("statement current_token %d, want the lease's %d", st.GetCurrentToken(), resp.GetLease().GetToken())
				}
			}
			if st.GetActionTaken() != wantTaken || resp.GetActionTaken() != wantTaken {
				t.Errorf("action_taken: statement %q response %q, want %q", st.GetActionTaken(), resp.GetActionTaken(), wantTaken)
			}
			if ends := strings.HasSuffix(st.GetText(), "action_taken: none"); ends == tc.lease {
				t.Errorf("statement text %q ends in action_taken: none = %t, want %t", st.GetText(), ends, !tc.lease)
			}
			if tc.outcome == intentv1.Outcome_OUTCOME_COMPLETED {
				if !proto.Equal(st.GetResult(), orderRef) || st.GetCompletedAt() == nil || !strings.Contains(st.GetText(), "SO-1") {
					t.Errorf("statement result %v completed_at %v text %q, want %v, a completion time and SO-1 in the text", st.GetResult(), st.GetCompletedAt(), st.GetText(), orderRef)
				}
			}
		})
	}
}

// TestReviewRoundTrip walks the review queue over gRPC: a worker times
// out, a reconciler cannot decide and escalates, the review queue shows the
// intent, a reviewer resolves it COMPLETED with the supplier's order id, and
// the original worker's later Acquire replays that result.
func TestReviewRoundTrip(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	const key, earlier, done = "purchase-lamp", "purchase-desk", "purchase-chair"

	// Another intent in the queue, registered first, and one not in it.
	markedUnknown(f, earlier)
	completed(f, done)

	f.register(key, lamp(1))
	s1, t1 := f.lease(key, "w1", intentv1.Outcome_OUTCOME_EXECUTE)
	f.markUnknown(key, t1)
	_, t2 := f.lease(key, "reconciler", intentv1.Outcome_OUTCOME_RECONCILE)
	esc, err := c.Escalate(f.ctx, &intentv1.EscalateRequest{Key: key, Token: t2, Reason: "supplier portal is down", Actor: "reconciler"})
	if err != nil {
		t.Fatalf("Escalate: %v", err)
	}
	if got := esc.GetIntent().GetState(); got != intentv1.State_STATE_NEEDS_REVIEW {
		t.Errorf("Escalate: state %v, want NEEDS_REVIEW", got)
	}

	queue := []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW}
	page := f.list(&intentv1.ListRequest{States: queue})
	if got, want := keysOf(page.GetIntents()), []string{earlier, key}; !slices.Equal(got, want) {
		t.Fatalf("review queue = %q, want %q (oldest first)", got, want)
	}
	if got := page.GetIntents()[1].GetState(); got != intentv1.State_STATE_NEEDS_REVIEW {
		t.Errorf("review queue lists %s as %v, want NEEDS_REVIEW", key, got)
	}

	found := &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-9001"}}
	decide := &intentv1.ResolveRequest{RequestId: "review-10",
		Key: key, Decision: intentv1.Decision_DECISION_COMPLETED, Result: found,
		Actor: "alice@ops", Reason: "order SO-9001 found in the supplier portal",
	}
	res, err := c.Resolve(f.ctx, decide)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if res.GetActionTaken() != "recorded" || res.GetIntent().GetState() != intentv1.State_STATE_COMPLETED || !proto.Equal(res.GetIntent().GetResult(), found) {
		t.Errorf("Resolve: %q %v %v, want recorded COMPLETED %v", res.GetActionTaken(), res.GetIntent().GetState(), res.GetIntent().GetResult(), found)
	}
	again, err := c.Resolve(f.ctx, decide)
	if err != nil || again.GetActionTaken() != "none" {
		t.Errorf("Resolve retried: %v, %v; want action_taken none", again.GetActionTaken(), err)
	}

	in := f.get(key)
	last := in.GetHistory()[len(in.GetHistory())-1]
	if last.GetKind() != intentv1.HistoryEntry_KIND_RESOLVED || last.GetPrincipal() != decide.GetActor() || last.GetReason() != decide.GetReason() ||
		last.GetResolvedState() != intentv1.State_STATE_COMPLETED || !last.GetAccepted() {
		t.Errorf("last history entry = %v, want an accepted KIND_RESOLVED by %s for %q to COMPLETED", last, decide.GetActor(), decide.GetReason())
	}
	if !hasEntry(in, func(e *intentv1.HistoryEntry) bool {
		return e.GetKind() == intentv1.HistoryEntry_KIND_ESCALATED && e.GetToken() == t2 && e.GetPrincipal() == "reconciler"
	}) {
		t.Errorf("history has no KIND_ESCALATED by the reconciler under token %d: %v", t2, in.GetHistory())
	}

	// The decision superseded the reconciler's lease.
	_, err = c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: t2, Result: &intentv1.Result{Payload: []byte("late")}})
	d := checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
	if cur := d.info.GetMetadata()["current_token"]; cur == fmt.Sprint(t2) || cur == "" {
		t.Errorf("current_token after Resolve = %q, want one newer than %d", cur, t2)
	}

	replay := f.acquire(key, s1, "w1-after-restart")
	if replay.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED || replay.GetActionTaken() != "none" || replay.GetLease() != nil {
		t.Errorf("original worker's Acquire: %v %q lease %v, want COMPLETED, none, no lease", replay.GetOutcome(), replay.GetActionTaken(), replay.GetLease())
	}
	if !proto.Equal(replay.GetIntent().GetResult(), found) {
		t.Errorf("original worker's Acquire: result %v, want %v", replay.GetIntent().GetResult(), found)
	}
	if s := replay.GetStatement().GetText(); !strings.Contains(s, "SO-9001") || !strings.HasSuffix(s, "action_taken: none") {
		t.Errorf("original worker's statement %q, want SO-9001 … action_taken: none", s)
	}

	if got, want := keysOf(f.list(&intentv1.ListRequest{States: queue}).GetIntents()), []string{earlier}; !slices.Equal(got, want) {
		t.Errorf("review queue after Resolve = %q, want %q", got, want)
	}
}

// TestForcedResolveSupersedesLease resolves an intent a live worker holds:
// refused without force, accepted with it, and the holder's later report is
// stale evidence that changes nothing.
func TestForcedResolveSupersedesLease(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	const key = "forced"
	p := held(f, key)
	decide := &intentv1.ResolveRequest{RequestId: "review-11", Key: key, Decision: intentv1.Decision_DECISION_CANCELLED, Actor: "alice", Reason: "customer withdrew"}
	_, err := c.Resolve(f.ctx, decide)
	checkError(t, err, codes.FailedPrecondition, "LEASE_HELD", "")

	decide.Force = true
	res, err := c.Resolve(f.ctx, decide)
	if err != nil {
		t.Fatalf("Resolve with force: %v", err)
	}
	if res.GetIntent().GetState() != intentv1.State_STATE_CANCELLED || res.GetIntent().GetLease().GetToken() <= p.token {
		t.Errorf("Resolve with force: %v token %d, want CANCELLED under a token above %d", res.GetIntent().GetState(), res.GetIntent().GetLease().GetToken(), p.token)
	}
	_, err = c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef})
	checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
	if got := f.get(key); got.GetState() != intentv1.State_STATE_CANCELLED || got.GetResult() != nil {
		t.Errorf("after the holder's report: %v result %v, want CANCELLED without result", got.GetState(), got.GetResult())
	}
}

// TestResolveRetryIsReplayed retries an identical Resolve after the intent
// moved on: the retry must be recognized as the decision already taken
// (action_taken none), never applied again.
func TestResolveRetryIsReplayed(t *testing.T) {
	c := newClient(t)

	t.Run("after stale evidence arrived", func(t *testing.T) {
		f := newFx(t, c)
		const key = "retry-evidence"
		p := markedUnknown(f, key)
		decide := &intentv1.ResolveRequest{RequestId: "review-12", Key: key, Decision: intentv1.Decision_DECISION_COMPLETED, Result: orderRef, Actor: "alice", Reason: "found it"}
		if _, err := c.Resolve(f.ctx, decide); err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		_, err := c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: p.token, Result: orderRef})
		checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
		again, err := c.Resolve(f.ctx, decide)
		if err != nil || again.GetActionTaken() != "none" {
			t.Errorf("Resolve retried: %q, %v; want action_taken none", again.GetActionTaken(), err)
		}
	})

	t.Run("after a new attempt lapsed", func(t *testing.T) {
		f := newFx(t, c)
		const key = "retry-lapsed"
		markedUnknown(f, key)
		decide := &intentv1.ResolveRequest{RequestId: "review-13", Key: key, Decision: intentv1.Decision_DECISION_PENDING, Actor: "alice", Reason: "no order at the supplier"}
		if _, err := c.Resolve(f.ctx, decide); err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		s, _ := f.lease(key, "w2", intentv1.Outcome_OUTCOME_EXECUTE)
		if _, err := c.CloseSession(f.ctx, &intentv1.CloseSessionRequest{SessionId: s}); err != nil {
			t.Fatalf("CloseSession: %v", err)
		}
		again, err := c.Resolve(f.ctx, decide)
		if err == nil && again.GetActionTaken() != "none" {
			t.Errorf("Resolve retried: action_taken %q state %v, want the retry recognized (none), not applied again", again.GetActionTaken(), again.GetIntent().GetState())
		}
		next := f.acquire(key, f.session("w3"), "w3-1")
		if got := next.GetOutcome(); got == intentv1.Outcome_OUTCOME_EXECUTE {
			t.Errorf("Acquire after the retried Resolve: %v; the lapsed attempt's outcome is unknown, want RECONCILE", got)
		}
	})
}

// TestListByLabelAcrossSessions registers intents for two agent sessions,
// completes some, and lists one session's completed intents with their
// results, as an agent host does to carry work forward into a new session;
// paginated, every intent comes exactly once.
func TestListByLabelAcrossSessions(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	sess := f.session("agent")
	results := map[string]*intentv1.Result{}
	reg := func(key, session string) {
		if _, err := c.Register(f.ctx, &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, lamp(1)), Labels: map[string]string{"session": session, "customer": "c-17"}}); err != nil {
			t.Fatalf("Register(%q): %v", key, err)
		}
	}
	complete := func(key string) {
		token := f.acquire(key, sess, "r-"+key).GetLease().GetToken()
		res := &intentv1.Result{Payload: []byte("receipt " + key), ExternalRefs: map[string]string{"supplier_order_id": "SO-" + key}}
		f.complete(key, token, res)
		results[key] = res
	}
	var s1 []string
	for i := range 7 {
		k := fmt.Sprintf("s1-%d", i)
		reg(k, "s1")
		s1 = append(s1, k)
		reg(fmt.Sprintf("s2-%d", i), "s2")
	}
	var want []string
	for _, k := range []string{"s1-0", "s1-2", "s1-3", "s1-6", "s2-1", "s2-3"} {
		complete(k)
		if strings.HasPrefix(k, "s1-") {
			want = append(want, k)
		}
	}
	f.acquire("s1-4", sess, "r-s1-4") // in progress: not carried forward as done

	filter := &intentv1.ListRequest{Label: "session=s1", States: []intentv1.State{intentv1.State_STATE_COMPLETED}}
	whole := f.list(filter)
	if got := keysOf(whole.GetIntents()); !slices.Equal(got, want) {
		t.Fatalf("List(session=s1, COMPLETED) = %q, want %q", got, want)
	}
	if whole.GetNextPageToken() != "" {
		t.Errorf("List(session=s1, COMPLETED): next_page_token %q, want none", whole.GetNextPageToken())
	}
	for _, in := range whole.GetIntents() {
		if !proto.Equal(in.GetResult(), results[in.GetKey()]) || in.GetState() != intentv1.State_STATE_COMPLETED || in.GetLabels()["session"] != "s1" {
			t.Errorf("listed %s: %v %v labels %v, want COMPLETED %v in session s1", in.GetKey(), in.GetState(), in.GetResult(), in.GetLabels(), results[in.GetKey()])
		}
	}

	paged := []struct {
		name string
		req  *intentv1.ListRequest
		want []string
	}{
		{"completed in s1", filter, want},
		{"all of s1", &intentv1.ListRequest{Label: "session=s1"}, s1},
	}
	for _, tc := range paged {
		t.Run(tc.name+" by pages of 2", func(t *testing.T) {
			var got []string
			var rev int64
			req := proto.CloneOf(tc.req)
			req.PageSize = 2
			for pages := 0; ; pages++ {
				if pages > 2*len(tc.want)+2 {
					t.Fatalf("still paging after %d pages; seen %q", pages, got)
				}
				resp := f.list(req)
				if n := len(resp.GetIntents()); n > 2 {
					t.Errorf("page %d has %d intents, want at most 2", pages, n)
				}
				if rev == 0 {
					rev = resp.GetRevision()
				} else if resp.GetRevision() != rev {
					t.Errorf("page %d read revision %d, want %d as the first page", pages, resp.GetRevision(), rev)
				}
				got = append(got, keysOf(resp.GetIntents())...)
				if resp.GetNextPageToken() == "" {
					break
				}
				req.PageToken = resp.GetNextPageToken()
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("pages visited %q, want each of %q once, in order", got, tc.want)
			}
		})
	}
}

// TestWatch follows intents over gRPC: a waiting duplicate caller watches
// from the revision Acquire returned and sees the completion with its
// result; a watch from a compacted revision ends with REVISION_COMPACTED
// instead of hanging or skipping; a client that cancels ends the stream,
// and the server's handler returns.
func TestWatch(t *testing.T) {
	e := etcdtest.Start(t)
	first, second := serve(t, e), serve(t, e)
	f := newFx(t, first)

	t.Run("a second caller waits for COMPLETED", func(t *testing.T) {
		const key = "watched"
		f.register(key, lamp(1))
		acq := f.acquire(key, f.session("w1"), "r1")
		from := acq.GetIntent().GetRevision()
		token := acq.GetLease().GetToken()

		wctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
		defer cancel()
		stream, err := second.Watch(wctx, &intentv1.WatchRequest{Key: key, StartRevision: from})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := first.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: token, Result: orderRef}); err != nil {
				t.Errorf("Complete: %v", err)
			}
		}()
		defer func() { <-done }()

		last := int64(0)
		for {
			ev, err := stream.Recv()
			if err != nil {
				t.Fatalf("Recv: %v (no COMPLETED event)", err)
			}
			if ev.GetRevision() < from || ev.GetRevision() <= last {
				t.Errorf("event at revision %d after %d, want increasing revisions from %d", ev.GetRevision(), last, from)
			}
			if last == 0 && (ev.GetRevision() != from || ev.GetIntent().GetState() != intentv1.State_STATE_IN_PROGRESS) {
				t.Errorf("first event: %v at revision %d, want the acquisition (IN_PROGRESS at %d)", ev.GetIntent().GetState(), ev.GetRevision(), from)
			}
			last = ev.GetRevision()
			if ev.GetType() != intentv1.WatchResponse_TYPE_PUT || ev.GetIntent().GetKey() != key {
				t.Errorf("event %v for %q, want TYPE_PUT for %q", ev.GetType(), ev.GetIntent().GetKey(), key)
			}
			if ev.GetIntent().GetState() == intentv1.State_STATE_COMPLETED {
				if !proto.Equal(ev.GetIntent().GetResult(), orderRef) {
					t.Errorf("COMPLETED event result %v, want %v", ev.GetIntent().GetResult(), orderRef)
				}
				return
			}
		}
	})

	t.Run("from a compacted revision", func(t *testing.T) {
		const key = "compacted"
		f.register(key, lamp(1))
		old := f.acquire(key, f.session("w1"), "r1")
		f.complete(key, old.GetLease().GetToken(), orderRef)
		cli := e.Client(t)
		now, err := cli.Get(f.ctx, "any")
		if err != nil {
			t.Fatalf("etcd Get: %v", err)
		}
		compactRev := now.Header.Revision
		if _, err := cli.Compact(f.ctx, compactRev, clientv3.WithCompactPhysical()); err != nil {
			t.Fatalf("etcd Compact(%d): %v", compactRev, err)
		}
		requests := []struct {
			name string
			req  *intentv1.WatchRequest
		}{
			{"one key", &intentv1.WatchRequest{Key: key, StartRevision: old.GetIntent().GetRevision()}},
			{"a filter", &intentv1.WatchRequest{States: []intentv1.State{intentv1.State_STATE_COMPLETED}, StartRevision: 1}},
		}
		for _, tc := range requests {
			t.Run(tc.name, func(t *testing.T) {
				wctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
				defer cancel()
				stream, err := second.Watch(wctx, tc.req)
				if err != nil {
					t.Fatalf("Watch: %v", err)
				}
				var ev *intentv1.WatchResponse
				for err == nil {
					if ev, err = stream.Recv(); err == nil {
						t.Errorf("event %v at revision %d from a compacted start", ev.GetIntent().GetState(), ev.GetRevision())
					}
				}
				d := checkError(t, err, codes.FailedPrecondition, "REVISION_COMPACTED", "")
				if got, want := d.info.GetMetadata()["compact_revision"], fmt.Sprint(compactRev); got != want {
					t.Errorf("ErrorInfo.metadata[compact_revision] = %q, want %q", got, want)
				}
			})
		}
	})

	t.Run("cancelled by the client", func(t *testing.T) {
		ended := make(chan error, 1)
		observe := grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			err := handler(srv, ss)
			ended <- err
			return err
		})
		_, third := serveStore(t, e, etcdstore.DefaultConfig(), observe)
		const key = "cancelled-watch"
		in := f.register(key, lamp(1))

		wctx, cancel := context.WithCancel(f.ctx)
		defer cancel()
		stream, err := third.Watch(wctx, &intentv1.WatchRequest{Key: key, StartRevision: in.GetRevision()})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("Recv of the registration: %v", err)
		}
		cancel()
		if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
			t.Errorf("Recv after cancel: %v, want %v", err, codes.Canceled)
		}
		select {
		case err := <-ended:
			if got := status.Code(err); got != codes.Canceled {
				t.Errorf("Watch handler returned %v, want %v", err, codes.Canceled)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Watch handler still running 5s after the client cancelled")
		}
	})
}

// TestOutbox completes an intent with two children in one call: the parent
// lists them PENDING, a dispatcher acquires them like any intent, and a
// retried identical Complete records nothing and adds no child. A stale
// Complete registers no children.
func TestOutbox(t *testing.T) {
	c := newClient(t)

	t.Run("children with the completion", func(t *testing.T) {
		f := newFx(t, c)
		const parent = "order-7"
		p := held(f, parent)
		kids := []*intentv1.RegisterRequest{child(t, parent+":email", "confirmation email"), child(t, parent+":ship", "shipping label")}
		req := &intentv1.CompleteRequest{Key: parent, Token: p.token, Result: orderRef, Children: kids}
		resp, err := c.Complete(f.ctx, req)
		if err != nil {
			t.Fatalf("Complete with children: %v", err)
		}
		if resp.GetActionTaken() != "recorded" {
			t.Errorf("Complete: action_taken %q, want recorded", resp.GetActionTaken())
		}
		wantChildren := func(when string, states map[string]intentv1.State) {
			t.Helper()
			in := f.get(parent)
			got := map[string]intentv1.State{}
			for _, ch := range in.GetChildren() {
				if _, dup := got[ch.GetKey()]; dup {
					t.Errorf("%s: child %s listed twice", when, ch.GetKey())
				}
				got[ch.GetKey()] = ch.GetState()
			}
			if len(got) != len(states) || len(in.GetChildren()) != len(states) {
				t.Errorf("%s: children %v, want %v", when, in.GetChildren(), states)
			}
			for k, want := range states {
				if got[k] != want {
					t.Errorf("%s: child %s in %v, want %v", when, k, got[k], want)
				}
			}
			if n := countEntries(in, intentv1.HistoryEntry_KIND_CHILD_REGISTERED); n != len(kids) {
				t.Errorf("%s: parent history has %d KIND_CHILD_REGISTERED, want %d", when, n, len(kids))
			}
			listed := f.list(&intentv1.ListRequest{ParentKey: parent})
			if got, want := keysOf(listed.GetIntents()), []string{kids[0].GetKey(), kids[1].GetKey()}; !slices.Equal(got, want) {
				t.Errorf("%s: List(parent %s) = %q, want %q", when, parent, got, want)
			}
		}
		wantChildren("after Complete", map[string]intentv1.State{
			kids[0].GetKey(): intentv1.State_STATE_PENDING, kids[1].GetKey(): intentv1.State_STATE_PENDING,
		})
		if got := f.get(kids[0].GetKey()); got.GetParentKey() != parent || got.GetState() != intentv1.State_STATE_PENDING {
			t.Errorf("Get(%s): parent %q state %v, want parent %q PENDING", kids[0].GetKey(), got.GetParentKey(), got.GetState(), parent)
		}

		_, token := f.lease(kids[0].GetKey(), "dispatcher", intentv1.Outcome_OUTCOME_EXECUTE)
		f.complete(kids[0].GetKey(), token, &intentv1.Result{ExternalRefs: map[string]string{"message_id": "m-1"}})
		f.lease(kids[1].GetKey(), "dispatcher-2", intentv1.Outcome_OUTCOME_EXECUTE)

		retry, err := c.Complete(f.ctx, req)
		if err != nil {
			t.Fatalf("Complete retried: %v", err)
		}
		if retry.GetActionTaken() != "none" || !proto.Equal(retry.GetIntent().GetResult(), orderRef) {
			t.Errorf("Complete retried: action_taken %q result %v, want none and %v", retry.GetActionTaken(), retry.GetIntent().GetResult(), orderRef)
		}
		wantChildren("after the retry", map[string]intentv1.State{
			kids[0].GetKey(): intentv1.State_STATE_COMPLETED, kids[1].GetKey(): intentv1.State_STATE_IN_PROGRESS,
		})
	})

	t.Run("no children from a stale Complete", func(t *testing.T) {
		f := newFx(t, c)
		const parent = "order-8"
		p := superseded(f, parent)
		kid := child(t, parent+":email", "confirmation email")
		_, err := c.Complete(f.ctx, &intentv1.CompleteRequest{Key: parent, Token: p.token, Result: orderRef, Children: []*intentv1.RegisterRequest{kid}})
		checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
		if got := f.get(kid.GetKey()); got != nil {
			t.Errorf("child %s exists after a stale Complete: %v", kid.GetKey(), got.GetState())
		}
		if got := f.get(parent).GetChildren(); len(got) != 0 {
			t.Errorf("parent children after a stale Complete = %v, want none", got)
		}
	})
}

// TestResolveRecordsChannel decides two intents alike, one through the API
// and one as the review console does (channel "console"): their history
// entries differ in the channel alone, and a channel that is not a short
// word is refused.
func TestResolveRecordsChannel(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	entry := func(key, channel string) *intentv1.HistoryEntry {
		markedUnknown(f, key)
		if _, err := c.Resolve(f.ctx, &intentv1.ResolveRequest{RequestId: "review-" + key, Key: key, Decision: intentv1.Decision_DECISION_PENDING,
			Actor: "alice", Reason: "no order at the supplier", Channel: channel}); err != nil {
			t.Fatalf("Resolve(%q, channel %q): %v", key, channel, err)
		}
		h := f.get(key).GetHistory()
		e := h[len(h)-1]
		if e.GetKind() != intentv1.HistoryEntry_KIND_RESOLVED || e.GetChannel() != channel {
			t.Fatalf("last history entry of %q: %v channel %q, want KIND_RESOLVED channel %q", key, e.GetKind(), e.GetChannel(), channel)
		}
		return e
	}
	api, console := entry("by-api", ""), entry("by-console", "console")
	// What differs between two intents anyway: their own tokens and times.
	for _, e := range []*intentv1.HistoryEntry{api, console} {
		e.Time, e.Token, e.Channel = nil, 0, ""
	}
	if !proto.Equal(api, console) {
		t.Errorf("history entries differ beyond the channel:\napi     %v\nconsole %v", api, console)
	}
	markedUnknown(f, "bad-channel")
	_, err := c.Resolve(f.ctx, &intentv1.ResolveRequest{RequestId: "review-bad", Key: "bad-channel", Decision: intentv1.Decision_DECISION_PENDING,
		Actor: "alice", Reason: "r", Channel: "Console!"})
	checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "channel")
}

// TestResolveFencedByExpectedToken has two reviewers decide the same
// UNKNOWN intent, each naming the token they looked at: the first decision
// applies, the second is refused STALE_TOKEN with the token the first
// issued, and the intent keeps the first decision.
func TestResolveFencedByExpectedToken(t *testing.T) {
	c := newClient(t)
	f := newFx(t, c)
	const key = "two-reviewers"
	markedUnknown(f, key)
	seen := f.get(key).GetLease().GetToken()
	if seen == 0 {
		t.Fatalf("UNKNOWN intent shows no lease token")
	}
	first, err := c.Resolve(f.ctx, &intentv1.ResolveRequest{RequestId: "alice-1", Key: key, Decision: intentv1.Decision_DECISION_PENDING,
		Actor: "alice", Reason: "no order at the supplier", ExpectedToken: seen})
	if err != nil {
		t.Fatalf("first Resolve: %v", err)
	}
	_, err = c.Resolve(f.ctx, &intentv1.ResolveRequest{RequestId: "bob-1", Key: key, Decision: intentv1.Decision_DECISION_CANCELLED,
		Actor: "bob", Reason: "customer asked", ExpectedToken: seen})
	d := checkError(t, err, codes.Aborted, "STALE_TOKEN", "")
	if got, want := d.info.GetMetadata()["current_token"], fmt.Sprint(first.GetIntent().GetLease().GetToken()); got != want {
		t.Errorf("second Resolve: current_token %q, want %q (the first decision's)", got, want)
	}
	if got := f.get(key).GetState(); got != intentv1.State_STATE_PENDING {
		t.Errorf("after both: %v, want PENDING (the first decision)", got)
	}
}
