package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// fault is what goes wrong on an intent's first execution.
type fault int

const (
	faultNone fault = iota
	// faultCutReply: the merchant creates the order, its reply is lost.
	faultCutReply
	// faultCrash: the worker process dies right after the order, before
	// any report; its lease lapses with its session's TTL.
	faultCrash
	// faultSessionClosed: right after the order the worker's session is
	// closed (its leases become UNKNOWN at once) and the process dies.
	faultSessionClosed
	// faultPauseAfter: the worker process stops right after the order for
	// longer than its TTL (no RPC leaves it, heartbeats included), then
	// resumes and reports.
	faultPauseAfter
	// faultPauseBefore: the worker process stops before it calls the
	// merchant, for longer than its TTL, then resumes and sends the call
	// anyway (it was already on its way), and reports.
	faultPauseBefore
	// faultLostAcquire: intentd grants the intent's first lease, and its
	// answer is lost on the way back to the worker.
	faultLostAcquire
	// faultLostComplete: intentd records the intent's first Complete, and
	// its answer is lost on the way back.
	faultLostComplete
	numFaults
)

var faultNames = [numFaults]string{"none", "cut-reply", "crash", "session-closed", "pause-after-effect", "pause-before-effect", "lost-acquire-answer", "lost-complete-answer"}

// faultPercent is the chance, in percent, that an intent meets each fault
// (on its first execution, or its first Acquire or Complete).
var faultPercent = [numFaults]int{faultCutReply: 8, faultCrash: 6, faultSessionClosed: 6, faultPauseAfter: 4, faultPauseBefore: 4, faultLostAcquire: 5, faultLostComplete: 5}

// errCrashed is what Execute returns in a worker process that just died;
// nothing it sends afterwards leaves the process.
var errCrashed = errors.New("e2e: worker process crashed")

// TestChaos is scenario 10: 100 intents, 8 workers, each worker a
// goroutine with its own connection and session standing for a process.
// The seed (-seed) decides which intents meet which fault on their first
// execution, and which are delivered twice; the interleaving is the
// scheduler's. Deliveries come from a queue with a visibility timeout, so
// a slow or stopped worker's intent is delivered again to another. At the
// end every intent must be COMPLETED and the merchant must hold exactly
// one order per intent: the result each intent records. With -soak it runs
// at ten times the size: 1,000 intents, 32 workers.
func TestChaos(t *testing.T) {
	if harness.Soak() {
		runChaos(t, chaosConfig{intents: 1000, workers: 32, seed: harness.Seed(), redeliverPercent: 20, deadline: 15 * time.Minute})
		return
	}
	runChaos(t, chaosConfig{intents: 100, workers: 8, seed: harness.Seed(), redeliverPercent: 10, deadline: 150 * time.Second})
}

type chaosConfig struct {
	intents, workers int
	seed             uint64
	redeliverPercent int // intents delivered twice from the start
	deadline         time.Duration
}

// delivery is one queue message: an intent, under a message id of the
// queue's own.
type delivery struct {
	msgID  string
	intent int
}

type chaos struct {
	t     *testing.T
	cfg   chaosConfig
	w     *world
	shop  *shop
	cut   *fakes.CutReply
	keys  []string
	terms []*structpb.Struct
	plan  []fault
	taken []atomic.Bool // the intent's fault was met
	index map[string]int

	queue   chan delivery
	msgs    atomic.Int64
	allDone chan struct{}

	mu        sync.Mutex
	completed []string // order id recorded per intent; "" until COMPLETED
	review    []bool   // the intent went to NEEDS_REVIEW
	remaining int

	fired                                              [numFaults]atomic.Int32
	runs, executes, reconciles, stale, redeliveries    atomic.Int32
	restarts, inProgress, unknownRuns, otherRunErrors  atomic.Int32
	visibilityRedeliveries, lostSessions, replayedRuns atomic.Int32
}

func runChaos(t *testing.T, cfg chaosConfig) {
	w := newWorld(t)
	ctx := testCtx(t, cfg.deadline)
	rng := rand.New(rand.NewPCG(cfg.seed, 0x6e2e))
	ch := &chaos{
		t: t, cfg: cfg, w: w,
		keys: make([]string, cfg.intents), terms: make([]*structpb.Struct, cfg.intents), plan: make([]fault, cfg.intents),
		taken: make([]atomic.Bool, cfg.intents), queue: make(chan delivery, cfg.intents*50), allDone: make(chan struct{}),
		completed: make([]string, cfg.intents), review: make([]bool, cfg.intents), remaining: cfg.intents,
		index: map[string]int{},
	}
	var planned [numFaults]int
	var cutKeys []string
	var first []delivery
	for i := range cfg.intents {
		key, _, err := intent.DeriveKey("purchase", map[string]any{"customer": fmt.Sprintf("c-%d", i%17), "cart": fmt.Sprintf("cart-%04d", i), "merchant": "M"})
		if err != nil {
			t.Fatal(err)
		}
		ch.keys[i], ch.terms[i] = key, purchase(fmt.Sprintf("item-%d", i%23), 1+i%4, 1000+i)
		ch.index[key] = i
		r := rng.IntN(100)
		for f := fault(1); f < numFaults; f++ {
			if r < faultPercent[f] {
				ch.plan[i] = f
				break
			}
			r -= faultPercent[f]
		}
		planned[ch.plan[i]]++
		if ch.plan[i] == faultCutReply {
			cutKeys = append(cutKeys, intent.OperationKey(key, "create-order"))
		}
		first = append(first, ch.newDelivery(i))
		if rng.IntN(100) < cfg.redeliverPercent {
			first = append(first, ch.newDelivery(i))
		}
	}
	rng.Shuffle(len(first), func(a, b int) { first[a], first[b] = first[b], first[a] })
	for _, d := range first {
		ch.queue <- d
	}
	ch.cut = &fakes.CutReply{}
	if len(cutKeys) > 0 {
		ch.cut.Cut = fakes.CutFirst(http.MethodPost, "/orders", cutKeys...)
	}
	ch.shop = w.shop(ch.cut)
	t.Logf("chaos: seed=%d intents=%d workers=%d first deliveries=%d (intents delivered twice: %d)",
		cfg.seed, cfg.intents, cfg.workers, len(first), len(first)-cfg.intents)
	t.Logf("chaos: faults planned: %s", ch.faultLine(func(f fault) int { return planned[f] }))

	start := time.Now()
	var wg sync.WaitGroup
	for id := range cfg.workers {
		wg.Go(func() { ch.worker(ctx, id) })
	}
	select {
	case <-ch.allDone:
	case <-ctx.Done():
	}
	took := time.Since(start)
	ch.mu.Lock()
	remaining := ch.remaining
	ch.mu.Unlock()
	if remaining > 0 {
		close(ch.allDone)
	}
	wg.Wait()

	ch.fired[faultCutReply].Store(int32(len(ch.cut.Cuts())))
	t.Logf("chaos: faults injected: %s", ch.faultLine(func(f fault) int { return int(ch.fired[f].Load()) }))
	t.Logf("chaos: runs=%d executes=%d reconciles=%d replayed=%d in-progress=%d unknown=%d stale-reports-refused=%d other-errors=%d redeliveries=%d (visibility timeout %d) worker-restarts=%d lost-sessions=%d",
		ch.runs.Load(), ch.executes.Load(), ch.reconciles.Load(), ch.replayedRuns.Load(), ch.inProgress.Load(), ch.unknownRuns.Load(),
		ch.stale.Load(), ch.otherRunErrors.Load(), ch.redeliveries.Load(), ch.visibilityRedeliveries.Load(), ch.restarts.Load(), ch.lostSessions.Load())
	if remaining > 0 {
		ch.reportStuck(remaining)
		return
	}
	ch.verify(took)
}

func (ch *chaos) newDelivery(i int) delivery {
	return delivery{msgID: fmt.Sprintf("msg-%06d", ch.msgs.Add(1)), intent: i}
}

func (ch *chaos) faultLine(n func(fault) int) string {
	var parts []string
	total := 0
	for f := fault(1); f < numFaults; f++ {
		parts = append(parts, fmt.Sprintf("%s=%d", faultNames[f], n(f)))
		total += n(f)
	}
	return fmt.Sprintf("%s (total %d)", strings.Join(parts, " "), total)
}

// redeliver puts intent i back on the queue under a new message id after
// a short delay, unless it is settled by then.
func (ch *chaos) redeliver(i int) {
	time.AfterFunc(20*time.Millisecond, func() {
		if ch.settled(i) {
			return
		}
		ch.redeliveries.Add(1)
		select {
		case ch.queue <- ch.newDelivery(i):
		case <-ch.allDone:
		}
	})
}

func (ch *chaos) settled(i int) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.completed[i] != "" || ch.review[i]
}

// settle records intent i's end: COMPLETED with order, or NEEDS_REVIEW.
func (ch *chaos) settle(i int, order string, review bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.completed[i] != "" {
		if order != ch.completed[i] {
			ch.t.Errorf("intent %d (%s) completed with order %s, later replayed with %s: a COMPLETED result changed", i, ch.keys[i], ch.completed[i], order)
		}
		return
	}
	if ch.review[i] {
		return
	}
	ch.completed[i], ch.review[i] = order, review
	ch.remaining--
	if ch.remaining == 0 {
		close(ch.allDone)
	}
}

// incarnation is one life of a worker process: a connection, a client, a
// session. A crash ends it; the worker starts a new one.
type incarnation struct {
	conn *harness.FaultyConn
	sess *client.Session
}

func (ch *chaos) startIncarnation(ctx context.Context, worker, life int) (*incarnation, error) {
	cc, err := harness.Dial(ch.w.intentd.Addr)
	if err != nil {
		return nil, err
	}
	fc := &harness.FaultyConn{CC: cc, LoseAnswer: ch.loseAnswer}
	sess, err := newClient(fc).OpenSession(ctx, fmt.Sprintf("chaos-w%d-life%d", worker, life), sessionTTL)
	if err != nil {
		_ = cc.Close()
		return nil, err
	}
	return &incarnation{conn: fc, sess: sess}, nil
}

// end closes the incarnation's session (a dead one cannot: its session
// lapses on its own) and connection.
func (inc *incarnation) end() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = inc.sess.Close(ctx)
	_ = inc.conn.CC.Close()
}

func (ch *chaos) worker(ctx context.Context, id int) {
	life := 0
	inc, err := ch.startIncarnation(ctx, id, life)
	if err != nil {
		ch.t.Errorf("worker %d: %v", id, err)
		return
	}
	defer func() {
		if inc != nil {
			inc.end()
		}
	}()
	for {
		var d delivery
		select {
		case <-ch.allDone:
			return
		case <-ctx.Done():
			return
		case d = <-ch.queue:
		}
		if ch.settled(d.intent) {
			continue // acknowledged: a late duplicate of a settled intent
		}
		ch.handle(ctx, inc, d)
		lost := false
		select {
		case <-inc.sess.Done():
			lost = true
		default:
		}
		if inc.conn.Dead() || lost {
			if lost && !inc.conn.Dead() {
				ch.lostSessions.Add(1)
			}
			inc.end()
			life++
			ch.restarts.Add(1)
			if inc, err = ch.startIncarnation(ctx, id, life); err != nil {
				if ctx.Err() == nil {
					ch.t.Errorf("worker %d restart: %v", id, err)
				}
				inc = nil
				return
			}
		}
	}
}

// handle runs one delivery and acknowledges it, or puts it back.
func (ch *chaos) handle(ctx context.Context, inc *incarnation, d delivery) {
	// The queue's visibility timeout: a delivery not acknowledged in time
	// goes to another worker too.
	visible := time.AfterFunc(time.Second, func() {
		ch.visibilityRedeliveries.Add(1)
		ch.redeliver(d.intent)
	})
	out, err := inc.sess.Run(ctx, ch.task(inc, d.intent))
	visible.Stop()
	ch.runs.Add(1)
	switch {
	case err == nil && out.Outcome == intentv1.Outcome_OUTCOME_COMPLETED:
		if !out.Executed {
			ch.replayedRuns.Add(1)
		}
		ch.settle(d.intent, out.Intent.GetResult().GetExternalRefs()[refOrder], false)
		return
	case err == nil && out.Outcome == intentv1.Outcome_OUTCOME_NEEDS_REVIEW:
		ch.settle(d.intent, "", true)
		return
	case errors.Is(err, client.ErrStaleToken):
		ch.stale.Add(1)
	case err == nil && out.Outcome == intentv1.Outcome_OUTCOME_IN_PROGRESS:
		ch.inProgress.Add(1)
	case out != nil && out.Intent.GetState() == intentv1.State_STATE_UNKNOWN:
		ch.unknownRuns.Add(1)
	case errors.Is(err, errCrashed) || inc.conn.Dead() || ctx.Err() != nil:
	default:
		ch.otherRunErrors.Add(1)
		ch.t.Logf("chaos: %s %s: %s", d.msgID, ch.keys[d.intent], outcomeOf(out, err))
	}
	ch.redeliver(d.intent)
}

// pause stops the incarnation like SIGSTOP would: no RPC leaves it
// (heartbeats included) and the calling goroutine sleeps, past the TTL.
func (ch *chaos) pause(inc *incarnation) {
	inc.conn.Stop()
	time.Sleep(sessionTTL + 1500*time.Millisecond)
	inc.conn.Cont()
}

func (ch *chaos) task(inc *incarnation, i int) client.Task {
	return client.Task{
		Key:            ch.keys[i],
		Register:       &intentv1.RegisterRequest{Params: ch.terms[i]},
		WaitInProgress: 10 * time.Second,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			ch.executes.Add(1)
			f := faultNone
			if p := ch.plan[i]; p < faultLostAcquire && ch.taken[i].CompareAndSwap(false, true) {
				f = p
			}
			if f != faultNone && f != faultCutReply {
				ch.fired[f].Add(1)
			}
			if f == faultPauseBefore {
				ch.pause(inc)
				ctx = context.WithoutCancel(ctx) // the request was on its way
			}
			res, err := ch.shop.executeOrder(ctx, att)
			if err != nil {
				return nil, err
			}
			switch f {
			case faultCrash:
				inc.conn.Kill()
				return nil, errCrashed
			case faultSessionClosed:
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := inc.sess.Close(cctx)
				cancel()
				inc.conn.Kill()
				if err != nil {
					return nil, fmt.Errorf("%w (its session close failed: %v)", errCrashed, err)
				}
				return nil, errCrashed
			case faultPauseAfter:
				ch.pause(inc)
			}
			return res, nil
		},
		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			ch.reconciles.Add(1)
			return ch.shop.reconcileOrder(ctx, att)
		},
	}
}

// loseAnswer decides whether intentd's answer to a call is lost: the
// first Acquire or Complete of an intent planned for it.
func (ch *chaos) loseAnswer(method string, req any) bool {
	var key string
	var f fault
	switch r := req.(type) {
	case *intentv1.AcquireRequest:
		key, f = r.GetKey(), faultLostAcquire
	case *intentv1.CompleteRequest:
		key, f = r.GetKey(), faultLostComplete
	default:
		return false
	}
	i, ok := ch.index[key]
	if !ok || ch.plan[i] != f || !ch.taken[i].CompareAndSwap(false, true) {
		return false
	}
	ch.fired[f].Add(1)
	return true
}

// reportStuck fails the test with the intents that did not settle.
func (ch *chaos) reportStuck(remaining int) {
	ch.t.Errorf("chaos: %d of %d intents not COMPLETED before the deadline", remaining, ch.cfg.intents)
	shown := 0
	for i, k := range ch.keys {
		if ch.settled(i) || shown >= 10 {
			continue
		}
		shown++
		in := get(ch.t, ch.w.c, k)
		ch.t.Errorf("intent %d %s (fault %s): %s\n%s", i, k, faultNames[ch.plan[i]], in.GetState(), story(in))
	}
}

// verify checks the world at the end: every intent COMPLETED with the one
// order the merchant holds for it, and nothing else at the merchant.
func (ch *chaos) verify(took time.Duration) {
	t := ch.t
	orders := ch.w.merchant.Orders()
	byKey := map[string]fakes.Order{}
	for _, o := range orders {
		byKey[o.Key] = o
	}
	reviewed, wrong, completed := 0, 0, 0
	for i, k := range ch.keys {
		in := get(t, ch.w.c, k)
		if in.GetState() == intentv1.State_STATE_COMPLETED {
			completed++
		}
		o, ok := byKey[intent.OperationKey(k, "create-order")]
		completes := 0
		for _, e := range entries(in, intentv1.HistoryEntry_KIND_COMPLETED) {
			if e.GetAccepted() {
				completes++
			}
		}
		if ch.review[i] {
			reviewed++
		}
		got := in.GetResult().GetExternalRefs()[refOrder]
		if in.GetState() != intentv1.State_STATE_COMPLETED || !ok || got != o.ID || o.Reference != k || completes != 1 || ch.completed[i] != got {
			wrong++
			if wrong <= 10 {
				t.Errorf("intent %d %s (fault %s): %s with order %q (Run saw %q); merchant holds %+v (found %t); accepted completions %d\n%s",
					i, k, faultNames[ch.plan[i]], in.GetState(), got, ch.completed[i], o, ok, completes, story(in))
			}
		}
	}
	dups := ch.w.merchant.Duplicates()
	t.Logf("chaos: intents=%d completed=%d needs-review=%d orders=%d duplicates=%d merchant-requests=%d mismatched=%d took=%v",
		ch.cfg.intents, completed, reviewed, len(orders), dups, ch.w.merchant.Requests(), wrong, took.Round(time.Millisecond))
	if len(orders) != ch.cfg.intents || dups != 0 {
		t.Errorf("merchant holds %d orders with %d duplicates, want %d and 0", len(orders), dups, ch.cfg.intents)
	}
	if reviewed != 0 {
		t.Errorf("%d intents went to NEEDS_REVIEW: every fault here is one reconciliation can decide", reviewed)
	}
}
