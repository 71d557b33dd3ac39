package reliability

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// RefOrder is the external ref under which a result names its order.
const RefOrder = "order"

// LoadConfig shapes the workload of a run.
type LoadConfig struct {
	// Name prefixes every intent key.
	Name string
	// Workers is the number of worker goroutines (default 6).
	Workers int
	// Every is how often the approver registers a new intent (default
	// 25ms); Max bounds how many (0: until StopIssuing; negative: none,
	// the test hands the workers keys with Adopt).
	Every time.Duration
	Max   int
	// Redeliver is the percentage of intents the queue delivers twice, so
	// that workers race for them.
	Redeliver int
	// TTL is the workers' session TTL (default 3s).
	TTL time.Duration
	// WaitInProgress bounds how long a worker waits on another's lease
	// (default 3s).
	WaitInProgress time.Duration
	// Readers is the number of goroutines reading random intents (default 1).
	Readers int
	// Seed makes the redeliveries and reads repeatable.
	Seed uint64
	// CallTimeout bounds each attempt of a client call (default 5s: longer
	// than intentd's own operation timeout, so that its UNAVAILABLE arrives
	// first).
	CallTimeout time.Duration
	// ExecuteDelay is how long Execute takes after the merchant answered:
	// a slow side effect, which widens the window between effect and
	// report.
	ExecuteDelay time.Duration
	// Executed, if set, is called when worker i's order was placed, before
	// ExecuteDelay: a test can strike between effect and report.
	Executed func(worker int, key string)
	// Dial returns the connection of worker i, or of the approver and
	// readers for i < 0. Load closes it.
	Dial func(i int) (*grpc.ClientConn, error)
	// Merchant is the merchant's base URL.
	Merchant string
	// SelfRegister makes every worker register the intents it runs
	// (register → acquire → act → complete), back to back as fast as
	// intentd answers, instead of the approver registering one every
	// Every: a closed loop whose rate is intentd's throughput. Redeliver
	// still hands some intents to a second worker.
	SelfRegister bool
}

// LoadStats counts what the workers saw.
type LoadStats struct {
	Registered, Runs, Completed, Executed, Replayed int64
	InProgress, LeftUnknown, Superseded, RunErrors  int64
	Sessions, SessionsLost                          int64
}

// Load is a running workload: an approver registering intents, workers
// carrying them out with client.Session.Run against the merchant, readers.
// Every call goes through the Recorder.
type Load struct {
	cfg LoadConfig
	rec *Recorder

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   chan struct{} // closed by StopIssuing
	once   sync.Once
	// approved is closed when the approver has stopped: no key is added
	// after it.
	approved chan struct{}

	queue chan string
	// issued counts the intents registered or being registered: the next
	// one's number.
	issued atomic.Int64
	// issuing is held shared by a self-registering worker from its check
	// that issuing goes on until the key is recorded; Drain takes it to
	// know that no registration is still under way.
	issuing sync.RWMutex
	conns   []*grpc.ClientConn
	// clientIDs are the recorder's ids of the workers' connections.
	clientIDs []int

	mu       sync.Mutex
	keys     []string
	settled  map[string]string // key → order id of its COMPLETED result
	problems []string
	rng      *rand.Rand
	// completedAt holds when each intent was first seen COMPLETED, and
	// cycles every Run of a worker goroutine, as offsets in the history.
	completedAt []time.Duration
	cycles      []Cycle

	stats struct {
		registered, runs, completed, executed, replayed atomic.Int64
		inProgress, leftUnknown, superseded, runErrors  atomic.Int64
		sessions, sessionsLost                          atomic.Int64
	}
}

// StartLoad starts the approver, workers and readers.
func StartLoad(rec *Recorder, cfg LoadConfig) (*Load, error) {
	if cfg.Workers == 0 {
		cfg.Workers = 6
	}
	if cfg.Every == 0 {
		cfg.Every = 25 * time.Millisecond
	}
	if cfg.TTL == 0 {
		cfg.TTL = 3 * time.Second
	}
	if cfg.WaitInProgress == 0 {
		cfg.WaitInProgress = 3 * time.Second
	}
	if cfg.Readers == 0 {
		cfg.Readers = 1
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{
		cfg: cfg, rec: rec, ctx: ctx, cancel: cancel, stop: make(chan struct{}), approved: make(chan struct{}),
		queue: make(chan string, 100000), settled: map[string]string{},
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
	}
	conns := make([]*grpc.ClientConn, 0, cfg.Workers+1)
	for i := -1; i < cfg.Workers; i++ {
		cc, err := cfg.Dial(i)
		if err != nil {
			cancel()
			for _, c := range conns {
				_ = c.Close()
			}
			return nil, err
		}
		conns = append(conns, cc)
	}
	// Clients in a fixed order: the recorder numbers them approver,
	// readers, workers.
	approver, _ := l.client(conns[0])
	readers := make([]*client.Client, cfg.Readers)
	for r := range readers {
		readers[r], _ = l.client(conns[0])
	}
	workers := make([]*client.Client, cfg.Workers)
	l.clientIDs = make([]int, cfg.Workers)
	for i := range workers {
		workers[i], l.clientIDs[i] = l.client(conns[i+1])
	}
	l.wg.Go(func() {
		defer close(l.approved)
		l.approve(approver)
	})
	for r, c := range readers {
		l.wg.Go(func() { l.read(c, uint64(r)) })
	}
	for i, c := range workers {
		l.wg.Go(func() { l.work(i, c) })
	}
	l.conns = conns
	return l, nil
}

// client is a recorded client on cc with the options every caller here
// uses: attempts of cfg.CallTimeout, short backoff, reports that keep
// trying; and its recorder id.
func (l *Load) client(cc *grpc.ClientConn) (*client.Client, int) {
	conn, id := l.rec.Conn(cc)
	return workerClient(conn, l.cfg.CallTimeout), id
}

// workerClient is a client on conn with the options of every caller here,
// in this process or in a worker process: attempts of callTimeout, short
// backoff, reports that keep trying.
func workerClient(conn grpc.ClientConnInterface, callTimeout time.Duration) *client.Client {
	return client.New(conn,
		client.WithCallTimeout(callTimeout),
		client.WithBackoff(20*time.Millisecond, 400*time.Millisecond),
		client.WithReportTimeout(30*time.Second))
}

// ClientID is the recorder's id of worker i's connection.
func (l *Load) ClientID(i int) int { return l.clientIDs[i] }

// StopIssuing stops registering new intents.
func (l *Load) StopIssuing() { l.once.Do(func() { close(l.stop) }) }

// Stop ends every goroutine, waits for them and closes the connections.
func (l *Load) Stop() {
	l.StopIssuing()
	l.cancel()
	l.wg.Wait()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// Keys returns the intents registered so far, in order.
func (l *Load) Keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// Unsettled returns the registered intents not yet seen COMPLETED.
func (l *Load) Unsettled() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, k := range l.keys {
		if _, ok := l.settled[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// Drain stops issuing and waits until every registered intent completed,
// or within passed; it returns the ones that did not.
func (l *Load) Drain(within time.Duration) []string {
	l.StopIssuing()
	deadline := time.Now().Add(within)
	select {
	case <-l.approved:
	case <-time.After(within):
		l.cancel() // an approver stuck on a registration gives up
		<-l.approved
	}
	l.issuing.Lock() // self-registering workers have recorded their last key
	l.issuing.Unlock()
	for {
		left := l.Unsettled()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Problems returns what the workers found wrong on the way (a COMPLETED
// result that changed between two Runs).
func (l *Load) Problems() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.problems...)
}

// Stats returns the counters so far.
func (l *Load) Stats() LoadStats {
	return LoadStats{
		Registered: l.stats.registered.Load(), Runs: l.stats.runs.Load(), Completed: l.stats.completed.Load(),
		Executed: l.stats.executed.Load(), Replayed: l.stats.replayed.Load(), InProgress: l.stats.inProgress.Load(),
		LeftUnknown: l.stats.leftUnknown.Load(), Superseded: l.stats.superseded.Load(), RunErrors: l.stats.runErrors.Load(),
		Sessions: l.stats.sessions.Load(), SessionsLost: l.stats.sessionsLost.Load(),
	}
}

// approve registers a new intent every cfg.Every until StopIssuing, each
// until intentd acknowledges it, and hands it to the workers. With
// SelfRegister the workers register, and approve returns at once.
func (l *Load) approve(c *client.Client) {
	if l.cfg.SelfRegister {
		return
	}
	tick := time.NewTicker(l.cfg.Every)
	defer tick.Stop()
	for n := 0; l.cfg.Max == 0 || n < l.cfg.Max; n++ {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
		key, ok := l.register(c)
		if !ok {
			return
		}
		l.queue <- key
	}
}

// register registers the next intent, trying until intentd acknowledges
// it, and records its key; false when the load stopped first. Redeliver
// percent of the intents are delivered to the workers (again) shortly
// after.
func (l *Load) register(c *client.Client) (string, bool) {
	n := int(l.issued.Add(1) - 1)
	key := fmt.Sprintf("%s-%05d", l.cfg.Name, n)
	for {
		ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
		_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: params(n)})
		cancel()
		if err == nil {
			break
		}
		if l.ctx.Err() != nil {
			return "", false
		}
		time.Sleep(100 * time.Millisecond)
	}
	l.stats.registered.Add(1)
	l.mu.Lock()
	l.keys = append(l.keys, key)
	twice := l.rng.IntN(100) < l.cfg.Redeliver
	l.mu.Unlock()
	if twice {
		time.AfterFunc(time.Duration(5+n%20)*time.Millisecond, func() { l.queue <- key })
	}
	return key, true
}

// registerOwn is register for a self-registering worker while issuing
// goes on; false once StopIssuing was called or the load stopped.
func (l *Load) registerOwn(c *client.Client) (string, bool) {
	l.issuing.RLock()
	defer l.issuing.RUnlock()
	select {
	case <-l.stop:
		return "", false
	default:
	}
	return l.register(c)
}

// read gets a random registered intent every 30ms.
func (l *Load) read(c *client.Client, seed uint64) {
	rng := rand.New(rand.NewPCG(l.cfg.Seed, seed))
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(30 * time.Millisecond):
		}
		l.mu.Lock()
		n := len(l.keys)
		var key string
		if n > 0 {
			key = l.keys[rng.IntN(n)]
		}
		l.mu.Unlock()
		if key == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		_, _ = c.Get(ctx, &intentv1.GetRequest{Key: key})
		cancel()
	}
}

// work is one worker: a session (a new one whenever it is lost), and Run
// for every delivery until the load stops.
func (l *Load) work(id int, c *client.Client) {
	shop := &harness.Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, Merchant: l.cfg.Merchant}
	defer shop.HTTP.CloseIdleConnections()
	life := 0
	for l.ctx.Err() == nil {
		sess := l.openSession(c, fmt.Sprintf("%s-w%d-life%d", l.cfg.Name, id, life))
		if sess == nil {
			return
		}
		life++
		l.serve(id, c, sess, shop)
		if sess.Err() != nil && l.ctx.Err() == nil {
			l.stats.sessionsLost.Add(1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = sess.Close(ctx)
		cancel()
	}
}

// openSession opens a session, trying until the load stops.
func (l *Load) openSession(c *client.Client, worker string) *client.Session {
	for {
		ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
		sess, err := c.OpenSession(ctx, worker, l.cfg.TTL)
		cancel()
		if err == nil {
			l.stats.sessions.Add(1)
			return sess
		}
		select {
		case <-l.ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serve runs deliveries on sess until the session is lost or the load
// stops; with SelfRegister, when no delivery is waiting, an intent it
// registers itself on c.
func (l *Load) serve(id int, c *client.Client, sess *client.Session, shop *harness.Shop) {
	for {
		key, start, ok := l.next(c, sess)
		if !ok {
			return
		}
		if l.isSettled(key) {
			continue // a late second delivery
		}
		ctx, cancel := context.WithTimeout(l.ctx, 20*time.Second)
		out, err := sess.Run(ctx, l.task(id, key, shop))
		cancel()
		l.account(reportRun(key, out, err))
		l.mu.Lock()
		l.cycles = append(l.cycles, Cycle{Start: start, End: l.rec.Since()})
		l.mu.Unlock()
	}
}

// next returns the next intent a worker runs and when its cycle began: a
// delivery, or with SelfRegister, when none is waiting, one the worker
// registers (the cycle then begins with the registration). false when the
// session is lost or the load stops.
func (l *Load) next(c *client.Client, sess *client.Session) (string, time.Duration, bool) {
	// A self-registering worker registers its own only when nothing else
	// is to be done: the load has not stopped, the session lives and no
	// key is queued.
	if l.cfg.SelfRegister && l.ctx.Err() == nil && !ended(sess.Done()) && len(l.queue) == 0 {
		start := l.rec.Since()
		if key, ok := l.registerOwn(c); ok {
			return key, start, true
		}
	}
	select {
	case <-l.ctx.Done():
		return "", 0, false
	case <-sess.Done():
		return "", 0, false
	case key := <-l.queue:
		return key, l.rec.Since(), true
	}
}

// ended reports whether done is closed, without waiting.
func ended(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// What one Run of a delivery came to (runReport.Verdict).
const (
	verdictCompleted   = "completed"
	verdictInProgress  = "in-progress"
	verdictLeftUnknown = "left-unknown"
	verdictSuperseded  = "superseded"
	verdictError       = "error"
)

// runReport is what one Run of a delivery came to, as the load counts it.
// A worker process sends it to the parent as JSON.
type runReport struct {
	Key     string `json:"key"`
	Verdict string `json:"verdict"`
	// Executed: the Run called Execute; Order is the COMPLETED result's.
	Executed bool   `json:"executed,omitempty"`
	Order    string `json:"order,omitempty"`
	Err      string `json:"err,omitempty"`
}

// reportRun sums up what Run returned for key.
func reportRun(key string, out *client.Outcome, err error) runReport {
	r := runReport{Key: key, Verdict: verdictError}
	if err != nil {
		r.Err = err.Error()
	}
	switch {
	case err == nil && out.Outcome == intentv1.Outcome_OUTCOME_COMPLETED:
		r.Verdict, r.Executed, r.Order = verdictCompleted, out.Executed, out.Intent.GetResult().GetExternalRefs()[RefOrder]
	case err == nil && out.Outcome == intentv1.Outcome_OUTCOME_IN_PROGRESS:
		r.Verdict = verdictInProgress
	case out != nil && out.Intent.GetState() == intentv1.State_STATE_UNKNOWN:
		r.Verdict = verdictLeftUnknown
	case errors.Is(err, client.ErrStaleToken) || (out != nil && out.Superseded):
		r.Verdict = verdictSuperseded
	}
	return r
}

// account counts one Run, whoever ran it, and settles its key on a
// COMPLETED result or delivers it again.
func (l *Load) account(r runReport) {
	l.stats.runs.Add(1)
	switch r.Verdict {
	case verdictCompleted:
		l.stats.completed.Add(1)
		if r.Executed {
			l.stats.executed.Add(1)
		} else {
			l.stats.replayed.Add(1)
		}
		l.settle(r.Key, r.Order)
		return
	case verdictInProgress:
		l.stats.inProgress.Add(1)
	case verdictLeftUnknown:
		l.stats.leftUnknown.Add(1)
	case verdictSuperseded:
		l.stats.superseded.Add(1)
	default:
		l.stats.runErrors.Add(1)
	}
	l.requeue(r.Key)
}

// Deliver hands key to the workers once more, as a queue redelivering a
// message would.
func (l *Load) Deliver(key string) { l.queue <- key }

// requeue delivers key again shortly, unless the load stopped.
func (l *Load) requeue(key string) {
	time.AfterFunc(30*time.Millisecond, func() {
		if l.ctx.Err() == nil && !l.isSettled(key) {
			l.queue <- key
		}
	})
}

func (l *Load) isSettled(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.settled[key]
	return ok
}

// settle records that key was seen COMPLETED with order; a second sight
// with another order is a changed result.
func (l *Load) settle(key, order string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok := l.settled[key]; ok {
		if prev != order {
			l.problems = append(l.problems, fmt.Sprintf("intent %s completed with order %s, later replayed with %s", key, prev, order))
		}
		return
	}
	l.settled[key] = order
	l.completedAt = append(l.completedAt, l.rec.Since())
}

// params are the approved terms of the n-th intent.
func params(n int) *structpb.Struct {
	p, err := structpb.NewStruct(map[string]any{"item": fmt.Sprintf("item-%d", n%23), "quantity": 1 + n%4, "merchant": "M"})
	if err != nil {
		panic(err)
	}
	return p
}

// task is orderTask for worker worker of this load: after the merchant
// answered it calls cfg.Executed, then takes cfg.ExecuteDelay (cut short
// when the lease is lost: the report is then UNKNOWN).
func (l *Load) task(worker int, key string, shop *harness.Shop) client.Task {
	return orderTask(key, shop, l.cfg.WaitInProgress, func(ctx context.Context, att *client.Attempt) error {
		if l.cfg.Executed != nil {
			l.cfg.Executed(worker, att.Key)
		}
		if d := l.cfg.ExecuteDelay; d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err() // the lease was lost: report UNKNOWN
			case <-time.After(d):
			}
		}
		return nil
	})
}

// orderTask places the intent's order under its operation key, and
// reconciles by asking the merchant for that key. afterEffect, if set,
// runs once the merchant answered, before the result is reported; its
// error is Execute's.
func orderTask(key string, shop *harness.Shop, waitInProgress time.Duration, afterEffect func(context.Context, *client.Attempt) error) client.Task {
	return client.Task{
		Key:            key,
		WaitInProgress: waitInProgress,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			o, err := shop.CreateOrder(ctx, att.OperationKey("create-order"), fakes.OrderRequest{Reference: att.Key})
			if err != nil {
				return nil, err
			}
			if afterEffect != nil {
				if err := afterEffect(ctx, att); err != nil {
					return nil, err
				}
			}
			return &intentv1.Result{ExternalRefs: map[string]string{RefOrder: o.ID}}, nil
		},
		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			o, found, err := shop.FindOrder(ctx, att.OperationKey("create-order"))
			switch {
			case err == nil && !found:
				return client.Absent("the merchant has no order under " + att.OperationKey("create-order")), nil
			case err != nil:
				return client.Evidence{}, err
			}
			return client.Found(&intentv1.Result{ExternalRefs: map[string]string{RefOrder: o.ID}}), nil
		},
	}
}

// Adopt hands keys registered elsewhere (before a restore) to the workers
// as if this load had registered them.
func (l *Load) Adopt(keys []string) {
	l.mu.Lock()
	l.keys = append(l.keys, keys...)
	l.mu.Unlock()
	for _, k := range keys {
		l.queue <- k
	}
}

// Settled returns each intent seen COMPLETED with its order.
func (l *Load) Settled() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.settled)
}
