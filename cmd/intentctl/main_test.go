package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// addr is the intentd every test talks to unless it starts its own: a real
// one, with an embedded etcd and no authentication, started by TestMain.
var addr string

func TestMain(m *testing.M) { intentdtest.Main(m, &addr, nil) }

// result is what one intentctl run printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// invocation is one run of intentctl, in-process.
type invocation struct {
	args  []string
	stdin string
	env   map[string]string // nil: INTENTD_ADDR is the test intentd
	ctx   context.Context
}

func (in invocation) run(t *testing.T) result {
	t.Helper()
	env := in.env
	if env == nil {
		env = map[string]string{envAddr: addr}
	}
	ctx := in.ctx
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
	}
	var stdout, stderr bytes.Buffer
	code := run(ctx, in.args, strings.NewReader(in.stdin), &stdout, &stderr, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// intentctl runs intentctl with args against the test intentd.
func intentctl(t *testing.T, args ...string) result {
	t.Helper()
	return invocation{args: args}.run(t)
}

// mustRun runs intentctl and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := intentctl(t, args...)
	if r.code != exitOK {
		t.Fatalf("intentctl %s: exit %d, want 0\nstderr:\n%s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// mustJSON runs intentctl -o json and fails the test unless it exits 0.
func mustJSON(t *testing.T, args ...string) string {
	t.Helper()
	return mustRun(t, append(args, "-o", "json")...)
}

// fixture sets up intents through the Go client, as workers and approvers
// would, for intentctl to find.
type fixture struct {
	t    *testing.T
	c    *client.Client
	sess *client.Session
	// run makes keys and labels unique to one test, so tests share an
	// intentd without seeing each other's intents.
	run string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := client.New(conn)
	sess, err := c.OpenSession(ctxFor(t), "fixture-worker", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	name := strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(t.Name()))
	return &fixture{t: t, c: c, sess: sess, run: fmt.Sprintf("%s-%d", name, time.Now().UnixNano())}
}

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// key returns a key unique to this test.
func (f *fixture) key(name string) string { return f.run + "-" + name }

// label is the label every intent of this test carries: "run=<run>".
func (f *fixture) label() string { return "run=" + f.run }

// pending registers an intent.
func (f *fixture) pending(name string) string {
	f.t.Helper()
	key := f.key(name)
	params, err := structpb.NewStruct(map[string]any{"item": name, "quantity": 1})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.c.Register(ctxFor(f.t), &intentv1.RegisterRequest{Key: key, Params: params, Labels: map[string]string{"run": f.run}}); err != nil {
		f.t.Fatalf("Register(%s): %v", key, err)
	}
	return key
}

// acquired registers an intent and acquires it; it returns the token.
func (f *fixture) acquired(name string) (string, uint64) {
	f.t.Helper()
	key := f.pending(name)
	a, err := f.c.Acquire(ctxFor(f.t), &intentv1.AcquireRequest{Key: key, SessionId: f.sess.ID(), RequestId: key + "-attempt"})
	if err != nil {
		f.t.Fatalf("Acquire(%s): %v", key, err)
	}
	return key, a.GetLease().GetToken()
}

// unknown leaves an intent UNKNOWN: its worker timed out.
func (f *fixture) unknown(name string) string {
	f.t.Helper()
	key, token := f.acquired(name)
	if _, err := f.c.MarkUnknown(ctxFor(f.t), &intentv1.MarkUnknownRequest{Key: key, Token: token, Reason: "provider timed out"}); err != nil {
		f.t.Fatalf("MarkUnknown(%s): %v", key, err)
	}
	return key
}

// needsReview leaves an intent NEEDS_REVIEW: its worker escalated.
func (f *fixture) needsReview(name string) string {
	f.t.Helper()
	key, token := f.acquired(name)
	if _, err := f.c.Escalate(ctxFor(f.t), &intentv1.EscalateRequest{Key: key, Token: token, Reason: "cannot tell", Actor: "fixture-worker"}); err != nil {
		f.t.Fatalf("Escalate(%s): %v", key, err)
	}
	return key
}

// described registers a refund by action and identity (its key derived
// by intentd), with labels and summary, and leaves it NEEDS_REVIEW; it
// returns the derived key.
func (f *fixture) described(name string, labels map[string]string, summary string) string {
	f.t.Helper()
	params, err := structpb.NewStruct(map[string]any{"amount_cents": 4000, "currency": "USD"})
	if err != nil {
		f.t.Fatal(err)
	}
	identity, err := structpb.NewStruct(map[string]any{"order_id": "ORD-88412", "return_id": "RA-" + f.key(name)})
	if err != nil {
		f.t.Fatal(err)
	}
	resp, err := f.c.Register(ctxFor(f.t), &intentv1.RegisterRequest{Params: params, Labels: labels, Action: "refund.issue", Identity: identity, Summary: summary})
	if err != nil {
		f.t.Fatalf("Register(%s): %v", name, err)
	}
	key := resp.GetIntent().GetKey()
	a, err := f.c.Acquire(ctxFor(f.t), &intentv1.AcquireRequest{Key: key, SessionId: f.sess.ID(), RequestId: key + "-attempt"})
	if err != nil {
		f.t.Fatalf("Acquire(%s): %v", key, err)
	}
	if _, err := f.c.Escalate(ctxFor(f.t), &intentv1.EscalateRequest{Key: key, Token: a.GetLease().GetToken(), Reason: "refund provider timed out", Actor: "fixture-worker"}); err != nil {
		f.t.Fatalf("Escalate(%s): %v", key, err)
	}
	return key
}

// completed leaves an intent COMPLETED.
func (f *fixture) completed(name string) string {
	f.t.Helper()
	key, token := f.acquired(name)
	if _, err := f.c.Complete(ctxFor(f.t), &intentv1.CompleteRequest{Key: key, Token: token, Result: &intentv1.Result{ExternalRefs: map[string]string{"order": "SO-1"}}}); err != nil {
		f.t.Fatalf("Complete(%s): %v", key, err)
	}
	return key
}
