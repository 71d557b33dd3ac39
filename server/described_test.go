package server_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/server"
)

// refund is the identity of refund n: the order and the return that make
// one refund distinct from another (a second return of the same order is a
// second refund).
func refund(n int) map[string]any {
	return map[string]any{"order_id": "ORD-88412", "return_id": fmt.Sprintf("RA-%d", n)}
}

// derivedKey is the key DeriveKey gives action and identity.
func derivedKey(t *testing.T, action string, identity map[string]any) string {
	t.Helper()
	key, _, err := intent.DeriveKey(action, identity)
	if err != nil {
		t.Fatalf("intent.DeriveKey(%q, %v): %v", action, identity, err)
	}
	return key
}

// described is what an accepted registration must have stored: the key,
// given or derived, and the action, identity and summary a reviewer is
// shown.
type described struct {
	key, action, summary string
	identity             map[string]any // nil: none
}

// checkDescribed fails the test unless in is described by want.
func checkDescribed(t *testing.T, what string, in *intentv1.Intent, want described) {
	t.Helper()
	if in.GetKey() != want.key || in.GetAction() != want.action || in.GetSummary() != want.summary {
		t.Errorf("%s: key %q, action %q, summary %q; want %q, %q, %q", what, in.GetKey(), in.GetAction(), in.GetSummary(), want.key, want.action, want.summary)
	}
	var identity *structpb.Struct
	if want.identity != nil {
		identity = mustStruct(t, want.identity)
	}
	if !proto.Equal(in.GetIdentity(), identity) {
		t.Errorf("%s: identity %v, want %v", what, in.GetIdentity(), identity)
	}
}

// TestRegistrationAdmission: Register, Acquire's register and Complete's
// children take an action, an identity and a summary. An empty key with an
// identity is derived as DeriveKey derives it; a given key must be that
// derivation; an identity needs its action and follows DeriveKey's rules;
// no key and no identity is the "key" required it always was. Each refusal
// is INVALID_ARGUMENT / INVALID_FIELD naming the field (never INTERNAL) and
// writes nothing; each acceptance stores what Register, Get and Acquire
// then answer.
func TestRegistrationAdmission(t *testing.T) {
	e := etcdtest.Start(t)
	c := serve(t, e)
	const action = "refund.issue"
	const summary = "Refund 40.00 USD to Alice for ORD-88412"
	req := func(key string, n int) *intentv1.RegisterRequest {
		return &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, lamp(1)), Action: action, Identity: mustStruct(t, refund(n)), Summary: summary}
	}
	register := func(mut func(r *intentv1.RegisterRequest)) func(f *fx, n int, _ prep) (*intentv1.Intent, error) {
		return func(f *fx, n int, _ prep) (*intentv1.Intent, error) {
			r := req("", n)
			mut(r)
			resp, err := f.c.Register(f.ctx, r)
			return resp.GetIntent(), err
		}
	}
	// acquire registers through Acquire, whose own key is key(n).
	acquire := func(key func(n int) string, mut func(r *intentv1.RegisterRequest)) func(f *fx, n int, p prep) (*intentv1.Intent, error) {
		return func(f *fx, n int, p prep) (*intentv1.Intent, error) {
			r := req("", n)
			mut(r)
			resp, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key(n), SessionId: p.session, RequestId: fmt.Sprintf("acq-%d", n), Register: r})
			if err == nil && resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
				f.t.Errorf("Acquire registering: outcome %v, want EXECUTE", resp.GetOutcome())
			}
			return resp.GetIntent(), err
		}
	}
	// child completes the held parent with children, of which the last is
	// mut's, and answers with that child as Get reads it.
	child := func(mut func(r *intentv1.RegisterRequest)) func(f *fx, n int, p prep) (*intentv1.Intent, error) {
		return func(f *fx, n int, p prep) (*intentv1.Intent, error) {
			first := req("", 1000+n)
			r := req("", n)
			mut(r)
			_, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: parentKey(n), Token: p.token, Result: &intentv1.Result{}, Children: []*intentv1.RegisterRequest{first, r}})
			if err != nil {
				return nil, err
			}
			key := r.GetKey()
			if key == "" {
				key = derivedKey(f.t, r.GetAction(), r.GetIdentity().AsMap())
			}
			return f.get(key), nil
		}
	}
	derived := func(n int) string { return derivedKey(t, action, refund(n)) }
	noSetup := func(*fx, int) prep { return prep{} }
	withSession := func(f *fx, _ int) prep { return prep{session: f.session("w-admission")} }
	heldParent := func(f *fx, n int) prep { return held(f, parentKey(n)) }
	x := strings.Repeat

	for i, tc := range []struct {
		name  string
		setup func(f *fx, n int) prep
		call  func(f *fx, n int, p prep) (*intentv1.Intent, error)
		// Refused: the field named, and words the message must hold.
		field, words string
		// Accepted: what was stored (key(n), identity(n)).
		key      func(n int) string
		identity func(n int) map[string]any
		action   string
		summary  string
	}{
		// Register.
		{name: "Register: no key, no identity", setup: noSetup, field: "key", words: "intent: invalid key: value is required",
			call: register(func(r *intentv1.RegisterRequest) { r.Action, r.Identity = "", nil })},
		{name: "Register: identity without action", setup: noSetup, field: "action", words: "required with identity",
			call: register(func(r *intentv1.RegisterRequest) { r.Action = "" })},
		{name: "Register: key derived", setup: noSetup, call: register(func(*intentv1.RegisterRequest) {}),
			key: derived, identity: refund, action: action, summary: summary},
		{name: "Register: key given, the derivation", setup: noSetup, key: derived, identity: refund, action: action, summary: summary,
			call: func(f *fx, n int, p prep) (*intentv1.Intent, error) {
				return register(func(r *intentv1.RegisterRequest) { r.Key = derived(n) })(f, n, p)
			}},
		{name: "Register: key given, not the derivation", setup: noSetup, field: "key", words: "must equal the key derived from action and identity, ",
			call: register(func(r *intentv1.RegisterRequest) { r.Key = "refund-ORD-88412" })},
		{name: "Register: an identity number past 2^53", setup: noSetup, field: "identity.order_id", words: "2^53",
			call: register(func(r *intentv1.RegisterRequest) {
				r.Identity = mustStruct(t, map[string]any{"order_id": float64(1 << 53)})
			})},
		{name: "Register: identity past DeriveKey's size", setup: noSetup, field: "identity", words: "longer than the limit of 65536 bytes",
			call: register(func(r *intentv1.RegisterRequest) {
				r.Identity = mustStruct(t, map[string]any{"note": x("n", intent.MaxParamsBytes)})
			})},
		{name: "Register: empty identity", setup: noSetup, field: "identity", words: "non-empty object",
			call: register(func(r *intentv1.RegisterRequest) { r.Identity = &structpb.Struct{} })},
		{name: "Register: action's alphabet", setup: noSetup, field: "action", words: "must hold only ASCII letters",
			call: register(func(r *intentv1.RegisterRequest) { r.Action = "refund issue" })},
		{name: "Register: action past its length", setup: noSetup, field: "action",
			call: register(func(r *intentv1.RegisterRequest) { r.Action = x("a", intent.MaxActionLen+1) })},
		{name: "Register: action alone, key given", setup: noSetup, action: action,
			key: func(n int) string { return fmt.Sprintf("refund-plain-%d", n) },
			call: func(f *fx, n int, p prep) (*intentv1.Intent, error) {
				return register(func(r *intentv1.RegisterRequest) {
					r.Key, r.Identity, r.Summary = fmt.Sprintf("refund-plain-%d", n), nil, ""
				})(f, n, p)
			}},
		{name: "Register: summary of 200 characters", setup: noSetup, key: derived, identity: refund, action: action, summary: x("é", 200),
			call: register(func(r *intentv1.RegisterRequest) { r.Summary = x("é", 200) })},
		{name: "Register: summary of 201 characters", setup: noSetup, field: "summary",
			call: register(func(r *intentv1.RegisterRequest) { r.Summary = x("é", 201) })},
		{name: "Register: summary with a line break", setup: noSetup, field: "summary", words: "no control characters",
			call: register(func(r *intentv1.RegisterRequest) { r.Summary = "Refund\n40.00 USD" })},
		{name: "Register: summary with a bidi override, kept as text", setup: noSetup, key: derived, identity: refund, action: action, summary: "Refund \u202eDSU 00.04",
			call: register(func(r *intentv1.RegisterRequest) { r.Summary = "Refund \u202eDSU 00.04" })},

		// Acquire's register.
		{name: "Acquire: register's key derived, the request's key", setup: withSession, key: derived, identity: refund, action: action, summary: summary,
			call: acquire(derived, func(*intentv1.RegisterRequest) {})},
		{name: "Acquire: register's key derived, another request key", setup: withSession, field: "key", words: "must equal the key derived from register.action and register.identity, ",
			call: acquire(func(n int) string { return fmt.Sprintf("refund-%d", n) }, func(*intentv1.RegisterRequest) {})},
		{name: "Acquire: register's key given, not the derivation", setup: withSession, field: "register.key", words: "must equal the key derived",
			call: acquire(func(n int) string { return "refund-ORD-88412" }, func(r *intentv1.RegisterRequest) { r.Key = "refund-ORD-88412" })},
		{name: "Acquire: register's identity without action", setup: withSession, field: "register.action",
			call: acquire(derived, func(r *intentv1.RegisterRequest) { r.Action = "" })},
		{name: "Acquire: register without key or identity", setup: withSession, field: "register.key", words: "value is required",
			call: acquire(derived, func(r *intentv1.RegisterRequest) { r.Action, r.Identity = "", nil })},
		{name: "Acquire: register's summary with a tab", setup: withSession, field: "register.summary",
			call: acquire(derived, func(r *intentv1.RegisterRequest) { r.Summary = "a\tb" })},
		{name: "Acquire: register's identity number past 2^53", setup: withSession, field: "register.identity.n",
			call: acquire(derived, func(r *intentv1.RegisterRequest) { r.Identity = mustStruct(t, map[string]any{"n": -float64(1 << 60)}) })},

		// Complete's children.
		{name: "Complete: child's key derived", setup: heldParent, key: derived, identity: refund, action: action, summary: summary,
			call: child(func(*intentv1.RegisterRequest) {})},
		{name: "Complete: child's identity without action", setup: heldParent, field: "children[1].action",
			call: child(func(r *intentv1.RegisterRequest) { r.Action = "" })},
		{name: "Complete: child's key not the derivation", setup: heldParent, field: "children[1].key", words: "must equal the key derived",
			call: child(func(r *intentv1.RegisterRequest) { r.Key = "refund-ORD-88412" })},
		{name: "Complete: child without key or identity", setup: heldParent, field: "children[1].key", words: "value is required",
			call: child(func(r *intentv1.RegisterRequest) { r.Action, r.Identity = "", nil })},
		{name: "Complete: child's summary too long", setup: heldParent, field: "children[1].summary",
			call: child(func(r *intentv1.RegisterRequest) { r.Summary = x("s", 201) })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, c)
			p := tc.setup(f, i)
			rev := etcdRevision(t, e)
			got, err := tc.call(f, i, p)
			if tc.field != "" {
				checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", tc.field)
				if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.words) {
					t.Errorf("message %q, want it to say %q", msg, tc.words)
				}
				checkNothingWritten(t, e, rev)
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			want := described{key: tc.key(i), action: tc.action, summary: tc.summary}
			if tc.identity != nil {
				want.identity = tc.identity(i)
			}
			checkDescribed(t, "answer", got, want)
			checkDescribed(t, "Get", f.get(want.key), want)
		})
	}
}

// parentKey is the parent whose completion registers case n's children.
func parentKey(n int) string { return fmt.Sprintf("refund-parent-%d", n) }

// TestDerivedKeyRefusalGivesTheKey: a key that is not the derivation of
// its identity is refused with the derived key in the message, so that a
// caller that computed its own sees which one intentd expects.
func TestDerivedKeyRefusalGivesTheKey(t *testing.T) {
	f := newFx(t, newClient(t))
	want := derivedKey(t, "refund.issue", refund(1))
	_, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{Key: "refund-1", Params: mustStruct(t, lamp(1)), Action: "refund.issue", Identity: mustStruct(t, refund(1))})
	if msg := status.Convert(err).Message(); !strings.Contains(msg, want) {
		t.Errorf("message %q, want it to give the derived key %s", msg, want)
	}
}

// TestRegisteringAgainKeepsTheFirstDescription: action, identity and
// summary are not part of the fingerprint; registering the same key and
// params again, by Register or through Acquire, answers the intent as
// first registered, as it does for max_attempts.
func TestRegisteringAgainKeepsTheFirstDescription(t *testing.T) {
	f := newFx(t, newClient(t))
	first := &intentv1.RegisterRequest{Params: mustStruct(t, lamp(1)), Action: "refund.issue", Identity: mustStruct(t, refund(7)), Summary: "Refund 40.00 USD to Alice", MaxAttempts: 3}
	resp, err := f.c.Register(f.ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	want := described{key: resp.GetIntent().GetKey(), action: "refund.issue", summary: "Refund 40.00 USD to Alice", identity: refund(7)}
	checkDescribed(t, "first Register", resp.GetIntent(), want)

	again := proto.CloneOf(first)
	again.Summary, again.MaxAttempts = "Refund 4000.00 USD to Mallory", 9
	resp, err = f.c.Register(f.ctx, again)
	if err != nil || resp.GetCreated() {
		t.Fatalf("Register again: created %v, %v; want the existing intent", resp.GetCreated(), err)
	}
	checkDescribed(t, "Register again", resp.GetIntent(), want)

	// The same key given plainly, without action or identity.
	plain := &intentv1.RegisterRequest{Key: want.key, Params: mustStruct(t, lamp(1)), Summary: "something else"}
	if resp, err = f.c.Register(f.ctx, plain); err != nil {
		t.Fatal(err)
	}
	checkDescribed(t, "Register again by key alone", resp.GetIntent(), want)

	acq, err := f.c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: want.key, SessionId: f.session("w"), RequestId: "r", Register: again})
	if err != nil || acq.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
		t.Fatalf("Acquire registering again: %v, %v", acq.GetOutcome(), err)
	}
	checkDescribed(t, "Acquire registering again", acq.GetIntent(), want)
	if got := f.get(want.key); got.GetMaxAttempts() != 3 {
		t.Errorf("max_attempts %d, want the first registration's 3", got.GetMaxAttempts())
	}
}

// TestDescriptionInEveryAnswer: a described intent's action, identity and
// summary come back on every answer that carries the intent: Register, Get,
// List, Watch, Acquire (fresh and replayed from memory, each replay the
// same bytes), Complete.
func TestDescriptionInEveryAnswer(t *testing.T) {
	f := newFx(t, newClient(t))
	reg := &intentv1.RegisterRequest{Params: mustStruct(t, lamp(1)), Action: "refund.issue", Identity: mustStruct(t, refund(3)),
		Summary: "Refund 40.00 USD to Alice for ORD-88412", Labels: map[string]string{"run": "described-answers"}}
	resp, err := f.c.Register(f.ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	want := described{key: derivedKey(t, "refund.issue", refund(3)), action: "refund.issue", summary: reg.GetSummary(), identity: refund(3)}
	checkDescribed(t, "Register", resp.GetIntent(), want)
	checkDescribed(t, "Get", f.get(want.key), want)

	list, err := f.c.List(f.ctx, &intentv1.ListRequest{Label: "run=described-answers"})
	if err != nil || len(list.GetIntents()) != 1 {
		t.Fatalf("List: %v, %v", list, err)
	}
	checkDescribed(t, "List", list.GetIntents()[0], want)

	watch, err := f.c.Watch(f.ctx, &intentv1.WatchRequest{Key: want.key, StartRevision: resp.GetIntent().GetRevision()})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	checkDescribed(t, "Watch", ev.GetIntent(), want)

	sess := f.session("w")
	acq := f.acquire(want.key, sess, "r1")
	checkDescribed(t, "Acquire", acq.GetIntent(), want)
	if text := acq.GetStatement().GetText(); !strings.Contains(text, `intent `+want.key+` ("Refund 40.00 USD to Alice for ORD-88412") under token`) {
		t.Errorf("statement %q, want it to name the intent with its summary", text)
	}
	done := f.complete(want.key, acq.GetLease().GetToken(), &intentv1.Result{ExternalRefs: map[string]string{"refund_id": "RF-1"}})
	checkDescribed(t, "Complete", done.GetIntent(), want)

	var first []byte
	for i := range 3 {
		replay := f.acquire(want.key, sess, fmt.Sprintf("replay-%d", i))
		checkDescribed(t, "Acquire replay", replay.GetIntent(), want)
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(replay)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = b
		} else if string(b) != string(first) {
			t.Errorf("replay %d differs from the first replay", i)
		}
	}
}

// randomText is n bytes of random lowercase hex: text that compresses
// poorly, as a final record's worst case does.
func randomText(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}

// TestLargestDescribedCompletionIsTakenWhole: the largest record there is
// (the biggest params, labels, action, identity and summary, completed
// with the biggest payload and external refs, of text that does not
// compress), with the outbox at its limit of children that carry
// identities of their own, is one transaction etcd takes.
func TestLargestDescribedCompletionIsTakenWhole(t *testing.T) {
	f := newFx(t, newClient(t))
	x := strings.Repeat
	labels := map[string]string{}
	for i := range server.MaxLabels {
		labels[fmt.Sprintf("%02d", i)+x("n", server.MaxLabelKeyLen-2)] = randomText(t, server.MaxLabelValueLen)
	}
	action := x("a", intent.MaxActionLen)
	// The canonical {"action":…,"identity":{"i":"…"}} at DeriveKey's limit.
	identity := map[string]any{"i": randomText(t, intent.MaxParamsBytes-len(`{"action":"","identity":{"i":""}}`)-len(action))}
	params := map[string]any{"a": randomText(t, intent.MaxParamsBytes-len(`{"a":""}`))}
	resp, err := f.c.Register(f.ctx, &intentv1.RegisterRequest{
		Params: mustStruct(t, params), ParamsVersion: x("v", server.MaxParamsVersionLen), Labels: labels,
		Action: action, Identity: mustStruct(t, identity), Summary: x("€", 200),
	})
	if err != nil {
		t.Fatalf("Register with the largest description: %v", err)
	}
	key := resp.GetIntent().GetKey()
	_, token := f.lease(key, "w", intentv1.Outcome_OUTCOME_EXECUTE)

	refs := map[string]string{}
	for i := range server.MaxExternalRefs {
		refs[fmt.Sprintf("%03d", i)+x("r", server.MaxExternalRefLen-3)] = randomText(t, server.MaxExternalRefLen)
	}
	payload := make([]byte, server.MaxPayloadBytes)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	// 16 children (the most a Complete may carry) of about 16 KiB each,
	// almost half of it identity, to the outbox's limit as the server
	// estimates it (2 KiB, the canonical params and identity, action and
	// summary, 8 times the key).
	var children []*intentv1.RegisterRequest
	cost := 0
	for len(children) < 16 {
		c := &intentv1.RegisterRequest{Params: mustStruct(t, map[string]any{"p": randomText(t, 6400)}), Action: "refund.issue",
			Identity: mustStruct(t, map[string]any{"child": len(children), "i": randomText(t, 7000)}), Summary: x("s", 200)}
		cCost := 2<<10 + len(`{"p":""}`) + 6400 + len(`{"child":,"i":""}`) + len(fmt.Sprint(len(children))) + 7000 + len("refund.issue") + 200 + 8*64
		if cost+cCost > server.MaxOutboxBytes {
			break
		}
		cost += cCost
		children = append(children, c)
	}
	if server.MaxOutboxBytes-cost > 16<<10 {
		t.Fatalf("%d children cost %d bytes, want them to fill the outbox's %d", len(children), cost, server.MaxOutboxBytes)
	}
	done, err := f.c.Complete(f.ctx, &intentv1.CompleteRequest{Key: key, Token: token,
		Result: &intentv1.Result{Payload: payload, ExternalRefs: refs}, Children: children})
	if err != nil {
		t.Fatalf("Complete of the largest described record with %d children: %v", len(children), err)
	}
	want := described{key: key, action: action, summary: x("€", 200), identity: identity}
	checkDescribed(t, "Complete", done.GetIntent(), want)
	checkDescribed(t, "Get", f.get(key), want)
}
