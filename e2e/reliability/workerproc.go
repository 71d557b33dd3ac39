package reliability

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/intentd/intentd/e2e/harness"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// WorkerProcs are worker processes serving a Load's deliveries next to its
// worker goroutines: the test binary re-executed (TestWorkerProcess), each
// with a session of its own and the same task, so that a worker can be
// SIGKILLed or SIGSTOPped as a real one is. Every gRPC call a process
// makes is written to its stdout as it starts and as it ends, and recorded
// in the parent's Recorder (see procCalls); a call the process never saw
// end is an unknown outcome. A key a process was running when it died is
// delivered again, for a live worker to reconcile.
type WorkerProcs struct {
	// Procs are the processes, p0, p1, ...
	Procs []*WorkerProc

	load *Load
	rec  *Recorder
	spec workerSpec

	mu     sync.Mutex
	closed bool
	feeds  sync.WaitGroup
}

// StartWorkerProcs starts n worker processes taking deliveries from load,
// dialing every replica. They stop when the load stops (their sessions
// closed, like the goroutines'), and are killed when the test ends at the
// latest.
func (e *Env) StartWorkerProcs(load *Load, n int) *WorkerProcs {
	e.T.Helper()
	ws := &WorkerProcs{load: load, rec: e.Rec, spec: workerSpec{
		Name: load.cfg.Name, Addrs: e.Addrs(), Merchant: e.MerchantURL,
		TTL: load.cfg.TTL, WaitInProgress: load.cfg.WaitInProgress, CallTimeout: load.cfg.CallTimeout,
	}}
	e.T.Cleanup(ws.kill)
	for i := range n {
		w := &WorkerProc{Name: fmt.Sprintf("p%d", i), ws: ws, logs: &testlog.Lines{}}
		ws.Procs = append(ws.Procs, w)
		if err := w.Start(); err != nil {
			e.T.Fatal(err)
		}
	}
	load.wg.Go(func() { // Stop waits for it: the processes' calls are all in the history then
		<-load.ctx.Done()
		ws.shutdown()
	})
	return ws
}

// shutdown closes every process's stdin, so that it ends its Run and its
// session and exits, and waits for them (killing one that takes over 20s)
// and for their feeders.
func (ws *WorkerProcs) shutdown() {
	ws.mu.Lock()
	ws.closed = true
	ws.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws.Procs {
		life := w.current()
		if life == nil {
			continue
		}
		wg.Go(func() {
			life.end(endClosed)
			_ = life.p.Signal(syscall.SIGCONT)
			life.closeStdin()
			select {
			case <-life.p.Exited():
			case <-time.After(20 * time.Second):
				life.end(endKilled)
				life.p.Kill()
			}
		})
	}
	wg.Wait()
	ws.feeds.Wait()
}

// kill kills whatever still runs (the test failed before the load
// stopped).
func (ws *WorkerProcs) kill() {
	ws.mu.Lock()
	ws.closed = true
	ws.mu.Unlock()
	for _, w := range ws.Procs {
		if life := w.current(); life != nil {
			life.end(endKilled)
			life.p.Kill()
		}
	}
	ws.feeds.Wait()
}

// problem reports what went wrong with a process as a problem of the
// load (Finish fails the test on it).
func (ws *WorkerProcs) problem(msg string) {
	ws.load.mu.Lock()
	defer ws.load.mu.Unlock()
	ws.load.problems = append(ws.load.problems, msg)
}

// Stats sums up the processes' work.
func (ws *WorkerProcs) Stats() WorkerProcStats {
	var s WorkerProcStats
	for _, w := range ws.Procs {
		p := w.Stats()
		s.Lives += p.Lives
		s.Sessions += p.Sessions
		s.Calls += p.Calls
		s.CutShort += p.CutShort
		s.Runs += p.Runs
		s.Effects += p.Effects
		s.Redelivered += p.Redelivered
	}
	return s
}

// WorkerProcStats counts what the worker processes did.
type WorkerProcStats struct {
	// Lives counts processes started (restarts included), Sessions the
	// sessions they opened.
	Lives, Sessions int
	// Calls counts the calls recorded from them; CutShort those a process
	// died in (recorded as unknown outcomes).
	Calls, CutShort int
	// Runs counts Runs that returned, Effects orders placed, Redelivered
	// keys given back to the queue because their process died.
	Runs, Effects, Redelivered int
}

func (s WorkerProcStats) String() string {
	return fmt.Sprintf("lives=%d sessions=%d calls=%d cut-short=%d runs=%d effects=%d redelivered=%d",
		s.Lives, s.Sessions, s.Calls, s.CutShort, s.Runs, s.Effects, s.Redelivered)
}

// WorkerProc is one worker process, across its restarts (lives).
type WorkerProc struct {
	// Name is "p<i>".
	Name string

	ws   *WorkerProcs
	logs *testlog.Lines

	mu         sync.Mutex
	life       *procLife
	hold       chan Effect // armed by HoldNextEffect
	holdAnswer chan Effect // armed by HoldNextAnswer
	// clients are the recorder ids of its lives, in order.
	clients []int
	// The counters of WorkerProcStats.
	sessions, calls, cutShort, runs, effects, redelivered int
}

// Effect is an order a worker process placed and has not reported yet:
// the process waits until it is released.
type Effect struct {
	Key string
	// Token is the lease it holds; Client the recorder id of its calls.
	Token  uint64
	Client int
	// At is when the process said so.
	At time.Duration
}

// How a process's life ended, when the parent ended it.
const (
	endKilled = 1 + iota // Kill: SIGKILL
	endClosed            // shutdown: stdin closed, the process exits by itself
)

// procLife is one run of a worker process.
type procLife struct {
	p      *harness.Process
	client int
	// results gets what each Run returned, for the feeder.
	results chan runReport

	stdinMu sync.Mutex
	stdin   io.WriteCloser

	mu      sync.Mutex
	ending  int   // endKilled, endClosed, or 0: it died by itself
	waitErr error // set before p.Exited() is closed
}

func (l *procLife) end(how int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ending == 0 {
		l.ending = how
	}
}

// send writes one line to the process's stdin; a stopped process finds it
// when it continues.
func (l *procLife) send(line string) error {
	l.stdinMu.Lock()
	defer l.stdinMu.Unlock()
	_, err := io.WriteString(l.stdin, line+"\n")
	return err
}

func (l *procLife) closeStdin() {
	l.stdinMu.Lock()
	defer l.stdinMu.Unlock()
	_ = l.stdin.Close()
}

func (w *WorkerProc) current() *procLife {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.life
}

// Stats counts what the process did, over its lives.
func (w *WorkerProc) Stats() WorkerProcStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return WorkerProcStats{
		Lives: len(w.clients), Sessions: w.sessions, Calls: w.calls, CutShort: w.cutShort,
		Runs: w.runs, Effects: w.effects, Redelivered: w.redelivered,
	}
}

// ClientIDs are the recorder ids of the process's calls, one per life.
func (w *WorkerProc) ClientIDs() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.clients)
}

// Logs returns the last lines the process wrote besides its reports (its
// stderr and the test binary's own output), for failure messages.
func (w *WorkerProc) Logs() string { return w.logs.Tail(40) }

// Start starts a new life of the process (a fresh session, a fresh client
// id), taking deliveries from the load.
func (w *WorkerProc) Start() error {
	w.ws.mu.Lock()
	closed := w.ws.closed
	w.ws.mu.Unlock()
	if closed {
		return fmt.Errorf("reliability: worker process %s: the load stopped", w.Name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.life != nil && w.life.p.Running() {
		return fmt.Errorf("reliability: worker process %s is running", w.Name)
	}
	spec := w.ws.spec
	spec.Name = fmt.Sprintf("%s-%s-run%d", spec.Name, w.Name, len(w.clients))
	cmd, err := harness.ChildCommand(spec, 30*time.Minute)
	if err != nil {
		return err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	life := &procLife{
		client:  w.ws.rec.Client(),
		results: make(chan runReport, 1),
		stdin:   stdin,
	}
	var cut int // calls the process died in, counted once its stdout ended
	life.p, err = harness.StartProcess(cmd, harness.ProcessConfig{
		Name:   "worker process " + w.Name,
		Logs:   w.logs,
		Stdout: func(stdout io.Reader) { cut = w.read(life, stdout) },
		OnExit: func(err error) { w.exit(life, cut, err) },
	})
	if err != nil {
		return fmt.Errorf("reliability: start worker process %s: %w", w.Name, err)
	}
	w.life = life
	w.clients = append(w.clients, life.client)
	w.ws.feeds.Go(func() { w.feed(life) })
	return nil
}

// Kill sends SIGKILL (which also ends a stopped process) and waits until
// everything it wrote was read: its calls without an end are recorded as
// unknown outcomes, and the key it was running is delivered again.
func (w *WorkerProc) Kill() {
	if life := w.current(); life != nil {
		life.end(endKilled)
		life.p.Kill()
	}
}

// Restart kills the process and starts it again.
func (w *WorkerProc) Restart() error {
	w.Kill()
	return w.Start()
}

// Stop pauses the process (SIGSTOP): it sends nothing, heartbeats
// included, until Cont.
func (w *WorkerProc) Stop() error { return w.signal(syscall.SIGSTOP) }

// Cont continues a stopped process (SIGCONT).
func (w *WorkerProc) Cont() error { return w.signal(syscall.SIGCONT) }

func (w *WorkerProc) signal(sig syscall.Signal) error {
	life := w.current()
	if life == nil {
		return fmt.Errorf("reliability: worker process %s never started", w.Name)
	}
	return life.p.Signal(sig)
}

// HoldNextEffect makes the process wait, after the next order it places,
// until Release (or its end): the effect arrives on the channel. The
// parent strikes there, between effect and report.
func (w *WorkerProc) HoldNextEffect() <-chan Effect {
	ch := make(chan Effect, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hold = ch
	return ch
}

// HoldNextAnswer makes the process keep to itself the next OK answer of a
// call of method ("Complete") and wait for its end: the channel gets the
// call's key and token. Killed there, the process leaves a call that took
// effect at intentd and that nobody saw end: an unknown outcome in the
// history.
func (w *WorkerProc) HoldNextAnswer(method string) (<-chan Effect, error) {
	life := w.current()
	if life == nil {
		return nil, fmt.Errorf("reliability: worker process %s never started", w.Name)
	}
	ch := make(chan Effect, 1)
	w.mu.Lock()
	w.holdAnswer = ch
	w.mu.Unlock()
	return ch, life.send("hold-answer " + method)
}

// Release lets the process report the effect of key, which it holds.
func (w *WorkerProc) Release(key string) error {
	life := w.current()
	if life == nil {
		return fmt.Errorf("reliability: worker process %s never started", w.Name)
	}
	return life.send("go " + key)
}

// read reads the process's stdout until it exits, records its calls and
// hands effects and results on; it returns how many calls the process
// never saw end (recorded as unknown outcomes).
func (w *WorkerProc) read(life *procLife, stdout io.Reader) int {
	calls := &procCalls{rec: w.ws.rec, client: life.client, pending: map[int64]Call{}}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var l workerLine
		if b := sc.Bytes(); len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &l) != nil {
			w.logs.Add(sc.Text())
			continue
		}
		switch l.Ev {
		case lineStart, lineEnd:
			if calls.line(l) {
				w.mu.Lock()
				w.calls++
				w.mu.Unlock()
			}
		case lineSession:
			w.logs.Add("session " + l.Session)
			w.mu.Lock()
			w.sessions++
			w.mu.Unlock()
		case lineEffect:
			w.effect(life, Effect{Key: l.Key, Token: l.Token, Client: life.client, At: w.ws.rec.At(time.Unix(0, l.At))})
		case lineAnswerHeld:
			w.mu.Lock()
			held := w.holdAnswer
			w.holdAnswer = nil
			w.mu.Unlock()
			if held != nil {
				held <- Effect{Key: l.Key, Token: l.Token, Client: life.client, At: w.ws.rec.At(time.Unix(0, l.At))}
			}
		case lineResult:
			if l.Run == nil {
				continue
			}
			w.mu.Lock()
			w.runs++
			w.mu.Unlock()
			select {
			case life.results <- *l.Run:
			default: // nobody waits for it: count it all the same
				w.ws.load.account(*l.Run)
			}
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	return calls.cut(w.ws.rec.Since())
}

// exit counts the calls the process died in and reports an exit the parent
// did not cause as a problem of the load.
func (w *WorkerProc) exit(life *procLife, cut int, err error) {
	life.mu.Lock()
	life.waitErr = err
	ending := life.ending
	life.mu.Unlock()
	w.mu.Lock()
	w.calls += cut
	w.cutShort += cut
	w.mu.Unlock()
	switch {
	case ending == 0:
		w.ws.problem(fmt.Sprintf("worker process %s exited by itself (%v); its last lines:\n%s", w.Name, err, w.Logs()))
	case ending == endClosed && err != nil:
		w.ws.problem(fmt.Sprintf("worker process %s ended %v after its stdin closed; its last lines:\n%s", w.Name, err, w.Logs()))
	}
}

// effect holds the effect if HoldNextEffect asked for it, else lets the
// process report it at once.
func (w *WorkerProc) effect(life *procLife, ef Effect) {
	w.mu.Lock()
	w.effects++
	hold := w.hold
	w.hold = nil
	w.mu.Unlock()
	if hold != nil {
		hold <- ef
		return
	}
	_ = life.send("go " + ef.Key)
}

// feed hands the process one delivery at a time from the load's queue and
// accounts for what its Run returned, as a worker goroutine does; when the
// process dies first, the key goes back to the queue for a live worker.
func (w *WorkerProc) feed(life *procLife) {
	l := w.ws.load
	for {
		var key string
		select {
		case <-l.ctx.Done():
			return
		case <-life.p.Exited():
			return
		case key = <-l.queue:
		}
		if l.isSettled(key) {
			continue // a late second delivery
		}
		if err := life.send("run " + key); err != nil {
			w.giveBack(key)
			return
		}
		select {
		case r := <-life.results:
			l.account(r)
		case <-life.p.Exited():
			select {
			case r := <-life.results: // it answered just before it went
				l.account(r)
			default:
				w.giveBack(key)
			}
			return
		}
	}
}

// giveBack delivers key again: the process that had it died.
func (w *WorkerProc) giveBack(key string) {
	w.mu.Lock()
	w.redelivered++
	w.mu.Unlock()
	w.ws.load.requeue(key)
}

// procCalls turns one worker process life's start and end lines into
// Calls in the parent's Recorder, under the life's client id. The times
// are the process's wall clock, placed in the history with Recorder.At:
// the same machine's clock as the parent's.
type procCalls struct {
	rec     *Recorder
	client  int
	pending map[int64]Call // started, not ended
}

// reasonProcessEnded is the Reason of a call the process died in.
const reasonProcessEnded = "WORKER_PROCESS_ENDED"

// line takes a start or an end line; it reports whether a call was
// recorded.
func (p *procCalls) line(l workerLine) bool {
	if l.Call == nil {
		return false
	}
	c := *l.Call
	c.Client = p.client
	at := p.rec.At(time.Unix(0, l.At))
	switch l.Ev {
	case lineStart:
		c.Start = at
		p.pending[l.ID] = c
		return false
	case lineEnd:
		start, ok := p.pending[l.ID]
		if !ok {
			return false
		}
		delete(p.pending, l.ID)
		c.Start, c.End = start.Start, at
		p.rec.Add(c)
		return true
	}
	return false
}

// cut records every call still pending when the process ended (at end) as
// what its start line said: an unknown outcome, which may or may not have
// taken effect. It returns how many there were.
func (p *procCalls) cut(end time.Duration) int {
	ids := slices.Sorted(maps.Keys(p.pending))
	for _, id := range ids {
		c := p.pending[id]
		c.End = max(end, c.Start)
		c.Reason, c.Out.Unknown = reasonProcessEnded, true
		p.rec.Add(c)
	}
	clear(p.pending)
	return len(ids)
}
