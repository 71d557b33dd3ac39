package main

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/testlog"
)

func decode[M proto.Message](t *testing.T, out string, m M) M {
	t.Helper()
	if err := protojson.Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("output is not a %T: %v\n%s", m, err, out)
	}
	return m
}

func keys(intents []*intentv1.Intent) []string {
	var out []string
	for _, in := range intents {
		out = append(out, in.GetKey())
	}
	return out
}

func TestGet(t *testing.T) {
	f := newFixture(t)
	key := f.needsReview("lamp")
	in := decode(t, mustJSON(t, "get", key), &intentv1.GetResponse{}).GetIntent()
	if in.GetKey() != key || in.GetState() != intentv1.State_STATE_NEEDS_REVIEW {
		t.Errorf("get: key %q state %v, want %q NEEDS_REVIEW", in.GetKey(), in.GetState(), key)
	}
	var kinds []string
	for _, h := range in.GetHistory() {
		kinds = append(kinds, h.GetKind().String())
	}
	if len(kinds) < 3 {
		t.Errorf("get: history %v, want registration, lease and escalation", kinds)
	}
	if got := in.GetParams().GetFields()["item"].GetStringValue(); got != "lamp" {
		t.Errorf("get: params.item %q, want lamp", got)
	}
}

// A refusal prints intentd's code and reason on stderr and exits 1.
func TestRefusals(t *testing.T) {
	f := newFixture(t)
	pending := f.pending("pending")
	held, _ := f.acquired("held")
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"get missing", []string{"get", f.key("missing")}, []string{"code: NOT_FOUND", "reason: INTENT_NOT_FOUND"}},
		{"get invalid key", []string{"get", "no spaces allowed"}, []string{"code: INVALID_ARGUMENT", "reason: INVALID_FIELD", "field: key"}},
		{"resolve pending", []string{"resolve", pending, "--decision", "completed", "--actor", "alice", "--reason", "r"}, []string{"code: FAILED_PRECONDITION", "reason: INVALID_TRANSITION"}},
		{"escalate under a live lease", []string{"escalate", held, "--reason", "r"}, []string{"code: FAILED_PRECONDITION", "reason: LEASE_HELD"}},
		{"list bad page size", []string{"list", "--page-size", "1000"}, []string{"code: INVALID_ARGUMENT", "field: page_size"}},
		{"derive-key bad action", []string{"derive-key", "no spaces", "a=b"}, []string{"code: INVALID_ARGUMENT", "field: action"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := intentctl(t, tt.args...)
			if r.code != exitFailure {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitFailure, r.stdout, r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			if r.stdout != "" {
				t.Errorf("stdout = %q, want nothing", r.stdout)
			}
			// The field used to be printed twice: from BadRequest and again
			// from the ErrorInfo metadata.
			if n := strings.Count(r.stderr, "field: "); n > 1 {
				t.Errorf("stderr names the field %d times, want once:\n%s", n, r.stderr)
			}
		})
	}
}

// intentctl toward an address nobody listens on used to retry until the
// whole --timeout (10s) ran out; it must fail at once, saying why.
func TestRefusedConnectionFailsAtOnce(t *testing.T) {
	closed := freeport.Addr(t)
	start := time.Now()
	r := invocation{args: []string{"get", "k", "--timeout", "10s"}, env: map[string]string{envAddr: closed}}.run(t)
	took := time.Since(start)
	if r.code != exitUnreachable {
		t.Errorf("exit %d, want %d\nstderr:\n%s", r.code, exitUnreachable, r.stderr)
	}
	if took > 3*time.Second {
		t.Errorf("took %v against a closed port, want under 3s (the --timeout is 10s)", took)
	}
	for _, want := range []string{"cannot reach intentd at " + closed, "connection refused", "; is intentd running there"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

// A refusal that carries a statement prints its text.
func TestRefusalPrintsStatement(t *testing.T) {
	f := newFixture(t)
	key := f.completed("done")
	r := intentctl(t, "resolve", key, "--decision", "failed", "--failure-code", "x", "--actor", "alice", "--reason", "r")
	if r.code != exitFailure {
		t.Fatalf("exit %d, want 1\nstderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"code: FAILED_PRECONDITION", "reason: INVALID_TRANSITION", "statement: refused:", "state: COMPLETED"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

func TestList(t *testing.T) {
	f := newFixture(t)
	var all []string
	for i := range 7 {
		all = append(all, f.pending(string(rune('a'+i))))
	}
	done := f.completed("z")
	tests := []struct {
		name     string
		args     []string
		want     []string
		wantNext bool
	}{
		{"one page", []string{"--page-size", "3"}, all[:3], true},
		{"all pages", []string{"--page-size", "3", "--all"}, append(slices.Clone(all), done), false},
		{"all in one page", []string{"--all"}, append(slices.Clone(all), done), false},
		{"all pages of one state", []string{"--state", "pending", "--page-size", "2", "--all"}, all, false},
		{"by state", []string{"--state", "completed"}, []string{done}, false},
		{"by two states", []string{"--state", "pending,COMPLETED", "--page-size", "2", "--all"}, append(slices.Clone(all), done), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"list", "--label", f.label()}, tt.args...)
			resp := decode(t, mustJSON(t, args...), &intentv1.ListResponse{})
			if got := keys(resp.GetIntents()); !slices.Equal(got, tt.want) {
				t.Errorf("keys = %q, want %q", got, tt.want)
			}
			if got := resp.GetNextPageToken() != ""; got != tt.wantNext {
				t.Errorf("next_page_token %q, want one: %v", resp.GetNextPageToken(), tt.wantNext)
			}
			if resp.GetRevision() <= 0 {
				t.Errorf("revision = %d, want the listing's etcd revision", resp.GetRevision())
			}
		})
	}

	// A page token continues where the first page stopped.
	first := decode(t, mustJSON(t, "list", "--label", f.label(), "--page-size", "3"), &intentv1.ListResponse{})
	second := decode(t, mustJSON(t, "list", "--label", f.label(), "--page-size", "3", "--page-token", first.GetNextPageToken()), &intentv1.ListResponse{})
	if got := keys(second.GetIntents()); !slices.Equal(got, all[3:6]) {
		t.Errorf("second page = %q, want %q", got, all[3:6])
	}
}

func TestReviewQueue(t *testing.T) {
	f := newFixture(t)
	f.pending("pending")
	unknown := f.unknown("unknown")
	f.completed("completed")
	review := f.needsReview("review")
	unknown2 := f.unknown("unknown-2")
	for _, args := range [][]string{
		{"review-queue", "--label", f.label()},
		{"review-queue", "--label", f.label(), "--page-size", "1", "--all"},
		{"list", "--label", f.label(), "--state", "unknown", "--state", "needs_review"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			resp := decode(t, mustJSON(t, args...), &intentv1.ListResponse{})
			if got, want := keys(resp.GetIntents()), []string{unknown, review, unknown2}; !slices.Equal(got, want) {
				t.Errorf("queue = %q, want %q (oldest first)", got, want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name      string
		args      []string
		wantState intentv1.State
		check     func(t *testing.T, in *intentv1.Intent)
	}{
		{
			name:      "completed with refs",
			args:      []string{"--decision", "completed", "--ref", "refund_id=re_123", "--ref", "note=a=b", "--payload", "ok"},
			wantState: intentv1.State_STATE_COMPLETED,
			check: func(t *testing.T, in *intentv1.Intent) {
				refs := in.GetResult().GetExternalRefs()
				if refs["refund_id"] != "re_123" || refs["note"] != "a=b" || string(in.GetResult().GetPayload()) != "ok" {
					t.Errorf("result = %v, want refund_id=re_123, note=a=b, payload ok", in.GetResult())
				}
			},
		},
		{name: "pending", args: []string{"--decision", "pending"}, wantState: intentv1.State_STATE_PENDING},
		{
			name:      "failed",
			args:      []string{"--decision", "FAILED", "--failure-code", "card_declined"},
			wantState: intentv1.State_STATE_FAILED,
			check: func(t *testing.T, in *intentv1.Intent) {
				if in.GetFailure().GetCode() != "card_declined" {
					t.Errorf("failure = %v, want code card_declined", in.GetFailure())
				}
			},
		},
		{name: "cancelled", args: []string{"--decision", "DECISION_CANCELLED"}, wantState: intentv1.State_STATE_CANCELLED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := f.unknown(strings.ReplaceAll(tt.name, " ", "-"))
			reason := "checked the provider for " + tt.name
			args := append([]string{"resolve", key, "--actor", "alice@ops", "--reason", reason}, tt.args...)
			resp := decode(t, mustJSON(t, args...), &intentv1.ResolveResponse{})
			if resp.GetIntent().GetState() != tt.wantState || resp.GetActionTaken() != "recorded" {
				t.Errorf("resolve: state %v, action_taken %q; want %v, recorded", resp.GetIntent().GetState(), resp.GetActionTaken(), tt.wantState)
			}
			in := decode(t, mustJSON(t, "get", key), &intentv1.GetResponse{}).GetIntent()
			if in.GetState() != tt.wantState {
				t.Errorf("get after resolve: state %v, want %v", in.GetState(), tt.wantState)
			}
			last := in.GetHistory()[len(in.GetHistory())-1]
			if last.GetResolvedState() != tt.wantState || last.GetReason() != reason || last.GetPrincipal() != "alice@ops" {
				t.Errorf("last history entry = %v, want the decision %v with reason %q by alice@ops", last, tt.wantState, reason)
			}
			if tt.check != nil {
				tt.check(t, in)
			}
		})
	}

	// The same request id never decides twice.
	key := f.needsReview("once")
	args := []string{"resolve", key, "--decision", "completed", "--actor", "bob", "--reason", "found it", "--request-id", "review-1"}
	first := decode(t, mustJSON(t, args...), &intentv1.ResolveResponse{})
	again := decode(t, mustJSON(t, args...), &intentv1.ResolveResponse{})
	if first.GetActionTaken() != "recorded" || again.GetActionTaken() != "none" {
		t.Errorf("action_taken %q then %q, want recorded then none", first.GetActionTaken(), again.GetActionTaken())
	}
}

func TestCancelAndEscalate(t *testing.T) {
	f := newFixture(t)
	pending := f.pending("cancel-me")
	resp := decode(t, mustJSON(t, "cancel", pending, "--reason", "customer withdrew", "--actor", "alice"), &intentv1.CancelResponse{})
	if resp.GetIntent().GetState() != intentv1.State_STATE_CANCELLED {
		t.Errorf("cancel: state %v, want CANCELLED", resp.GetIntent().GetState())
	}

	held, _ := f.acquired("escalate-me")
	esc := decode(t, mustJSON(t, "escalate", held, "--reason", "stuck for an hour", "--force"), &intentv1.EscalateResponse{})
	if esc.GetIntent().GetState() != intentv1.State_STATE_NEEDS_REVIEW {
		t.Errorf("escalate --force: state %v, want NEEDS_REVIEW", esc.GetIntent().GetState())
	}
}

func TestDeriveKey(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		identity map[string]any
	}{
		{"strings", []string{"customer=c-17", "cart=cart-9"}, map[string]any{"customer": "c-17", "cart": "cart-9"}},
		{"number", []string{"customer=c-17", "quantity=2"}, map[string]any{"customer": "c-17", "quantity": 2.0}},
		{"quoted number stays a string", []string{`order="1042"`}, map[string]any{"order": "1042"}},
		{"not JSON is a string", []string{"order=007", "note=a b"}, map[string]any{"order": "007", "note": "a b"}},
		{"JSON values", []string{`tags=["a","b"]`, `addr={"zip":"1010","n":3}`, "gift=true", "none=null"},
			map[string]any{"tags": []any{"a", "b"}, "addr": map[string]any{"zip": "1010", "n": 3.0}, "gift": true, "none": nil}},
		{"empty value", []string{"customer="}, map[string]any{"customer": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := decode(t, mustJSON(t, append([]string{"derive-key", "purchase"}, tt.args...)...), &intentv1.DeriveKeyResponse{})
			key, canonical, err := intent.DeriveKey("purchase", tt.identity)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetKey() != key || resp.GetCanonical() != string(canonical) {
				t.Errorf("derive-key = %s %s, want %s %s", resp.GetKey(), resp.GetCanonical(), key, canonical)
			}
		})
	}

	// --params prints the fingerprint Register would store, with or
	// without a key to derive.
	const terms = `{"item": "desk lamp", "quantity": 2.0, "merchant": "möbel-haus", "max_amount": "89.00", "currency": "EUR"}`
	canonical, err := intent.CanonicalJSON([]byte(terms))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"derive-key", "--params", terms},
		{"derive-key", "purchase", "cart=c-1", "--params", terms},
	} {
		resp := decode(t, mustJSON(t, args...), &intentv1.DeriveKeyResponse{})
		if resp.GetFingerprint() != intent.Fingerprint(canonical) || resp.GetCanonicalParams() != string(canonical) {
			t.Errorf("%q: fingerprint %s of %s, want %s of %s", args, resp.GetFingerprint(), resp.GetCanonicalParams(), intent.Fingerprint(canonical), canonical)
		}
		if wantKey := len(args) > 3; (resp.GetKey() != "") != wantKey {
			t.Errorf("%q: key %q, want one: %v", args, resp.GetKey(), wantKey)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, nil, "unknown command"},
		{"mistyped command", []string{"regster"}, nil, `intentctl: unknown command "regster" for "intentctl"; did you mean register?` + "\n"},
		{"unknown flag", []string{"get", "k", "--bogus"}, nil, "unknown flag"},
		{"get without key", []string{"get"}, nil, "accepts 1 arg"},
		{"resolve without decision", []string{"resolve", "k", "--actor", "a", "--reason", "r"}, nil, `"decision" not set`},
		{"resolve bad decision", []string{"resolve", "k", "--decision", "maybe", "--actor", "a", "--reason", "r"}, nil, "--decision"},
		{"resolve ref with pending", []string{"resolve", "k", "--decision", "pending", "--ref", "a=b", "--actor", "a", "--reason", "r"}, nil, "--decision completed only"},
		{"resolve failed without code", []string{"resolve", "k", "--decision", "failed", "--actor", "a", "--reason", "r"}, nil, "--failure-code"},
		{"resolve code with cancelled", []string{"resolve", "k", "--decision", "cancelled", "--failure-code", "x", "--actor", "a", "--reason", "r"}, nil, "--failure-code"},
		{"resolve malformed ref", []string{"resolve", "k", "--decision", "completed", "--ref", "novalue", "--actor", "a", "--reason", "r"}, nil, "name=value"},
		{"cancel without reason", []string{"cancel", "k"}, nil, `"reason" not set`},
		{"list bad state", []string{"list", "--state", "sleeping"}, nil, "--state"},
		{"list bad label", []string{"list", "--label", "novalue"}, nil, "--label"},
		{"watch two keys", []string{"watch", "a", "b"}, nil, "accepts at most 1 arg"},
		{"derive-key without fields", []string{"derive-key", "purchase"}, nil, "requires at least 2 arg"},
		{"derive-key field twice", []string{"derive-key", "purchase", "a=1", "a=2"}, nil, "given twice"},
		{"derive-key rounded number", []string{"derive-key", "purchase", "id=12345678901234567890"}, nil, "quote it"},
		{"derive-key 2^53", []string{"derive-key", "purchase", "id=9007199254740992"}, nil, "quote it"},
		{"derive-key nested 2^53", []string{"derive-key", "purchase", `cart={"items":[1,9007199254740993]}`}, nil, "identity field cart.items[1]"},
		{"derive-key inexact decimal", []string{"derive-key", "purchase", "amount=0.10000000000000000001"}, nil, "quote it"},
		{"derive-key params not an object", []string{"derive-key", "--params", "[1]"}, nil, "--params: want a JSON object"},
		{"derive-key params 2^53", []string{"derive-key", "--params", `{"order_id": 9007199254740993}`}, nil, "--params.order_id"},
		{"derive-key action alone", []string{"derive-key", "purchase", "--params", "{}"}, nil, "requires at least 2 arg"},
		{"zero timeout", []string{"get", "k", "--timeout", "0s"}, nil, "--timeout"},
		{"bad timeout says what a duration is", []string{"get", "k", "--timeout", "abc"}, nil, `--timeout "abc": not valid, want a duration such as 500ms`},
		{"bad page size says what it wants", []string{"list", "--page-size", "x"}, nil, `--page-size "x": not valid, want a whole number`},
		{"cert without key", []string{"get", "k", "--cert", "c.pem"}, nil, "--cert and --key"},
		{"token in plaintext off loopback", []string{"get", "k", "--addr", "intentd.example:7650", "--token", "itd_x"}, nil, "plain text"},
		{"token from env in plaintext off loopback", []string{"get", "k"}, map[string]string{envAddr: "10.1.2.3:7650", envToken: "itd_x"}, "plain text"},
		{"token new bad role", []string{"token", "new", "--name", "n", "--tenant", "t", "--role", "spender"}, nil, "--role"},
		{"token new bad tenant", []string{"token", "new", "--name", "n", "--tenant", "Acme", "--role", "reader"}, nil, "--tenant"},
		{"token new without role", []string{"token", "new", "--name", "n", "--tenant", "t"}, nil, `"role" not set`},
		{"dev-certs without out", []string{"dev-certs"}, nil, `"out" not set`},
		{"dev-certs reserved client", []string{"dev-certs", "--out", "DIR", "--client", "expired"}, nil, "reserved"},
		{"dev-certs test certs without client", []string{"dev-certs", "--out", "DIR", "--test-certs"}, nil, "--test-certs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := slices.Clone(tt.args)
			for i, a := range args {
				if a == "DIR" {
					args[i] = t.TempDir()
				}
			}
			r := invocation{args: args, env: tt.env}.run(t)
			if r.code != exitUsage {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitUsage, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stderr, tt.want) || !strings.Contains(r.stderr, "--help") {
				t.Errorf("stderr = %q, want it to contain %q and point to --help", r.stderr, tt.want)
			}
		})
	}
}

// watching runs intentctl watch with args in the background; stop
// interrupts it and checks that it ended cleanly.
type watching struct {
	out    *testlog.Buffer
	errs   *testlog.Buffer // its stderr
	cancel context.CancelFunc
	exited chan int
}

func startWatching(t *testing.T, args ...string) *watching {
	t.Helper()
	return startWatchingAs(t, "json", args...)
}

// startWatchingAs runs watch -o format.
func startWatchingAs(t *testing.T, format string, args ...string) *watching {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watching{out: &testlog.Buffer{}, errs: &testlog.Buffer{}, cancel: cancel, exited: make(chan int, 1)}
	go func() { // exits when ctx is cancelled
		w.exited <- run(ctx, append([]string{"watch", "-o", format}, args...), strings.NewReader(""), w.out, w.errs, func(k string) (string, bool) {
			if k == envAddr {
				return addr, true
			}
			return "", false
		})
	}()
	t.Cleanup(cancel)
	return w
}

// lines are the whole lines printed so far, decoded.
func (w *watching) lines(t *testing.T) []*intentv1.WatchResponse {
	t.Helper()
	var events []*intentv1.WatchResponse
	for line := range strings.Lines(w.out.String()) {
		if !strings.HasSuffix(line, "\n") {
			break // still being written
		}
		events = append(events, decode(t, line, &intentv1.WatchResponse{}))
	}
	return events
}

// until waits up to 30s for the printed lines to satisfy done.
func (w *watching) until(t *testing.T, done func([]*intentv1.WatchResponse) bool) []*intentv1.WatchResponse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		events := w.lines(t)
		if done(events) || time.Now().After(deadline) {
			return events
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *watching) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	select {
	case code := <-w.exited:
		if code != exitOK {
			t.Errorf("watch exited %d after interrupt, want 0; stderr:\n%s", code, w.errs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not stop after interrupt")
	}
}

func cancelled(events []*intentv1.WatchResponse) bool {
	return len(events) > 0 && events[len(events)-1].GetIntent().GetState() == intentv1.State_STATE_CANCELLED
}

func TestWatch(t *testing.T) {
	f := newFixture(t)
	key := f.pending("watched")
	before := decode(t, mustJSON(t, "list", "--label", f.label()), &intentv1.ListResponse{})

	w := startWatching(t, key, "--from", "1")
	// A change after the watch started shows up too.
	mustRun(t, "cancel", key, "--reason", "no longer wanted")
	events := w.until(t, cancelled)
	w.stop(t)
	if len(events) < 3 {
		t.Fatalf("watch printed %d lines, want the created notice, registration and cancellation:\n%s", len(events), w.out.String())
	}
	if created := events[0]; created.GetType() != intentv1.WatchResponse_TYPE_CREATED || created.GetRevision() != 0 {
		t.Errorf("first line = %v, want the created notice at revision 0 (--from 1)", created)
	}
	events = events[1:]
	if first := events[0]; first.GetIntent().GetKey() != key || first.GetIntent().GetState() != intentv1.State_STATE_PENDING || first.GetRevision() > before.GetRevision() {
		t.Errorf("first event = %v, want the registration (revision at most %d)", first, before.GetRevision())
	}
	if last := events[len(events)-1]; last.GetIntent().GetState() != intentv1.State_STATE_CANCELLED || last.GetType() != intentv1.WatchResponse_TYPE_PUT {
		t.Errorf("last event = %v, want the cancellation", last)
	}
}

// intentctl watch from now printed nothing until a change, so a script
// could not tell when to act without missing one. Its first line now says
// the watch is established, before any change, and the change made once
// that line is out follows.
func TestWatchFromNowSaysItHasStarted(t *testing.T) {
	f := newFixture(t)
	key := f.pending("watched-now")
	w := startWatching(t, key)
	events := w.until(t, func(evs []*intentv1.WatchResponse) bool { return len(evs) > 0 })
	if len(events) != 1 || events[0].GetType() != intentv1.WatchResponse_TYPE_CREATED || events[0].GetRevision() == 0 {
		t.Fatalf("before any change watch printed %d lines %v, want the created notice alone, with a revision", len(events), events)
	}
	mustRun(t, "cancel", key, "--reason", "no longer wanted")
	events = w.until(t, cancelled)
	w.stop(t)
	if len(events) != 2 || !cancelled(events) || events[1].GetRevision() <= events[0].GetRevision() {
		t.Fatalf("watch printed %v, want the created notice, then the cancellation after its revision", events)
	}
}

func TestTokenNew(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		wantTenants []string
		wantRoles   []access.Role
	}{
		{"one each", []string{"--tenant", "acme", "--role", "worker"}, []string{"acme"}, []access.Role{access.RoleWorker}},
		{"repeated", []string{"--tenant", "acme", "--tenant", "globex", "--role", "reviewer", "--role", "reader"}, []string{"acme", "globex"}, []access.Role{access.RoleReviewer, access.RoleReader}},
		{"comma separated, deduplicated", []string{"--tenant", "acme,acme", "--role", "Admin,admin"}, []string{"acme"}, []access.Role{access.RoleAdmin}},
		{"every tenant", []string{"--tenant", "*", "--role", "reader"}, []string{"*"}, []access.Role{access.RoleReader}},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := intentctl(t, append([]string{"token", "new", "--name", "ci-" + strings.ReplaceAll(tt.name, " ", "-")}, tt.args...)...)
			if r.code != exitOK {
				t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
			}
			lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("stdout has %d lines, want the token and the entry:\n%s", len(lines), r.stdout)
			}
			token, entryLine := lines[0], lines[1]
			raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(token, "itd_"))
			if !strings.HasPrefix(token, "itd_") || err != nil || len(raw) != 32 {
				t.Errorf("token %q: want itd_ and 32 bytes in base64url (decoded %d bytes, %v)", token, len(raw), err)
			}
			if seen[token] {
				t.Errorf("token %q issued twice", token)
			}
			seen[token] = true
			if strings.Contains(entryLine, token) || strings.Contains(entryLine, strings.TrimPrefix(token, "itd_")) {
				t.Errorf("entry %s contains the token", entryLine)
			}

			var entry map[string]any
			if err := json.Unmarshal([]byte(entryLine), &entry); err != nil {
				t.Fatalf("entry %s: %v", entryLine, err)
			}
			h := invocation{args: []string{"token", "hash"}, stdin: token + "\n"}.run(t)
			if h.code != exitOK {
				t.Fatalf("token hash: exit %d, stderr:\n%s", h.code, h.stderr)
			}
			gotHash := strings.TrimSpace(h.stdout)
			if hashes, _ := entry["token_sha256"].([]any); len(hashes) != 1 || hashes[0] != gotHash {
				t.Errorf("entry token_sha256 = %v, want [%s] (token hash of the printed token)", entry["token_sha256"], gotHash)
			}

			// intentd's own parser accepts the entry and finds the
			// principal by the token.
			dir, err := access.Parse([]byte(`{"principals": [` + entryLine + `]}`))
			if err != nil {
				t.Fatalf("access.Parse: %v", err)
			}
			p, ok := dir.ByToken(token)
			if !ok || !slices.Equal(p.Tenants, tt.wantTenants) || !slices.Equal(p.Roles, tt.wantRoles) {
				t.Errorf("principal by token = %+v, %v; want tenants %v roles %v", p, ok, tt.wantTenants, tt.wantRoles)
			}
		})
	}
}

func TestTokenHash(t *testing.T) {
	tests := []struct {
		stdin string
		want  string // "" means exit 1
	}{
		{"itd_abc\n", access.HashToken("itd_abc")},
		{"  itd_abc \r\n", access.HashToken("itd_abc")},
		{"itd_abc", access.HashToken("itd_abc")},
		{"", ""},
		{"\n", ""},
		{"two tokens\n", ""},
		{strings.Repeat("x", maxTokenLen+1), ""},
	}
	for _, tt := range tests {
		r := invocation{args: []string{"token", "hash"}, stdin: tt.stdin}.run(t)
		switch {
		case tt.want == "" && r.code != exitFailure:
			t.Errorf("token hash < %.20q: exit %d, stdout %q; want exit 1", tt.stdin, r.code, r.stdout)
		case tt.want != "" && (r.code != exitOK || r.stdout != tt.want+"\n"):
			t.Errorf("token hash < %q: exit %d, stdout %q; want %s", tt.stdin, r.code, r.stdout, tt.want)
		}
	}
}

func TestDevCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	out := mustRun(t, "dev-certs", "--out", dir, "--client", "ops-1", "--client", "ci", "--host", "intentd.internal", "--test-certs")
	files := map[string]os.FileMode{
		"ca.pem": 0o644, "ca-key.pem": 0o600,
		"server.pem": 0o644, "server-key.pem": 0o600,
		"client-ops-1.pem": 0o644, "client-ops-1-key.pem": 0o600,
		"client-ci.pem": 0o644, "client-ci-key.pem": 0o600,
		"client-expired.pem": 0o644, "client-expired-key.pem": 0o600,
		"client-untrusted.pem": 0o644, "client-untrusted-key.pem": 0o600,
	}
	for name, mode := range files {
		path := filepath.Join(dir, name)
		st, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode %v, want %v", name, st.Mode().Perm(), mode)
		}
		if !strings.Contains(out, path) {
			t.Errorf("output does not name %s:\n%s", path, out)
		}
	}
	for _, want := range []string{"--tls-cert", "--tls-client-ca", "--tokens-file", "intentd://principal/ops-1", "intentctl --cacert"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// The tokens.json it suggests is one intentd accepts, and maps each
	// client certificate's identity to its principal.
	start := strings.Index(out, `{"principals": [`)
	end := strings.Index(out, "\n]}\n")
	if start < 0 || end < start {
		t.Fatalf("output lacks a tokens.json:\n%s", out)
	}
	directory, err := access.Parse([]byte(out[start : end+3]))
	if err != nil {
		t.Fatalf("suggested tokens.json: %v\n%s", err, out[start:end+3])
	}
	for _, name := range []string{"ops-1", "ci"} {
		cert := readCert(t, filepath.Join(dir, "client-"+name+".pem"))
		if p, ok := directory.ByCert(cert); !ok || p.Name != name {
			t.Errorf("principal of client-%s.pem = %+v, %v; want %s", name, p, ok, name)
		}
	}

	// Running again would replace the CA: refused unless --force.
	if r := intentctl(t, "dev-certs", "--out", dir); r.code != exitUsage || !strings.Contains(r.stderr, "--force") {
		t.Errorf("second run: exit %d, stderr %q; want exit 2 naming --force", r.code, r.stderr)
	}
	mustRun(t, "dev-certs", "--out", dir, "--force")
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// A resolve run again after its first run timed out — the decision was
// recorded, the reply lost — got a fresh request id and used to fail
// INVALID_TRANSITION, exit 1. It must say the decision is already made,
// by whom and when, and exit 0; a different decision, or one by someone
// else, is still refused and says who decided.
func TestResolveRetriedAfterTimeoutSaysAlreadyDecided(t *testing.T) {
	f := newFixture(t)
	key := f.needsReview("retried")
	args := []string{"resolve", key, "--decision", "completed", "--actor", "alice@ops", "--reason", "found it", "--ref", "order=SO-9"}
	mustRun(t, args...)

	again := intentctl(t, args...)
	if again.code != exitOK {
		t.Fatalf("rerun: exit %d, want 0\nstderr:\n%s", again.code, again.stderr)
	}
	if !strings.HasPrefix(again.stdout, "already decided (by you, at ") || !strings.Contains(again.stdout, key+" COMPLETED") {
		t.Errorf("rerun: stdout %q, want already decided (by you, at …) … %s COMPLETED", again.stdout, key)
	}
	resp := decode(t, mustJSON(t, args...), &intentv1.ResolveResponse{})
	if resp.GetActionTaken() != "none" || resp.GetIntent().GetState() != intentv1.State_STATE_COMPLETED {
		t.Errorf("rerun -o json: action_taken %q state %v, want none COMPLETED", resp.GetActionTaken(), resp.GetIntent().GetState())
	}

	// The same request id replays on intentd's side; it reads the same.
	withID := append(slices.Clone(args), "--request-id", key+"-review")
	other := f.needsReview("replayed")
	withID[1] = other
	mustRun(t, withID...)
	if out := mustRun(t, withID...); !strings.HasPrefix(out, "already decided (by you, at ") {
		t.Errorf("replay by request id: stdout %q, want already decided (by you, at …)", out)
	}

	for _, tt := range []struct {
		name string
		args []string
	}{
		{"another decision", []string{"resolve", key, "--decision", "cancelled", "--actor", "alice@ops", "--reason", "r"}},
		{"another reviewer", []string{"resolve", key, "--decision", "completed", "--actor", "bob@ops", "--reason", "r"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := intentctl(t, tt.args...)
			if r.code != exitFailure {
				t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			if want := "was decided COMPLETED by alice@ops at "; !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "reason: INVALID_TRANSITION") {
				t.Errorf("stderr lacks %q and the refusal:\n%s", want, r.stderr)
			}
		})
	}
}

// watch prints a line per change for people, as every other command does;
// it used to print protojson only.
func TestWatchPrintsOneLinePerChange(t *testing.T) {
	f := newFixture(t)
	key := f.pending("watched-text")
	w := startWatchingAs(t, "text", key)
	created := regexp.MustCompile(`^rev \d+  created\n`)
	deadline := time.Now().Add(10 * time.Second)
	for !created.MatchString(w.out.String()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	mustRun(t, "cancel", key, "--reason", "no longer wanted")
	change := regexp.MustCompile(`(?m)^rev \d+  put  ` + regexp.QuoteMeta(key) + `  CANCELLED$`)
	for !change.MatchString(w.out.String()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	w.stop(t)
	if out := w.out.String(); !created.MatchString(out) || !change.MatchString(out) {
		t.Errorf("watch printed %q, want a created line, then put %s CANCELLED", out, key)
	}
}

// Names and reasons come from workers and reviewers (often programs) and
// reach an operator's terminal: printed raw, an escape sequence in them
// could clear the screen or rewrite what is shown, and a newline would
// break the table. Text output escapes every control character.
func TestTextOutputEscapesControlCharacters(t *testing.T) {
	f := newFixture(t)
	key, _ := f.acquired("escapes")
	mustRun(t, "escalate", key, "--actor", "mallory\x1b[2J", "--reason", "line one\nline two", "--force")
	for _, args := range [][]string{{"get", key}, {"history", key}, {"history", key, "-o", "wide"}} {
		out := mustRun(t, args...)
		if strings.ContainsAny(out, "\x1b\r") {
			t.Errorf("%s printed a raw control character:\n%q", strings.Join(args, " "), out)
		}
		if !strings.Contains(out, `mallory\x1b[2J`) {
			t.Errorf("%s lacks the escaped actor mallory\\x1b[2J:\n%s", strings.Join(args, " "), out)
		}
	}
}
