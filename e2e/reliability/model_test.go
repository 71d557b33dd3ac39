package reliability

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"

	"github.com/intentd/intentd/e2e/fakes"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

const key = "k"

// h builds calls for the model tests; times are in milliseconds.
type h []Call

func at(start, end int) (time.Duration, time.Duration) {
	return time.Duration(start) * time.Millisecond, time.Duration(end) * time.Millisecond
}

func (hs h) add(client, start, end int, in Input, out Output) h {
	in.Key = key
	c := Call{Client: client, In: in, Out: out, Method: in.Kind.String()}
	c.Start, c.End = at(start, end)
	switch {
	case out.Unknown:
		c.Code = codes.Unavailable
	case out.Reason != "":
		c.Code = codes.FailedPrecondition
	}
	return append(hs, c)
}

func register(hs h, start, end int) h {
	return hs.add(0, start, end, Input{Kind: OpRegister}, Output{Created: true})
}

func acquire(session, request string) Input {
	return Input{Kind: OpAcquire, Session: session, Request: request}
}

func leased(o intentv1.Outcome, token uint64, holder string) Output {
	return Output{Outcome: o, Token: token, Holder: holder}
}

func fenced(kind OpKind, token uint64, result string) Input {
	return Input{Kind: kind, Token: token, Result: result}
}

func got(state intentv1.State, token uint64, live bool, holder, result string) Output {
	return Output{State: state, Token: token, Live: live, Holder: holder, Result: result}
}

const (
	execute    = intentv1.Outcome_OUTCOME_EXECUTE
	reconcile  = intentv1.Outcome_OUTCOME_RECONCILE
	inProgress = intentv1.Outcome_OUTCOME_IN_PROGRESS
	completed  = intentv1.Outcome_OUTCOME_COMPLETED

	stInProgress = intentv1.State_STATE_IN_PROGRESS
	stUnknown    = intentv1.State_STATE_UNKNOWN
	stCompleted  = intentv1.State_STATE_COMPLETED
	stPending    = intentv1.State_STATE_PENDING
)

var (
	ok      = Output{}
	unknown = Output{Unknown: true}
	get     = Input{Kind: OpGet}
)

func stale(current uint64) Output { return Output{Reason: reasonStale, Current: current} }

// happy is register → EXECUTE 10 → Complete(10, r1).
func happy() h {
	hs := register(nil, 0, 1)
	hs = hs.add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1"))
	return hs.add(1, 4, 5, fenced(OpComplete, 10, "order=1"), ok)
}

func TestModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    h
		want bool
	}{
		{"happy path, replayed", happy().
			add(2, 6, 7, acquire("s2", "b"), Output{Outcome: completed, Result: "order=1"}).
			add(3, 8, 9, get, got(stCompleted, 10, false, "s1", "order=1")), true},
		{"a second EXECUTE while the first lease lives", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(2, 4, 5, acquire("s2", "b"), leased(execute, 12, "s2")), false},
		{"EXECUTE after completion", happy().
			add(2, 6, 7, acquire("s2", "b"), leased(execute, 12, "s2")), false},
		{"a takeover with a lower token", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(2, 4, 5, acquire("s2", "b"), leased(reconcile, 9, "s2")), false},
		{"stale Complete refused after a takeover", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(2, 4, 5, acquire("s2", "b"), leased(reconcile, 12, "s2")).
			add(1, 6, 7, fenced(OpComplete, 10, "order=1"), stale(12)).
			add(2, 8, 9, fenced(OpComplete, 12, "order=1"), ok), true},
		{"stale Complete accepted after a takeover", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(2, 4, 5, acquire("s2", "b"), leased(reconcile, 12, "s2")).
			add(1, 6, 7, fenced(OpComplete, 10, "order=1"), ok), false},
		{"a refusal naming the wrong current token", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(2, 4, 5, acquire("s2", "b"), leased(reconcile, 12, "s2")).
			add(1, 6, 7, fenced(OpComplete, 10, "order=1"), stale(14)), false},
		{"the result changes", happy().
			add(3, 6, 7, get, got(stCompleted, 10, false, "s1", "order=2")), false},
		{"Complete retried with another result", happy().
			add(1, 6, 7, fenced(OpComplete, 10, "order=2"), ok), false},
		{"Complete retried with the same result", happy().
			add(1, 6, 7, fenced(OpComplete, 10, "order=1"), ok), true},
		{"an acquire whose answer was lost, retried", register(nil, 0, 1).
			add(1, 2, 30, acquire("s1", "a"), unknown).
			add(1, 31, 32, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(1, 33, 34, fenced(OpComplete, 10, "order=1"), ok), true},
		{"a lost acquire revealed by a reader, then lapsed and reconciled", register(nil, 0, 1).
			add(1, 2, 30, acquire("s1", "a"), unknown).
			add(2, 31, 32, acquire("s2", "b"), leased(inProgress, 10, "s1")).
			add(3, 33, 34, get, got(stUnknown, 10, false, "s1", "")).
			add(2, 35, 36, acquire("s2", "c"), leased(reconcile, 12, "s2")), true},
		{"a lapsed lease comes back", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(3, 4, 5, get, got(stUnknown, 10, false, "s1", "")).
			add(3, 6, 7, get, got(stInProgress, 10, true, "s1", "")), false},
		{"a lease forgotten", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(3, 4, 5, get, got(stPending, 0, false, "", "")), false},
		{"a lost MarkUnknown that took effect", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(1, 4, 5, fenced(OpMarkUnknown, 10, ""), unknown).
			add(2, 6, 7, acquire("s2", "b"), leased(reconcile, 12, "s2")).
			add(2, 8, 9, fenced(OpComplete, 12, "order=1"), ok), true},
		{"a lost MarkUnknown that did not", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(1, 4, 5, fenced(OpMarkUnknown, 10, ""), unknown).
			add(1, 6, 7, fenced(OpComplete, 10, "order=1"), ok), true},
		{"a read concurrent with the completion", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(3, 4, 9, get, got(stCompleted, 10, false, "s1", "order=1")).
			add(1, 5, 8, fenced(OpComplete, 10, "order=1"), ok), true},
		{"a heartbeat finds a superseded lease current", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(2, 4, 5, acquire("s2", "b"), leased(reconcile, 12, "s2")).
			add(1, 6, 7, Input{Kind: OpHeld, Token: 10}, ok), false},
		{"released, executed again under a higher token", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(1, 4, 5, fenced(OpMarkUnknown, 10, ""), ok).
			add(2, 6, 7, acquire("s2", "b"), leased(reconcile, 12, "s2")).
			add(2, 8, 9, fenced(OpRelease, 12, ""), ok).
			add(2, 10, 11, acquire("s2", "c"), leased(execute, 14, "s2")).
			add(2, 12, 13, fenced(OpComplete, 14, "order=1"), ok), true},
		{"EXECUTE from UNKNOWN", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(1, 4, 5, fenced(OpMarkUnknown, 10, ""), ok).
			add(2, 6, 7, acquire("s2", "b"), leased(execute, 12, "s2")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, info := porcupine.CheckOperationsVerbose(Model, Operations(tc.h), 10*time.Second)
			if gotOK := res == porcupine.Ok; gotOK != tc.want {
				t.Errorf("linearizable = %v (%s), want %v", gotOK, res, tc.want)
				if res != porcupine.Ok {
					path := t.TempDir() + "/model.html"
					_ = porcupine.VisualizePath(Model, info, path)
					t.Logf("visualization: %s", path)
				}
			}
		})
	}
}

// TestCheckWritesVisualization checks that a failed check leaves the
// visualization file and names it.
func TestCheckWritesVisualization(t *testing.T) {
	bad := happy().add(2, 6, 7, acquire("s2", "b"), leased(execute, 12, "s2"))
	dir := t.TempDir()
	lin, err := CheckLinearizable(bad, dir, t.Name(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lin.Result != porcupine.Illegal || !strings.HasPrefix(lin.Visualization, dir) {
		t.Fatalf("got %+v, want Illegal with a visualization under %s", lin, dir)
	}
	if fi, err := os.Stat(lin.Visualization); err != nil {
		t.Errorf("visualization: %v", err)
	} else if fi.Size() == 0 {
		t.Errorf("visualization %s is empty", lin.Visualization)
	}
	if len(lin.Failing) != 1 || lin.Failing[0] != key || !strings.Contains(lin.Story, "EXECUTE t=12") {
		t.Errorf("failing %v, story:\n%s\nwant %s and its calls", lin.Failing, lin.Story, key)
	}
}

func history(entries ...*intentv1.HistoryEntry) *intentv1.Intent {
	return &intentv1.Intent{Key: key, State: stCompleted, History: entries,
		Result: &intentv1.Result{ExternalRefs: map[string]string{RefOrder: "SO-1"}}}
}

func entry(kind intentv1.HistoryEntry_Kind, token uint64, session string) *intentv1.HistoryEntry {
	return &intentv1.HistoryEntry{Kind: kind, Token: token, SessionId: session, Accepted: true}
}

// TestCreatedMisreported: an intent that exists although no Register said
// it created it, and none lost its answer, is counted.
func TestCreatedMisreported(t *testing.T) {
	calls := h{}.add(0, 0, 1, Input{Kind: OpRegister}, Output{Created: false})
	final := &intentv1.Intent{Key: key, State: stPending, History: []*intentv1.HistoryEntry{{Kind: intentv1.HistoryEntry_KIND_REGISTERED, Accepted: true}}}
	f := Analyze(calls, map[string]*intentv1.Intent{key: final}, nil, RefOrder)
	if f.CreatedMisreported != 1 {
		t.Errorf("CreatedMisreported = %d, want 1", f.CreatedMisreported)
	}
}

func TestAnalyze(t *testing.T) {
	regd := entry(intentv1.HistoryEntry_KIND_REGISTERED, 0, "")
	acq := func(tok uint64, s string) *intentv1.HistoryEntry {
		return entry(intentv1.HistoryEntry_KIND_ACQUIRED, tok, s)
	}
	done := func(tok uint64) *intentv1.HistoryEntry { return entry(intentv1.HistoryEntry_KIND_COMPLETED, tok, "") }
	lapsed := func(tok uint64, s string) *intentv1.HistoryEntry {
		return entry(intentv1.HistoryEntry_KIND_LEASE_LAPSED, tok, s)
	}
	one := map[string][]fakes.Order{key: {{ID: "SO-1", Reference: key}}}
	for _, tc := range []struct {
		name   string
		calls  h
		final  *intentv1.Intent
		orders map[string][]fakes.Order
		want   string // "" for no problem, else a piece of the message
	}{
		{"clean", happy(), history(regd, acq(10, "s1"), done(10)), one, ""},
		{"an acknowledged completion missing", happy(), history(regd, acq(10, "s1")), one, "not in the final history"},
		{"a second order", happy(), history(regd, acq(10, "s1"), done(10)),
			map[string][]fakes.Order{key: {{ID: "SO-1", Reference: key}, {ID: "SO-2", Reference: key}}}, "a second effect"},
		{"tokens backwards in real time", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(1, 4, 5, fenced(OpMarkUnknown, 10, ""), ok).
			add(2, 6, 7, acquire("s2", "b"), leased(reconcile, 9, "s2")),
			history(regd, acq(10, "s1"), acq(9, "s2"), done(9)), one, "tokens went backwards"},
		{"an unknown registration is not misreported", register(nil, 0, 1).
			add(0, 2, 3, Input{Kind: OpRegister}, unknown).
			add(1, 4, 5, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(1, 6, 7, fenced(OpComplete, 10, "order=SO-1"), ok),
			history(regd, acq(10, "s1"), done(10)), one, ""},
		{"a lapsed session heartbeats on", register(nil, 0, 1).
			add(1, 2, 3, acquire("s1", "a"), leased(execute, 10, "s1")).
			add(2, 4, 5, acquire("s2", "b"), leased(reconcile, 12, "s2")).
			add(2, 6, 7, fenced(OpComplete, 12, "order=SO-1"), ok).
			add(1, 8, 9, Input{}, ok), // the heartbeat, below
			history(regd, acq(10, "s1"), lapsed(10, "s1"), acq(12, "s2"), done(12)), one, "kept alive by a heartbeat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := tc.calls
			if last := &calls[len(calls)-1]; last.In.Kind == 0 {
				last.Method, last.Session = "Heartbeat", "s1"
			}
			f := Analyze(calls, map[string]*intentv1.Intent{key: tc.final}, tc.orders, RefOrder)
			if f.CreatedMisreported != 0 {
				t.Errorf("CreatedMisreported = %d, want 0: a Register answered created=true", f.CreatedMisreported)
			}
			all := strings.Join(f.Problems, "\n")
			switch {
			case tc.want == "" && len(f.Problems) > 0:
				t.Errorf("problems:\n%s", all)
			case tc.want != "" && !strings.Contains(all, tc.want):
				t.Errorf("problems:\n%s\nwant one saying %q", all, tc.want)
			}
		})
	}
}
