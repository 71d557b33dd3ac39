package reliability

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"google.golang.org/grpc"
)

// Many leases lapse at once.

// reconciler carries intents to COMPLETED with Session.Run, as a worker
// fleet does: Execute places the order under the operation key, Reconcile
// looks it up there. It counts, per key, the Reconciles (and what they
// found) and Executes.
type reconciler struct {
	shop *harness.Shop

	mu         sync.Mutex
	reconciled map[string]int
	found      map[string]bool
	executed   map[string]int
}

func newReconciler(merchantURL string) *reconciler {
	return &reconciler{
		shop:       &harness.Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, Merchant: merchantURL},
		reconciled: map[string]int{}, found: map[string]bool{}, executed: map[string]int{},
	}
}

func (r *reconciler) task(key string) client.Task {
	return client.Task{
		Key:            key,
		WaitInProgress: 10 * time.Second,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			r.mu.Lock()
			r.executed[att.Key]++
			r.mu.Unlock()
			o, err := r.shop.CreateOrder(ctx, att.OperationKey("create-order"), fakes.OrderRequest{Reference: att.Key})
			if err != nil {
				return nil, err
			}
			return &intentv1.Result{ExternalRefs: map[string]string{RefOrder: o.ID}}, nil
		},
		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			o, found, err := r.shop.FindOrder(ctx, att.OperationKey("create-order"))
			r.mu.Lock()
			defer r.mu.Unlock()
			switch {
			case err == nil && !found:
				r.reconciled[att.Key]++
				return client.Absent("the merchant has no order under " + att.OperationKey("create-order")), nil
			case err != nil:
				return client.Evidence{}, err
			}
			r.reconciled[att.Key]++
			r.found[att.Key] = true
			return client.Found(&intentv1.Result{ExternalRefs: map[string]string{RefOrder: o.ID}}), nil
		},
	}
}

// runAll runs every key to COMPLETED on workers sessions of its own
// (recorded clients on addr), trying a key again while Run leaves it
// elsewhere; it returns the keys that did not complete within 60s.
func (r *reconciler) runAll(t *testing.T, e *Env, addr string, keys []string, workers int) []string {
	t.Helper()
	queue := make(chan string, len(keys))
	for _, k := range keys {
		queue <- k
	}
	close(queue)
	var mu sync.Mutex
	var left []string
	deadline := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	for w := range workers {
		c := recordedClient(t, e, addr)
		wg.Go(func() {
			var sess *client.Session
			defer func() {
				if sess != nil {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_ = sess.Close(ctx)
					cancel()
				}
			}()
			for key := range queue {
				done := false
				for !done && time.Now().Before(deadline) {
					if sess == nil || sess.Err() != nil {
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						s, err := c.OpenSession(ctx, fmt.Sprintf("reconciler-%d", w), 3*time.Second)
						cancel()
						if err != nil {
							time.Sleep(100 * time.Millisecond)
							continue
						}
						sess = s
					}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					out, err := sess.Run(ctx, r.task(key))
					cancel()
					done = err == nil && out.Outcome == intentv1.Outcome_OUTCOME_COMPLETED
					if !done {
						time.Sleep(50 * time.Millisecond)
					}
				}
				if !done {
					mu.Lock()
					left = append(left, key)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return left
}

// Scenario 12. Many leases expire at once: 40 workers, each with a 2s
// session, hold 50 intents apiece (2,000 in all) — and then all crash at
// once: their link to intentd is cut and nobody closes their sessions, so
// every lease lapses in etcd within the same TTL. Half of them had placed
// their order before the crash, half had not. A reconciler fleet then runs
// every intent: each must come back as RECONCILE (UNKNOWN after the lapse,
// never EXECUTE on a doubt), the reconcile finds the order or confirms its
// absence, and the intent completes — the merchant holds exactly one order
// per intent: no intent executed twice.
func TestManyLeasesExpireAtOnce(t *testing.T) {
	const sessions, perSession = 40, 50
	const n = sessions * perSession
	e := NewEnv(t, report, EnvConfig{})
	addr := e.Intentds[0].Addr
	crashLink, err := harness.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = crashLink.Close() })

	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%04d", sanitize(t.Name()), i)
	}
	approver := recordedClient(t, e, addr)
	start := time.Now()
	registerAll(t, approver, keys, func(i int) *intentv1.RegisterRequest { return &intentv1.RegisterRequest{Params: params(i)} })
	t.Logf("registered %d intents in %v", n, time.Since(start).Round(time.Millisecond))

	// The doomed workers: a session each (TTL 2s) through crashLink, 50
	// leases each; the even intents' orders are placed, the odd ones' not.
	shop := &harness.Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, Merchant: e.MerchantURL}
	start = time.Now()
	var wg sync.WaitGroup
	var acquired, placed atomic.Int64
	// Six Acquires at a time, so that the sessions' heartbeats (every
	// 667ms, TTL 2s) are not starved on two cores before the crash.
	busy := make(chan struct{}, 6)
	for s := range sessions {
		c := recordedClient(t, e, crashLink.Addr())
		wg.Go(func() {
			// A session's 50 leases took more than 30s when the whole
			// suite ran at a load average of 19 on two cores.
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			sess, err := c.OpenSession(ctx, fmt.Sprintf("doomed-%d", s), 2*time.Second)
			if err != nil {
				t.Errorf("open session %d: %v", s, err)
				return
			}
			for j := range perSession {
				i := s*perSession + j
				busy <- struct{}{}
				resp, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: keys[i], SessionId: sess.ID(), RequestId: fmt.Sprintf("doomed-%d", i)})
				if err != nil || resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
					<-busy
					t.Errorf("acquire %s: %v (outcome %s)", keys[i], err, resp.GetOutcome())
					continue
				}
				<-busy
				acquired.Add(1)
				if i%2 == 0 {
					// The operation key Attempt.OperationKey("create-order") gives.
					if _, err := shop.CreateOrder(ctx, keys[i]+":create-order", fakes.OrderRequest{Reference: keys[i]}); err != nil {
						t.Errorf("place the order of %s: %v", keys[i], err)
						continue
					}
					placed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d sessions hold %d leases (%d orders placed) after %v", sessions, acquired.Load(), placed.Load(), time.Since(start).Round(time.Millisecond))

	// The crash: every doomed worker's connection closes, nothing comes
	// back; no CloseSession, so only the TTL ends the sessions.
	ev := e.Faults.Inject("crash-workers", "%d workers' links to intentd cut: %d leases of 2s sessions lapse at once", sessions, n)
	crashLink.Cut()
	// Wait until intentd shows every intent UNKNOWN (its holder's session
	// gone from etcd); the janitor, which moves them to UNKNOWN in etcd,
	// may still be on its way: the reconcilers race it.
	lister := client.New(mustDial(t, addr), client.WithCallTimeout(5*time.Second))
	waitStart := time.Now()
	for {
		unknown := countState(t, lister, intentv1.State_STATE_UNKNOWN, false)
		if unknown == n {
			t.Logf("all %d intents shown UNKNOWN %v after the crash; the janitor had marked %d of them", n,
				time.Since(waitStart).Round(time.Millisecond), countState(t, lister, intentv1.State_STATE_UNKNOWN, true))
			break
		}
		if time.Since(waitStart) > 10*time.Second {
			t.Fatalf("10s after the crash of 2s sessions only %d of %d intents are shown UNKNOWN", unknown, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.Faults.Heal(ev)

	r := newReconciler(e.MerchantURL)
	start = time.Now()
	left := r.runAll(t, e, addr, keys, 8)
	t.Logf("reconcilers completed %d intents in %v", n-len(left), time.Since(start).Round(time.Millisecond))
	if len(left) > 0 {
		t.Errorf("%d intents not COMPLETED by the reconcilers (first %v)", len(left), left[:min(5, len(left))])
	}
	_, finals := e.FinishKeys(keys, FinishOptions{})

	found, absent, executed := 0, 0, 0
	for i, k := range keys {
		r.mu.Lock()
		rec, fnd, exe := r.reconciled[k], r.found[k], r.executed[k]
		r.mu.Unlock()
		switch {
		case rec == 0:
			t.Errorf("%s: never reconciled: its lapsed lease was not handed out as RECONCILE", k)
		case i%2 == 0 && (!fnd || exe != 0):
			t.Errorf("%s: its order was placed before the crash, yet reconcile found=%v and Execute ran %d times", k, fnd, exe)
		case i%2 == 1 && (fnd || exe != 1):
			t.Errorf("%s: no order before the crash, yet reconcile found=%v and Execute ran %d times, want once", k, fnd, exe)
		}
		if fnd {
			found++
		} else {
			absent++
		}
		executed += exe
		if in := finals[k]; in != nil && !(hasKind(in, intentv1.HistoryEntry_KIND_LEASE_LAPSED) && hasReconcileLease(in)) {
			t.Errorf("%s: its history lacks the lapse or the RECONCILE lease: %v", k, in.GetHistory())
		}
	}
	if got := e.Merchant.Count(); got != n || e.Merchant.Duplicates() != 0 {
		t.Errorf("the merchant holds %d orders (%d duplicates) for %d intents", got, e.Merchant.Duplicates(), n)
	}
	t.Logf("%d lapsed intents reconciled: %d found their order, %d confirmed absent and executed once (%d executes); merchant orders %d",
		n, found, absent, executed, e.Merchant.Count())
}

// mustDial is an unrecorded connection to addr, closed with the test.
func mustDial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := harness.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// countState lists every intent and counts those shown in state; with
// filtered, it asks intentd for that state only (an intent whose holder
// lapsed is listed under UNKNOWN only once the janitor marked it).
func countState(t *testing.T, c *client.Client, state intentv1.State, filtered bool) int {
	t.Helper()
	n, token := 0, ""
	for {
		req := &intentv1.ListRequest{PageSize: 100, PageToken: token}
		if filtered {
			req.States = []intentv1.State{state}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		page, err := c.List(ctx, req)
		cancel()
		if err != nil {
			t.Logf("list %s: %v", state, err)
			return n
		}
		for _, in := range page.GetIntents() {
			if in.GetState() == state {
				n++
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			return n
		}
	}
}

func hasKind(in *intentv1.Intent, kind intentv1.HistoryEntry_Kind) bool {
	for _, h := range in.GetHistory() {
		if h.GetKind() == kind {
			return true
		}
	}
	return false
}

func hasReconcileLease(in *intentv1.Intent) bool {
	for _, h := range in.GetHistory() {
		if h.GetKind() == intentv1.HistoryEntry_KIND_ACQUIRED && h.GetMode() == intentv1.LeaseMode_LEASE_MODE_RECONCILE {
			return true
		}
	}
	return false
}
