package reliability

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// compactAndDefrag compacts the cluster to its current revision (waiting
// for the physical compaction) and defragments every member, one after
// the other, on its own client URL: what an operator's maintenance job
// does. It returns the revision compacted to and each defragmentation's
// duration.
func compactAndDefrag(t *testing.T, c *Cluster, admin *clientv3.Client) (int64, []time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := admin.Get(ctx, "/reliability-maintenance", clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("etcd revision: %v", err)
	}
	rev := resp.Header.GetRevision()
	if _, err := admin.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact to %d: %v", rev, err)
	}
	var took []time.Duration
	for _, m := range c.Members {
		start := time.Now()
		if _, err := admin.Defragment(ctx, m.ClientURL); err != nil {
			t.Fatalf("defragment etcd %s: %v", m.Name, err)
		}
		took = append(took, time.Since(start).Round(time.Millisecond))
	}
	return rev, took
}

// Scenario 10. Frequent compaction and defragmentation under load: three
// rounds of "compact to the current revision, defragment every member"
// while the workers run (each member carries 32 MiB of ballast besides the
// intents, so that every defragmentation copies a real backend and blocks
// its member for a while). A Watch opened from a revision before the
// compaction must end promptly with FAILED_PRECONDITION, reason
// REVISION_COMPACTED (naming the compaction) — never hang, never skip
// silently to the present; a re-list and a Watch from the listing's
// revision then delivers changes, and keeps delivering through a further
// round. CAS is unaffected: the invariants and porcupine hold. The refused
// Watch is the call that proves the fault was seen: a defragmentation of
// this size blocks its member for about 100 ms, and intentd steers calls off
// a member that does not answer its probe, so the workers' calls may notice
// nothing.
func TestEtcdCompactionAndDefrag(t *testing.T) {
	e := NewEnv(t, bins, report, EnvConfig{})
	admin, err := e.Cluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ballast := strings.Repeat("b", 1<<20)
	for i := range 32 {
		if _, err := admin.Put(ctx, fmt.Sprintf("/reliability-ballast/%02d", i), ballast); err != nil {
			t.Fatal(err)
		}
	}
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: *seedFlag})
	e.WaitOK(100, 20*time.Second)

	// The watcher is an operator's tool, not part of the checked history.
	cc, err := Dial(e.Addrs()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	wc := client.New(cc, client.WithCallTimeout(5*time.Second))
	page, err := wc.List(ctx, &intentv1.ListRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	before := page.GetRevision()

	ev := e.Faults.Inject("compact-defrag", "3 rounds: compact to the current revision, defragment every member")
	var compacted int64
	for round := range 3 {
		rev, took := compactAndDefrag(t, e.Cluster, admin)
		compacted = rev
		t.Logf("round %d: compacted to %d, defragmentations took %v", round, rev, took)
		time.Sleep(500 * time.Millisecond)
	}
	if compacted <= before+1 {
		t.Fatalf("compacted to %d, not past the listing's revision %d: the load wrote nothing", compacted, before)
	}

	// A watch from before the compaction: refused at once, naming it.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	start := time.Now()
	events := 0
	err = wc.Watch(wctx, &intentv1.WatchRequest{StartRevision: before + 1}, func(*intentv1.WatchResponse) bool { events++; return true })
	took := time.Since(start)
	cancel()
	var ce *client.Error
	refused := 0 // calls that saw the compaction
	switch {
	case !errors.As(err, &ce) || !errors.Is(err, client.ErrCompacted):
		t.Errorf("Watch from revision %d after compaction to %d ended after %v with %v (%d events), want FAILED_PRECONDITION REVISION_COMPACTED", before+1, compacted, took, err, events)
	case ce.Code != codes.FailedPrecondition || ce.Reason != "REVISION_COMPACTED":
		t.Errorf("Watch from a compacted revision: code %s reason %s, want FAILED_PRECONDITION REVISION_COMPACTED", ce.Code, ce.Reason)
	case events != 0:
		t.Errorf("Watch from compacted revision %d delivered %d events before its error: it skipped the compacted gap", before+1, events)
	case took > 3*time.Second:
		t.Errorf("Watch from a compacted revision took %v to fail, want promptly (3s)", took)
	default:
		if cr, _ := strconv.ParseInt(ce.Metadata["compact_revision"], 10, 64); cr < compacted {
			t.Errorf("REVISION_COMPACTED names compaction %q, want at least %d", ce.Metadata["compact_revision"], compacted)
		}
		t.Logf("Watch from revision %d refused after %v: %s (compact_revision %s)", before+1, took.Round(time.Millisecond), ce.Reason, ce.Metadata["compact_revision"])
		refused = 1
	}

	// Re-list, then watch from the listing's revision: it delivers, in
	// order, and keeps delivering through one more round.
	page, err = wc.List(ctx, &intentv1.ListRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	after := page.GetRevision()
	wctx, cancel = context.WithCancel(ctx)
	var got atomic.Int64
	var mu sync.Mutex
	var last int64
	var order []string
	done := make(chan error, 1)
	go func() {
		done <- wc.Watch(wctx, &intentv1.WatchRequest{StartRevision: after + 1}, func(r *intentv1.WatchResponse) bool {
			mu.Lock()
			if r.GetRevision() <= after || r.GetRevision() < last {
				order = append(order, fmt.Sprintf("revision %d after %d (listed at %d)", r.GetRevision(), last, after))
			}
			last = r.GetRevision()
			mu.Unlock()
			got.Add(1)
			return true
		})
	}()
	waitEvents := func(n int64, what string) {
		deadline := time.Now().Add(5 * time.Second)
		for got.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the watch from the listing's revision %d delivered %d events within 5s %s", after+1, got.Load(), what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitEvents(5, "")
	rev, dtook := compactAndDefrag(t, e.Cluster, admin)
	t.Logf("round 3 (watch open): compacted to %d, defragmentations took %v", rev, dtook)
	n := got.Load()
	waitEvents(n+5, "after a further compaction")
	e.Faults.Heal(ev)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the watch from the listing's revision ended with %v, want only our cancel", err)
	}
	mu.Lock()
	if len(order) > 0 {
		t.Errorf("the watch delivered out of order: %v", order[:min(5, len(order))])
	}
	mu.Unlock()
	t.Logf("the watch from revision %d delivered %d events through a further compaction", after+1, got.Load())
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{Noticed: func(FaultEvent, []Call) int { return refused }})
}

// recordedClient is a recorded client on its own connection to addr.
func recordedClient(t *testing.T, e *Env, addr string) *client.Client {
	t.Helper()
	cc, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	conn, _ := e.Rec.Conn(cc)
	return client.New(conn,
		client.WithCallTimeout(5*time.Second),
		client.WithBackoff(20*time.Millisecond, 400*time.Millisecond),
		client.WithReportTimeout(30*time.Second))
}

// registerAll registers keys[i] with params(i), eight at a time, each until
// intentd acknowledges it.
func registerAll(t *testing.T, c *client.Client, keys []string, paramsOf func(int) *intentv1.RegisterRequest) {
	t.Helper()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	var failed atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					return
				}
				req := paramsOf(i)
				req.Key = keys[i]
				var err error
				for try := 0; try < 20; try++ {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err = c.Register(ctx, req)
					cancel()
					if err == nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil && failed.Add(1) <= 3 {
					t.Errorf("register %s: %v", keys[i], err)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
}

// reconciler carries intents to COMPLETED with Session.Run, as a worker
// fleet does: Execute places the order under the operation key, Reconcile
// looks it up there. It counts, per key, the Reconciles (and what they
// found) and Executes.
type reconciler struct {
	shop *Shop

	mu         sync.Mutex
	reconciled map[string]int
	found      map[string]bool
	executed   map[string]int
}

func newReconciler(merchantURL string) *reconciler {
	return &reconciler{
		shop:       &Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, URL: merchantURL},
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
			o, err := r.shop.Place(ctx, att.OperationKey("create-order"), att.Key)
			if err != nil {
				return nil, err
			}
			return &intentv1.Result{ExternalRefs: map[string]string{RefOrder: o.ID}}, nil
		},
		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			o, err := r.shop.Find(ctx, att.OperationKey("create-order"))
			r.mu.Lock()
			defer r.mu.Unlock()
			switch {
			case errors.Is(err, ErrNoOrder):
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
	e := NewEnv(t, bins, report, EnvConfig{})
	addr := e.Intentds[0].Addr
	crashLink, err := NewProxy(addr)
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
	shop := &Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, URL: e.MerchantURL}
	start = time.Now()
	var wg sync.WaitGroup
	var acquired, placed atomic.Int64
	// Six Acquires at a time, so that the sessions' heartbeats (every
	// 667ms, TTL 2s) are not starved on two cores before the crash.
	busy := make(chan struct{}, 6)
	for s := range sessions {
		c := recordedClient(t, e, crashLink.Addr())
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
					if _, err := shop.Place(ctx, keys[i]+":create-order", keys[i]); err != nil {
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
	cc, err := Dial(addr)
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

// bigParams are the approved terms of the n-th large intent: about 48 KiB.
func bigParams(n int) *structpb.Struct {
	p, err := structpb.NewStruct(map[string]any{"item": fmt.Sprintf("item-%d", n), "quantity": 1, "merchant": "M",
		"attachment": strings.Repeat(string(rune('a'+n%26)), 48<<10)})
	if err != nil {
		panic(err)
	}
	return p
}

// dbSizes are the members' backend sizes, asked on their own URLs.
func dbSizes(ctx context.Context, c *Cluster, admin *clientv3.Client) []string {
	var out []string
	for _, m := range c.Members {
		st, err := admin.Status(ctx, m.ClientURL)
		if err != nil {
			out = append(out, m.Name+"=?")
			continue
		}
		out = append(out, fmt.Sprintf("%s=%.1fMiB", m.Name, float64(st.DbSize)/(1<<20)))
	}
	return out
}

// Scenario 11. The etcd backend quota is exhausted: the members run with
// --quota-backend-bytes 16 MiB, and large intents (48 KiB of params, each
// registered, leased and completed, so that every transition rewrites its
// record) fill it until etcd raises its NOSPACE alarm. Every write is then
// refused clearly — RESOURCE_EXHAUSTED, reason STORE_FULL, nothing written —
// while reads (Get of existing intents) are still served. Then the
// operator's recovery, which this test performs and documents:
//
//	# 1. compact the history away (old revisions are what fills the quota):
//	rev=$(etcdctl --endpoints=$EPS endpoint status --write-out=json | jq '.[0].Status.header.revision')
//	etcdctl --endpoints=$EPS compaction --physical $rev
//	# 2. give the space back to the file system, one member at a time:
//	etcdctl --endpoints=$EP1 defrag; etcdctl --endpoints=$EP2 defrag; ...
//	# 3. lift the alarm, or etcd keeps refusing writes:
//	etcdctl --endpoints=$EPS alarm disarm
//
// (If the live data alone exceeds the quota, compaction frees nothing:
// raise --quota-backend-bytes with a rolling restart, or let retention
// remove final intents.) After it, writes work again: a new intent
// registers, and every intent caught mid-way completes, once.
func TestEtcdBackendQuotaExhausted(t *testing.T) {
	const quota = 16 << 20
	e := NewEnv(t, bins, report, EnvConfig{})
	ctx := context.Background()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if err := e.Cluster.RestartWithFlags(rctx, "--quota-backend-bytes", strconv.Itoa(quota)); err != nil {
		t.Fatal(err)
	}
	cancel()
	admin, err := e.Cluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	addr := e.Intentds[0].Addr
	c := recordedClient(t, e, addr)
	r := newReconciler(e.MerchantURL)

	// Load before the fault: small intents, carried to COMPLETED.
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("%s-small-%03d", sanitize(t.Name()), i))
	}
	registerAll(t, c, keys, func(i int) *intentv1.RegisterRequest { return &intentv1.RegisterRequest{Params: params(i)} })
	if left := r.runAll(t, e, addr, keys, 4); len(left) > 0 {
		t.Fatalf("%d small intents did not complete before the fault", len(left))
	}

	ev := e.Faults.Inject("quota-exhausted", "etcd --quota-backend-bytes %d filled with 48KiB intents", quota)
	sess, err := c.OpenSession(ctx, "filler", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	shop := &Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, URL: e.MerchantURL}
	var full *client.Error
	var fullAt string
	fillStart := time.Now()
	filled := 0
	for i := 0; full == nil && time.Since(fillStart) < 60*time.Second; i++ {
		key := fmt.Sprintf("%s-big-%04d", sanitize(t.Name()), i)
		step := func(what string, err error) bool {
			if err == nil {
				return true
			}
			if !errors.As(err, &full) {
				t.Fatalf("%s %s: %v", what, key, err)
			}
			fullAt = what + " " + key
			return false
		}
		_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: bigParams(i)})
		if !step("Register", err) {
			break
		}
		keys = append(keys, key)
		acq, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: sess.ID(), RequestId: "fill-" + key})
		if !step("Acquire", err) {
			break
		}
		o, err := shop.Place(ctx, key+":create-order", key)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: acq.GetLease().GetToken(),
			Result: &intentv1.Result{ExternalRefs: map[string]string{RefOrder: o.ID}}})
		if !step("Complete", err) {
			break
		}
		filled++
	}
	if full == nil {
		t.Fatalf("60s of large intents did not fill a %d-byte quota", quota)
	}
	t.Logf("after %d large intents (%v) intentd refused %s: %s %s %q; backends %v", filled, time.Since(fillStart).Round(time.Millisecond),
		fullAt, full.Code, full.Reason, full.Message, dbSizes(ctx, e.Cluster, admin))
	if full.Code != codes.ResourceExhausted || full.Reason != "STORE_FULL" {
		t.Errorf("a write to a full store was answered %s %s, want RESOURCE_EXHAUSTED STORE_FULL", full.Code, full.Reason)
	}

	// Still full: every write is refused the same way, at once; reads are
	// served.
	start := time.Now()
	_, err = c.Register(ctx, &intentv1.RegisterRequest{Key: sanitize(t.Name()) + "-while-full", Params: params(1)})
	var e2 *client.Error
	if !errors.As(err, &e2) || e2.Code != codes.ResourceExhausted || e2.Reason != "STORE_FULL" || time.Since(start) > 2*time.Second {
		t.Errorf("Register while the store is full: %v after %v, want RESOURCE_EXHAUSTED STORE_FULL at once", err, time.Since(start))
	}
	// Opening a session grants an etcd lease, which a NOSPACE alarm also
	// refuses: the worker must hear STORE_FULL at once, not UNAVAILABLE
	// (which it would retry as if etcd were down).
	octx, ocancel := context.WithTimeout(ctx, 3*time.Second)
	start = time.Now()
	if s2, err := c.OpenSession(octx, "while-full", 10*time.Second); err != nil {
		var e3 *client.Error
		if !errors.As(err, &e3) || e3.Code != codes.ResourceExhausted || e3.Reason != "STORE_FULL" || time.Since(start) > 2*time.Second {
			t.Errorf("OpenSession while the store is full: %v after %v, want RESOURCE_EXHAUSTED STORE_FULL at once", err, time.Since(start))
		}
	} else {
		t.Logf("OpenSession while full: served (%s)", s2.ID())
		_ = s2.Close(octx)
	}
	ocancel()
	reads := 0
	for _, k := range []string{keys[0], keys[len(keys)/2], keys[len(keys)-1]} {
		gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.Get(gctx, &intentv1.GetRequest{Key: k})
		gcancel()
		if err != nil {
			t.Errorf("Get %s while the store is full: %v, want it served", k, err)
			continue
		}
		reads++
		t.Logf("Get %s while full: %s", k, resp.GetIntent().GetState())
	}

	// The operator's recovery: compact, defragment every member, disarm.
	before := dbSizes(ctx, e.Cluster, admin)
	rev, took := compactAndDefrag(t, e.Cluster, admin)
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	alarms, err := admin.AlarmList(actx)
	if err == nil {
		t.Logf("alarms before disarm: %v", alarms.Alarms)
		_, err = admin.AlarmDisarm(actx, &clientv3.AlarmMember{})
	}
	acancel()
	if err != nil {
		t.Fatalf("alarm disarm: %v", err)
	}
	e.Faults.Heal(ev)
	t.Logf("recovery: compacted to %d, defragmented in %v, alarm disarmed; backends %v → %v", rev, took, before, dbSizes(ctx, e.Cluster, admin))

	// Writes work again: a new intent registers and completes; every intent
	// caught mid-way completes, once.
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	_ = sess.Close(sctx) // its lease, if any, becomes UNKNOWN: reconciled below
	scancel()
	after := sanitize(t.Name()) + "-after"
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: after, Params: params(2)})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Register after the recovery still fails: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	keys = append(keys, after)
	if left := r.runAll(t, e, addr, keys, 4); len(left) > 0 {
		t.Errorf("%d intents did not complete after the recovery (first %v)", len(left), left[:min(5, len(left))])
	}
	t.Logf("%d large intents filled the quota; %d reads served while full; every one of %d intents COMPLETED after recovery", filled, reads, len(keys))
	e.FinishKeys(keys, FinishOptions{MinLoad: 50, Noticed: refusedWith(codes.ResourceExhausted, "STORE_FULL")})
}
