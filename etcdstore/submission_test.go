package etcdstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
)

const pickup = "create-pickup"

var submissionSeq atomic.Int64

// start is a BeginSubmission of key's pickup under token t.
func start(key string, t fencing.Token, hasLookup bool) intent.SubmissionStart {
	body := []byte(`{"parcel":"P-1","address":"Main St 1"}`)
	return intent.SubmissionStart{
		Tenant: "default", Key: key, Operation: pickup, Token: t, ID: fmt.Sprintf("sub-%d", submissionSeq.Add(1)),
		HasLookup: hasLookup, Timeout: time.Minute,
		Request: intent.SubmittedRequest{Upstream: "courier", Method: "POST", Target: "/pickups", BodySHA256: strings.Repeat("0f", 32), BodyBytes: int64(len(body)), Body: body},
	}
}

func answered(st intent.SubmissionStart, s *intent.Submission, status int, body string) intent.SubmissionEnd {
	return intent.SubmissionEnd{Tenant: "default", Key: st.Key, Operation: st.Operation, Token: s.Token, ID: s.ID, Outcome: intent.OutcomeAnswered,
		Response: &intent.UpstreamResponse{Status: status, Header: []intent.HeaderField{{Name: "Content-Type", Value: "application/json"}, {Name: "Location", Value: "/pickups/PU-1"}},
			Body: []byte(body), BodyBytes: int64(len(body))}}
}

func begun(t *testing.T, s *etcdstore.Store, st intent.SubmissionStart, want intent.SubmissionVerdict) *intent.SubmissionBegun {
	t.Helper()
	b, err := s.BeginSubmission(ctx(t), st)
	if err != nil {
		t.Fatalf("BeginSubmission(%s, token %v): %v", st.ID, st.Token, err)
	}
	if b.Verdict != want {
		t.Fatalf("BeginSubmission(%s, token %v) = %v, want %v", st.ID, st.Token, b.Verdict, want)
	}
	return b
}

func recordEnd(t *testing.T, s *etcdstore.Store, e intent.SubmissionEnd) *intent.SubmissionRecord {
	t.Helper()
	r, err := s.RecordSubmission(ctx(t), e)
	if err != nil {
		t.Fatalf("RecordSubmission(%s, %v): %v", e.ID, e.Outcome, err)
	}
	return r
}

func entriesOf(in *intent.Intent, kind intent.EventKind, accepted bool) []intent.Event {
	var out []intent.Event
	for _, e := range in.History {
		if e.Kind == kind && e.Accepted == accepted {
			out = append(out, e)
		}
	}
	return out
}

// A forwarded submission's answer is kept in etcd: every replica replays
// it byte for byte, under the same token and under a newer holder's.
func TestSubmissionAnswerIsRecordedAndReplayed(t *testing.T) {
	c := newCluster(t)
	s1, s2 := c.store(t), c.store(t)
	register(t, s1, lamp(t, "pickup-1", 1))
	sess := openSession(t, s1, "w1", time.Minute)
	a := acquire(t, s1, "pickup-1", sess)
	st := start("pickup-1", a.Lease.Token, false)
	b := begun(t, s1, st, intent.VerdictForward)
	if b.Submission.State != intent.SubmissionInFlight || b.Intent.State != intent.StateInProgress || !b.Intent.Lease.Live {
		t.Fatalf("forward %+v / %+v, want in flight on a live lease", b.Submission, b.Intent)
	}
	body := `{"id":"PU-0001","parcel":"P-1"}` + "\x00\xff"
	r := recordEnd(t, s1, answered(st, b.Submission, 201, body))
	if r.Submission.State != intent.SubmissionRecorded {
		t.Fatalf("recorded %+v", r.Submission)
	}
	for i, s := range []*etcdstore.Store{s1, s2, c.store(t)} {
		rb := begun(t, s, start("pickup-1", a.Lease.Token, false), intent.VerdictReplay)
		got := rb.Submission.Response
		if got.Status != 201 || !bytes.Equal(got.Body, []byte(body)) || len(got.Header) != 2 || got.Header[1] != (intent.HeaderField{Name: "Location", Value: "/pickups/PU-1"}) {
			t.Errorf("replica %d replays %+v, want the recorded answer byte for byte", i, got)
		}
	}
	// Taken over: the newer holder is answered the same.
	lapse(t, s1, sess)
	a2 := acquire(t, s2, "pickup-1", openSession(t, s2, "w2", time.Minute))
	mustOutcome(t, a2, intent.OutcomeReconcile)
	rb := begun(t, s2, start("pickup-1", a2.Lease.Token, false), intent.VerdictReplay)
	if !bytes.Equal(rb.Submission.Response.Body, []byte(body)) {
		t.Errorf("the newer holder gets %q", rb.Submission.Response.Body)
	}
	in := get(t, s2, "pickup-1")
	if len(entriesOf(in, intent.EventSubmissionStarted, true)) != 1 || len(entriesOf(in, intent.EventSubmissionRecorded, true)) != 1 {
		t.Errorf("history %+v, want one start and one record", in.History)
	}
}

// The seed's paused worker: A's lease lapses, B takes over and submits; A's
// late submission is refused STALE_TOKEN and kept as evidence, and only B's
// was ever forwarded.
func TestStaleSubmissionIsRefusedAndKept(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "pickup-2", 1))
	sessA := openSession(t, s, "A", time.Minute)
	a := acquire(t, s, "pickup-2", sessA)
	lapse(t, s, sessA)
	b := acquire(t, s, "pickup-2", openSession(t, s, "B", time.Minute))
	mustOutcome(t, b, intent.OutcomeReconcile)
	fb := begun(t, s, start("pickup-2", b.Lease.Token, false), intent.VerdictForward)
	_, err := s.BeginSubmission(ctx(t), start("pickup-2", a.Lease.Token, false))
	mustStale(t, err, b.Lease.Token)
	in := get(t, s, "pickup-2")
	refused := entriesOf(in, intent.EventSubmissionStarted, false)
	if len(refused) != 1 || refused[0].Token != a.Lease.Token {
		t.Errorf("refused starts %+v, want A's kept as evidence", refused)
	}
	if got := in.Lease.Token; got != b.Lease.Token {
		t.Errorf("lease token %v, want B's %v unchanged", got, b.Lease.Token)
	}
	if fb.Submission.Token != b.Lease.Token {
		t.Errorf("forwarded under %v", fb.Submission.Token)
	}
}

// Racing submissions of one operation through two replicas: one forward,
// every other call busy (or replayed once the answer is in).
func TestRacingSubmissionsForwardOnce(t *testing.T) {
	c := newCluster(t)
	stores := []*etcdstore.Store{c.store(t), c.store(t), c.store(t)}
	register(t, stores[0], lamp(t, "pickup-3", 1))
	a := acquire(t, stores[0], "pickup-3", openSession(t, stores[0], "w", time.Minute))
	var forwards, busy atomic.Int64
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := stores[i%3].BeginSubmission(ctx(t), start("pickup-3", a.Lease.Token, false))
			if err != nil {
				t.Errorf("BeginSubmission: %v", err)
				return
			}
			switch b.Verdict {
			case intent.VerdictForward:
				forwards.Add(1)
			case intent.VerdictBusy:
				busy.Add(1)
			default:
				t.Errorf("verdict %v", b.Verdict)
			}
		}()
	}
	wg.Wait()
	if forwards.Load() != 1 || busy.Load() != 11 {
		t.Errorf("%d forwards, %d busy: want 1 and 11", forwards.Load(), busy.Load())
	}
}

// A lost answer with a lookup at the upstream: UNKNOWN, never forwarded
// again; the reconciler's lookup settles it, and the next call replays
// what the lookup found.
func TestLostSubmissionWithLookupIsReconciled(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "pickup-4", 1))
	a := acquire(t, s, "pickup-4", openSession(t, s, "A", time.Minute))
	st := start("pickup-4", a.Lease.Token, true)
	b := begun(t, s, st, intent.VerdictForward)
	r := recordEnd(t, s, intent.SubmissionEnd{Tenant: "default", Key: "pickup-4", Operation: pickup, Token: a.Lease.Token, ID: b.Submission.ID,
		Outcome: intent.OutcomeLost, Error: "timeout awaiting response headers"})
	if r.Submission.State != intent.SubmissionUnknown || r.Intent.State != intent.StateUnknown {
		t.Fatalf("lost: %+v / %v, want unknown and UNKNOWN", r.Submission, r.Intent.State)
	}
	// The sender again: told it is unknown, nothing forwarded.
	begun(t, s, start("pickup-4", a.Lease.Token, true), intent.VerdictUnknown)
	rescue := start("pickup-4", a.Lease.Token, true)
	rescue.Lookup = true
	if _, err := s.BeginSubmission(ctx(t), rescue); !errors.Is(err, intent.ErrInvalidTransition) {
		t.Errorf("a lookup under the ended lease: %v, want INVALID_TRANSITION", err)
	}
	rc := acquire(t, s, "pickup-4", openSession(t, s, "R", time.Minute))
	mustOutcome(t, rc, intent.OutcomeReconcile)
	begun(t, s, start("pickup-4", rc.Lease.Token, true), intent.VerdictUnknown)
	look := start("pickup-4", rc.Lease.Token, true)
	look.Lookup = true
	lb := begun(t, s, look, intent.VerdictLookup)
	found := `{"id":"PU-0007","reference":"pickup-4:create-pickup"}`
	recordEnd(t, s, intent.SubmissionEnd{Tenant: "default", Key: "pickup-4", Operation: pickup, Token: rc.Lease.Token, ID: lb.Submission.ID, Outcome: intent.OutcomeFound,
		Response: &intent.UpstreamResponse{Status: 200, Body: []byte(found), BodyBytes: int64(len(found))}})
	rb := begun(t, s, start("pickup-4", rc.Lease.Token, true), intent.VerdictReplay)
	if !rb.Submission.LookedUp || string(rb.Submission.Response.Body) != found {
		t.Errorf("replay %+v, want the lookup's answer", rb.Submission)
	}
	if _, err := report(t, s, complete("pickup-4", rc.Lease.Token, "PU-0007")); err != nil {
		t.Fatal(err)
	}
	if in := get(t, s, "pickup-4"); in.State != intent.StateCompleted || in.Result.ExternalRefs["supplier_order_id"] != "PU-0007" {
		t.Errorf("intent %v %+v, want COMPLETED with the order id", in.State, in.Result)
	}
}

// A lost answer with no lookup: the intent waits in the review queue with
// what was sent, when, and what came back.
func TestLostSubmissionWithoutLookupNeedsReview(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	register(t, s, lamp(t, "pickup-5", 1))
	a := acquire(t, s, "pickup-5", openSession(t, s, "A", time.Minute))
	st := start("pickup-5", a.Lease.Token, false)
	b := begun(t, s, st, intent.VerdictForward)
	recordEnd(t, s, intent.SubmissionEnd{Tenant: "default", Key: "pickup-5", Operation: pickup, Token: a.Lease.Token, ID: b.Submission.ID,
		Outcome: intent.OutcomeLost, Error: "read tcp 127.0.0.1:1->127.0.0.1:2: connection reset by peer"})
	page, err := s.List(ctx(t), intent.ListQuery{Filter: intent.Filter{Tenant: "default", States: []intent.State{intent.StateNeedsReview}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Intents) != 1 || page.Intents[0].Key != "pickup-5" {
		t.Fatalf("review queue %+v, want pickup-5", page.Intents)
	}
	in := get(t, s, "pickup-5")
	esc := entriesOf(in, intent.EventEscalated, true)
	if len(esc) != 1 {
		t.Fatalf("history %+v, want one escalation", in.History)
	}
	for _, want := range []string{"POST /pickups", `"courier"`, "connection reset", b.Submission.StartedAt.UTC().Format(time.RFC3339Nano), "no lookup"} {
		if !strings.Contains(esc[0].Reason, want) {
			t.Errorf("escalation %q does not say %q", esc[0].Reason, want)
		}
	}
	begun(t, s, start("pickup-5", a.Lease.Token, false), intent.VerdictUnknown)
}

// A gateway that stops between BeginSubmission and RecordSubmission leaves
// the submission in flight: busy until its deadline, unknown after it.
func TestInFlightPastDeadlineIsUnknown(t *testing.T) {
	c := newCluster(t)
	var offset atomic.Int64
	cfg := etcdstore.DefaultConfig()
	cfg.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	s, err := etcdstore.New(c.cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	register(t, s, lamp(t, "pickup-6", 1))
	a := acquire(t, s, "pickup-6", openSession(t, s, "A", time.Hour))
	begun(t, s, start("pickup-6", a.Lease.Token, true), intent.VerdictForward)
	begun(t, s, start("pickup-6", a.Lease.Token, true), intent.VerdictBusy)
	offset.Store(int64(2 * time.Minute))
	b := begun(t, s, start("pickup-6", a.Lease.Token, true), intent.VerdictUnknown)
	if b.Submission.State != intent.SubmissionUnknown || !strings.Contains(b.Submission.Error, "deadline") {
		t.Errorf("submission %+v, want unknown for its deadline", b.Submission)
	}
	if in := get(t, s, "pickup-6"); in.State != intent.StateUnknown || in.Attempts != 1 {
		t.Errorf("intent %v with %d attempts, want UNKNOWN, one counted", in.State, in.Attempts)
	}
}

// Ambiguous commits: a BeginSubmission and a RecordSubmission whose replies
// are lost after etcd applied them recognize their own write on read-back.
func TestSubmissionsSurviveAmbiguousCommits(t *testing.T) {
	c := newCluster(t)
	plain := c.store(t)
	register(t, plain, lamp(t, "pickup-7", 1))
	a := acquire(t, plain, "pickup-7", openSession(t, plain, "A", time.Minute))
	dropped := 0
	s, err := etcdstore.NewWithKV(c.cli, lossyKV(c.cli, &dropped), etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	st := start("pickup-7", a.Lease.Token, false)
	b := begun(t, s, st, intent.VerdictForward)
	if !b.Replayed {
		t.Errorf("forward not recognized as a read-back")
	}
	r := recordEnd(t, s, answered(st, b.Submission, 201, `{"id":"PU-1"}`))
	if !r.Replayed || r.Submission.State != intent.SubmissionRecorded {
		t.Errorf("record %+v replayed %t, want recorded, recognized", r.Submission, r.Replayed)
	}
	if dropped != 2 {
		t.Errorf("%d replies dropped, want 2", dropped)
	}
	in := get(t, plain, "pickup-7")
	if len(entriesOf(in, intent.EventSubmissionStarted, true)) != 1 || len(entriesOf(in, intent.EventSubmissionRecorded, true)) != 1 {
		t.Errorf("history %+v, want each written once", in.History)
	}
}

// A BeginSubmission from a replica that holds the record and the holder's
// session in memory costs one write and no read.
func TestBeginSubmissionIsOneRoundTrip(t *testing.T) {
	c := newCluster(t)
	var writes, reads int
	s, err := etcdstore.NewWithKV(c.cli, countingKV(c.cli, &writes, &reads), etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	register(t, s, lamp(t, "pickup-8", 1))
	a := acquire(t, s, "pickup-8", openSession(t, s, "A", time.Minute))
	writes, reads = 0, 0
	begun(t, s, start("pickup-8", a.Lease.Token, false), intent.VerdictForward)
	if writes != 1 || reads != 0 {
		t.Errorf("BeginSubmission: %d writes, %d reads; want 1 and 0", writes, reads)
	}
}
