package etcdfence

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantStale checks that err is a *fencing.StaleError for resource, tok and
// highest.
func wantStale(t *testing.T, err error, resource string, tok, highest fencing.Token) {
	t.Helper()
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("Admit(%q, %d) = %v, want ErrStale", resource, tok, err)
	}
	var se *fencing.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("Admit(%q, %d) = %T, want *fencing.StaleError", resource, tok, err)
	}
	want := fencing.StaleError{Resource: resource, Token: tok, Highest: highest}
	if *se != want {
		t.Fatalf("StaleError = %+v, want %+v", *se, want)
	}
}

func TestEncodeOrdersLikeTokens(t *testing.T) {
	toks := []fencing.Token{1, 2, 9, 10, 11, 99, 100, 1 << 32, 1<<63 - 1, 1 << 63, math.MaxUint64 - 1, math.MaxUint64}
	for i, a := range toks {
		ea := encode(a)
		if len(ea) != width {
			t.Errorf("encode(%d) = %q, %d bytes, want %d", a, ea, len(ea), width)
		}
		if got, err := decode([]byte(ea)); err != nil || got != a {
			t.Errorf("decode(encode(%d)) = %d, %v, want %d, nil", a, got, err, a)
		}
		for _, b := range toks[i+1:] {
			if bytes.Compare([]byte(ea), []byte(encode(b))) >= 0 {
				t.Errorf("encode(%d) = %q not byte-wise below encode(%d) = %q", a, ea, b, encode(b))
			}
		}
	}
	if got, want := encode(7), "00000000000000000007"; got != want {
		t.Errorf("encode(7) = %q, want %q", got, want)
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, in := range []string{"", "7", "0000000000000000007", "000000000000000000007", "0000000000000000000x", " 0000000000000000007", "99999999999999999999"} {
		if got, err := decode([]byte(in)); !errors.Is(err, fencing.ErrMalformed) {
			t.Errorf("decode(%q) = %d, %v, want ErrMalformed", in, got, err)
		}
	}
}

func TestAdmit(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := ctxT(t)
	fc := New(cli, "fence/")
	const r = "order/42"

	// Missing key: etcd's Value compare fails on it, so Admit takes Else and
	// creates the key.
	if resp, err := cli.Get(ctx, fc.Key(r)); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("before: Get(%q) = %v, %v, want no key", fc.Key(r), resp, err)
	}
	if err := fc.Admit(ctx, r, 7); err != nil {
		t.Fatalf("first Admit(7) = %v, want nil (missing key is created)", err)
	}
	resp, err := cli.Get(ctx, fc.Key(r))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("after: Get(%q) = %v, %v, want one key", fc.Key(r), resp, err)
	}
	if got, want := string(resp.Kvs[0].Value), "00000000000000000007"; got != want {
		t.Fatalf("stored value = %q, want %q", got, want)
	}

	steps := []struct {
		tok     fencing.Token
		stale   bool
		highest fencing.Token // after the step
	}{
		{7, false, 7},   // equal: the same lease retrying
		{9, false, 9},   // newer holder
		{7, true, 9},    // the superseded worker resumes
		{8, true, 9},    // anything below the highest
		{9, false, 9},   // the newer holder retrying
		{10, false, 10}, // a width change in decimal still orders
		{9, true, 10},
	}
	for i, s := range steps {
		err := fc.Admit(ctx, r, s.tok)
		if s.stale {
			wantStale(t, err, r, s.tok, s.highest)
		} else if err != nil {
			t.Fatalf("step %d: Admit(%d) = %v, want nil", i, s.tok, err)
		}
		if got, err := fc.Highest(ctx, r); err != nil || got != s.highest {
			t.Fatalf("step %d: Highest = %d, %v, want %d", i, got, err, s.highest)
		}
	}

	// Other resources and other prefixes are independent.
	if err := fc.Admit(ctx, "order/43", 1); err != nil {
		t.Fatalf("Admit(order/43, 1) = %v, want nil", err)
	}
	if err := New(cli, "other/").Admit(ctx, r, 1); err != nil {
		t.Fatalf("other prefix: Admit(1) = %v, want nil", err)
	}
	if got, err := fc.Highest(ctx, "never"); err != nil || got != 0 {
		t.Fatalf("Highest(never) = %d, %v, want 0, nil", got, err)
	}
}

func TestAdmitZeroToken(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := ctxT(t)
	fc := New(cli, "fence/")
	if err := fc.Admit(ctx, "r", 0); !errors.Is(err, fencing.ErrMalformed) {
		t.Fatalf("Admit(0) = %v, want ErrMalformed", err)
	}
	if resp, err := cli.Get(ctx, fc.Key("r")); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("Get after Admit(0) = %v, %v, want no key written", resp, err)
	}
}

func TestAdmitSharedAcrossCheckers(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := ctxT(t)
	// Two processes of one resource: two clients, two Checkers, one prefix.
	a := New(srv.Client(t), "fence/")
	b := New(srv.Client(t), "fence/")
	if err := a.Admit(ctx, "r", 7); err != nil {
		t.Fatalf("a.Admit(7) = %v", err)
	}
	if err := b.Admit(ctx, "r", 9); err != nil {
		t.Fatalf("b.Admit(9) = %v", err)
	}
	wantStale(t, a.Admit(ctx, "r", 7), "r", 7, 9)
}

func TestAdmitConcurrent(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := ctxT(t)
	fc := New(cli, "fence/")
	const (
		goroutines = 32
		perG       = 20
		maxToken   = 1000
	)
	resources := []string{"a", "b"}

	type outcome struct {
		resource string
		tok      fencing.Token
		err      error
	}
	results := make([][]outcome, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 0xfe11ce))
			for range perG {
				r := resources[rng.IntN(len(resources))]
				tok := fencing.Token(1 + rng.IntN(maxToken))
				results[g] = append(results[g], outcome{r, tok, fc.Admit(ctx, r, tok)})
			}
		}()
	}
	wg.Wait()

	maxTried := map[string]fencing.Token{}
	maxAdmitted := map[string]fencing.Token{}
	var refused int
	for _, rs := range results {
		for _, o := range rs {
			maxTried[o.resource] = max(maxTried[o.resource], o.tok)
			var se *fencing.StaleError
			switch {
			case o.err == nil:
				maxAdmitted[o.resource] = max(maxAdmitted[o.resource], o.tok)
			case errors.As(o.err, &se):
				refused++
				if se.Highest <= o.tok {
					t.Errorf("Admit(%q, %d) refused with Highest %d, want Highest > token", o.resource, o.tok, se.Highest)
				}
			default:
				t.Errorf("Admit(%q, %d) = %v, want nil or stale", o.resource, o.tok, o.err)
			}
		}
	}
	if refused == 0 {
		t.Errorf("no Admit was refused: the test did not exercise the stale path")
	}
	for _, r := range resources {
		got, err := fc.Highest(ctx, r)
		if err != nil {
			t.Fatalf("Highest(%q) = %v", r, err)
		}
		// The largest token tried can never be stale, so it is admitted and
		// nothing afterwards can replace it.
		if got != maxTried[r] || got != maxAdmitted[r] {
			t.Errorf("Highest(%q) = %d, want max tried %d = max admitted %d", r, got, maxTried[r], maxAdmitted[r])
		}
	}
}

// TestCmpOpInUserTxn is a resource that keeps its data in etcd and fences
// its own write in the same transaction as the check.
func TestCmpOpInUserTxn(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := ctxT(t)
	fc := New(cli, "fence/")
	const (
		r       = "order/42"
		dataKey = "data/order/42"
	)

	// write is the resource's guarded write: it reports whether it was
	// admitted and, if refused, the highest token.
	write := func(tok fencing.Token, data string) (bool, fencing.Token) {
		t.Helper()
		resp, err := cli.Txn(ctx).
			If(fc.Cmp(r, tok)).
			Then(clientv3.OpGet(fc.Key(r))).
			Else(fc.Op(r, tok), clientv3.OpPut(dataKey, data)).
			Commit()
		if err != nil {
			t.Fatalf("Txn(%d) = %v", tok, err)
		}
		if !resp.Succeeded {
			return true, 0
		}
		h, err := decode(resp.Responses[0].GetResponseRange().GetKvs()[0].Value)
		if err != nil {
			t.Fatalf("decode highest: %v", err)
		}
		return false, h
	}
	data := func() string {
		t.Helper()
		resp, err := cli.Get(ctx, dataKey)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("Get(%q) = %v, %v", dataKey, resp, err)
		}
		return string(resp.Kvs[0].Value)
	}

	// A writes first; the fence key does not exist yet and is created.
	if ok, _ := write(7, "by A"); !ok {
		t.Fatalf("A(7) on a fresh resource refused, want admitted")
	}
	// B takes over with a newer token.
	if ok, _ := write(9, "by B"); !ok {
		t.Fatalf("B(9) refused, want admitted")
	}
	// A resumes: the check and the write are one Txn, so nothing lands.
	if ok, h := write(7, "by A, late"); ok || h != 9 {
		t.Fatalf("A(7) after B(9) = admitted %v, highest %d, want refused with 9", ok, h)
	}
	if got, want := data(), "by B"; got != want {
		t.Fatalf("data = %q, want %q", got, want)
	}
	if got, err := fc.Highest(ctx, r); err != nil || got != 9 {
		t.Fatalf("Highest = %d, %v, want 9", got, err)
	}
	// The Cmp/Op route and Admit share one state.
	wantStale(t, fc.Admit(ctx, r, 8), r, 8, 9)
}

// TestDefaultDeadline checks that a context without a deadline still gets
// one: with no etcd listening, Admit fails after the Checker's timeout
// instead of waiting forever.
func TestDefaultDeadline(t *testing.T) {
	addr := freeport.Addr(t) // a loopback port nobody listens on
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	fc := New(cli, "fence/")
	fc.timeout = 300 * time.Millisecond

	start := time.Now()
	err = fc.Admit(context.Background(), "r", 7)
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Fatalf("Admit returned after %v, want about %v", elapsed, fc.timeout)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Admit with no etcd = %v, want context.DeadlineExceeded", err)
	}
	if _, err := fc.Highest(context.Background(), "r"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Highest with no etcd = %v, want context.DeadlineExceeded", err)
	}
}
