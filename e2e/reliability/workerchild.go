package reliability

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/harness"
)

// workerSpec is what a worker process needs from its parent.
type workerSpec struct {
	// Name names its sessions' worker.
	Name string
	// Addrs are intentd's addresses; Merchant the merchant's base URL.
	Addrs    []string
	Merchant string
	// TTL, WaitInProgress and CallTimeout are the Load's.
	TTL, WaitInProgress, CallTimeout time.Duration
}

// The lines a worker process writes on stdout, one JSON object each
// (workerLine.Ev); any other line (the test binary's own) is only logged.
const (
	// lineStart: a call is about to be sent; Call describes it as if its
	// answer were lost.
	lineStart = "start"
	// lineEnd: the call returned; Call describes it (describe).
	lineEnd = "end"
	// lineSession: a session was opened.
	lineSession = "session"
	// lineEffect: the merchant answered Execute's order, which is not
	// reported yet: the process waits for "go <key>" on stdin first.
	lineEffect = "effect"
	// lineResult: what Run returned for a key.
	lineResult = "result"
	// lineAnswerHeld: a call armed with "hold-answer <Method>" on stdin
	// was answered OK; the process keeps the answer to itself (no end
	// line) and waits for its end: the parent kills it there.
	lineAnswerHeld = "answer-held"
)

// workerLine is one line of a worker process's stdout.
type workerLine struct {
	Ev string `json:"ev"`
	// ID numbers a call within the process; At is when it started (start)
	// or ended (end), wall clock, in Unix nanoseconds.
	ID   int64 `json:"id,omitempty"`
	At   int64 `json:"at,omitempty"`
	Call *Call `json:"call,omitempty"`
	// Key and Token are an effect's lease; Session is a session's id.
	Key     string `json:"key,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	Session string `json:"session,omitempty"`
	// Run is a result.
	Run *runReport `json:"run,omitempty"`
}

// lineWriter writes whole lines, one write each, from any goroutine: a
// line written before the process is killed is in the pipe, whole.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *lineWriter) send(l workerLine) {
	b, err := json.Marshal(l)
	if err != nil {
		panic(err) // a Call always marshals
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.w.Write(append(b, '\n'))
}

// errAnswerLost describes a call whose answer never came: a start line's
// Call, which stands for the call if the process dies before it returns.
var errAnswerLost = status.Error(codes.Canceled, "reliability: the worker process ended before the answer")

// reportingConn writes every unary call through it to out, a line when it
// starts and a line when it ends, for the parent's Recorder. Streams
// (Watch) pass through: they change nothing.
type reportingConn struct {
	cc   grpc.ClientConnInterface
	out  *lineWriter
	next atomic.Int64
	// hold is the method whose next OK answer is held (lineAnswerHeld)
	// until stop is closed.
	hold atomic.Pointer[string]
	stop <-chan struct{}
}

func (c *reportingConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	id := c.next.Add(1)
	pending := describe(method, args, nil, errAnswerLost)
	c.out.send(workerLine{Ev: lineStart, ID: id, At: time.Now().UnixNano(), Call: &pending})
	err := c.cc.Invoke(ctx, method, args, reply, opts...)
	at := time.Now().UnixNano()
	call := describe(method, args, reply, err)
	if m := c.hold.Load(); err == nil && m != nil && *m == call.Method && c.hold.CompareAndSwap(m, nil) {
		c.out.send(workerLine{Ev: lineAnswerHeld, ID: id, At: at, Key: call.In.Key, Token: call.In.Token})
		<-c.stop
	}
	c.out.send(workerLine{Ev: lineEnd, ID: id, At: at, Call: &call})
	return err
}

func (c *reportingConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.cc.NewStream(ctx, desc, method, opts...)
}

// runWorkerProcess is a worker process: like a Load's worker goroutine it
// keeps a session (a new one whenever it is lost) and runs orderTask for
// every key the parent sends ("run <key>" on stdin), one at a time,
// writing what each Run returned. After the merchant answered an Execute
// it writes an effect line and waits for "go <key>" before it reports: the
// parent can stop or kill it in between. "hold-answer <Method>" makes it
// keep the next OK answer of that method to itself (lineAnswerHeld). It
// returns when stdin closes, after the Run in progress (whose context ends
// then) and closing its session.
func runWorkerProcess(spec workerSpec, stdin io.Reader, stdout io.Writer) error {
	out := &lineWriter{w: stdout}
	cc, err := harness.Dial(spec.Addrs...)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background()) // ends when stdin closes
	defer cancel()
	conn := &reportingConn{cc: cc, out: out, stop: ctx.Done()}
	c := workerClient(conn, spec.CallTimeout)
	shop := &harness.Shop{HTTP: &http.Client{Timeout: 5 * time.Second}, Merchant: spec.Merchant}
	defer shop.HTTP.CloseIdleConnections()

	runs, gates := make(chan string, 64), make(chan string, 64)
	go func() { // exits when stdin closes
		defer cancel()
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			verb, arg, _ := strings.Cut(sc.Text(), " ")
			switch verb {
			case "run":
				runs <- arg
			case "go":
				gates <- arg
			case "hold-answer":
				conn.hold.Store(&arg)
			}
		}
	}()
	afterEffect := func(_ context.Context, att *client.Attempt) error {
		out.send(workerLine{Ev: lineEffect, At: time.Now().UnixNano(), Key: att.Key, Token: uint64(att.Token)})
		// The answer is in hand: once let go, it is reported whatever
		// became of the lease meanwhile, as a worker that was stopped
		// here would.
		for {
			select {
			case k := <-gates:
				if k == att.Key {
					return nil
				}
			case <-ctx.Done():
				return errors.New("reliability: stdin closed before the parent let the report go")
			}
		}
	}

	for life := 0; ctx.Err() == nil; life++ {
		var sess *client.Session
		for sess == nil {
			octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
			sess, err = c.OpenSession(octx, fmt.Sprintf("%s-life%d", spec.Name, life), spec.TTL)
			ocancel()
			if err != nil {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
		out.send(workerLine{Ev: lineSession, Session: sess.ID()})
	serve:
		for {
			select {
			case <-ctx.Done():
				break serve
			case <-sess.Done():
				break serve
			case key := <-runs:
				rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
				o, err := sess.Run(rctx, orderTask(key, shop, spec.WaitInProgress, afterEffect))
				rcancel()
				r := reportRun(key, o, err)
				out.send(workerLine{Ev: lineResult, Key: key, Run: &r})
			}
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = sess.Close(cctx)
		ccancel()
	}
	return nil
}
