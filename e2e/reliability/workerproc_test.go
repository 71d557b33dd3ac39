package reliability

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// TestWorkerProcess is a worker process (runWorkerProcess), run by
// WorkerProcs as the test binary re-executed (harness.ChildCommand). It
// does nothing in the parent.
func TestWorkerProcess(t *testing.T) {
	var spec workerSpec
	if ok, err := harness.ChildSpec(&spec); !ok {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	if err := runWorkerProcess(spec, os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// TestWorkerCallLines checks the way a worker process's calls reach the
// parent's history: a call's start and end lines become one Call with the
// times placed in the history and the fields describe gave it; a call
// whose end never came (the process was killed) becomes an unknown
// outcome, open until the end of the history for porcupine.
func TestWorkerCallLines(t *testing.T) {
	rec := NewRecorder()
	_ = rec.Client() // the parent's own connections come first
	var buf bytes.Buffer
	out := &lineWriter{w: &buf}
	t0 := time.Now()

	acq := &intentv1.AcquireRequest{Key: "k1", SessionId: "s1", RequestId: "r1"}
	acqReply := &intentv1.AcquireResponse{Outcome: intentv1.Outcome_OUTCOME_EXECUTE, Lease: &intentv1.Lease{Token: 7, SessionId: "s1"}}
	started := describe("/intent.v1.IntentService/Acquire", acq, nil, errAnswerLost)
	ended := describe("/intent.v1.IntentService/Acquire", acq, acqReply, nil)
	out.send(workerLine{Ev: lineStart, ID: 1, At: t0.Add(10 * time.Millisecond).UnixNano(), Call: &started})
	cpl := &intentv1.CompleteRequest{Key: "k1", Token: 7, Result: &intentv1.Result{ExternalRefs: map[string]string{RefOrder: "SO-1"}}}
	pending := describe("/intent.v1.IntentService/Complete", cpl, nil, errAnswerLost)
	out.send(workerLine{Ev: lineEnd, ID: 1, At: t0.Add(30 * time.Millisecond).UnixNano(), Call: &ended})
	out.send(workerLine{Ev: lineStart, ID: 2, At: t0.Add(40 * time.Millisecond).UnixNano(), Call: &pending})
	stale := describe("/intent.v1.IntentService/Heartbeat", &intentv1.HeartbeatRequest{SessionId: "s1"}, nil, status.Error(codes.Unavailable, "down"))
	out.send(workerLine{Ev: lineStart, ID: 3, At: t0.Add(50 * time.Millisecond).UnixNano(), Call: &stale})
	out.send(workerLine{Ev: lineEnd, ID: 3, At: t0.Add(60 * time.Millisecond).UnixNano(), Call: &stale})

	p := &procCalls{rec: rec, client: rec.Client(), pending: map[int64]Call{}}
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var l workerLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		p.line(l)
	}
	if n := p.cut(rec.At(t0.Add(100 * time.Millisecond))); n != 1 {
		t.Fatalf("cut %d calls, want 1 (the Complete)", n)
	}

	calls := rec.Calls()
	if len(calls) != 3 {
		t.Fatalf("recorded %d calls, want 3: %+v", len(calls), calls)
	}
	near := func(got time.Duration, want time.Duration) bool {
		return got-want < time.Millisecond && want-got < time.Millisecond
	}
	base := rec.At(t0)
	for _, tc := range []struct {
		call       Call
		want       Call
		start, end time.Duration
	}{
		{calls[0], ended, 10 * time.Millisecond, 30 * time.Millisecond},
		{calls[1], stale, 50 * time.Millisecond, 60 * time.Millisecond},
		{calls[2], pending, 40 * time.Millisecond, 100 * time.Millisecond},
	} {
		got, want := tc.call, tc.want
		if got.Client != 1 {
			t.Errorf("%s: client %d, want 1", got.Method, got.Client)
		}
		if !near(got.Start-base, tc.start) || !near(got.End-base, tc.end) {
			t.Errorf("%s: [%v, %v] after t0, want [%v, %v]", got.Method, got.Start-base, got.End-base, tc.start, tc.end)
		}
		got.Client, got.Start, got.End, got.Reason = 0, 0, 0, want.Reason
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s came through as\n%+v\nwant\n%+v", want.Method, got, want)
		}
	}
	if c := calls[0]; c.Out.Token != 7 || c.Out.Outcome != intentv1.Outcome_OUTCOME_EXECUTE || c.In.Request != "r1" || c.Out.Unknown {
		t.Errorf("the Acquire came through as %+v", c)
	}
	if c := calls[2]; !c.Out.Unknown || c.Reason != reasonProcessEnded || c.In.Kind != OpComplete || c.In.Token != 7 || c.In.Result == "" {
		t.Errorf("the Complete the process died in came through as %+v, want an unknown outcome", c)
	}

	var last time.Duration
	for _, c := range calls {
		last = max(last, c.End)
	}
	for _, op := range Operations(calls) {
		if op.Input.(Input).Kind == OpComplete && op.Return <= int64(last) {
			t.Errorf("the cut Complete returns at %v, want open until after the history's last answer (%v)", time.Duration(op.Return), last)
		}
	}
}
