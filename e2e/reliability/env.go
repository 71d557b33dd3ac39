package reliability

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"google.golang.org/grpc"
)

// intentdFlags are what every replica here runs with besides the harness's
// own (harness.StartIntentd).
var intentdFlags = []string{
	"--health-interval", "500ms",
	"--rate-per-principal", "0",
	"--rate-per-tenant", "0",
	// The model (model.go) does not count attempts: an intent that
	// faults sent to NEEDS_REVIEW after too many lapses would read as
	// a violation. The limit itself is tested in etcdstore.
	"--max-attempts", "1000",
}

// EnvConfig shapes a run's topology.
type EnvConfig struct {
	// Replicas is the number of intentd processes (default 1).
	Replicas int
	// Cluster shapes the etcd cluster.
	Cluster ClusterConfig
	// Intentd shapes every replica: Endpoints is filled in, and Flags get
	// the suite's (intentdFlags); RequestTimeout and OperationTimeout
	// default to 1s and 3s.
	Intentd harness.IntentdConfig
	// PrivateLinks gives every replica proxies of its own to the members
	// (Env.Links), so that one replica can be cut off from etcd while the
	// others are not. Without it every replica uses the members' Proxy.
	PrivateLinks bool
}

// Env is one run: an etcd cluster behind proxies, intentd replicas, the
// merchant, and the recorder every client call goes through.
type Env struct {
	T *testing.T
	// Bins are the binaries the run starts.
	Bins     harness.Binaries
	Rec      *Recorder
	Faults   *FaultLog
	Cluster  *Cluster
	Intentds []*harness.Intentd
	// Links are each replica's links to the members: the members' own
	// proxies, or with PrivateLinks proxies of its own.
	Links    [][]*harness.Proxy
	Merchant *fakes.Merchant
	// MerchantURL is the merchant's base URL.
	MerchantURL string
	// Artifacts is where failure artifacts (porcupine's visualization) go.
	Artifacts string

	report  *Report
	started time.Time
}

// NewEnv starts the topology. Artifacts go to $RELIABILITY_ARTIFACTS, else
// to a t.TempDir(). The run's figures go to report when it finishes.
// Under -short it skips the test (harness.Bins).
func NewEnv(t *testing.T, report *Report, cfg EnvConfig) *Env {
	t.Helper()
	bins := harness.Bins(t)
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Intentd.RequestTimeout == 0 {
		cfg.Intentd.RequestTimeout = time.Second
	}
	if cfg.Intentd.OperationTimeout == 0 {
		cfg.Intentd.OperationTimeout = 3 * time.Second
	}
	cfg.Intentd.Flags = append(slices.Clone(intentdFlags), cfg.Intentd.Flags...)
	e := &Env{T: t, Bins: bins, report: report, started: time.Now(), Merchant: fakes.NewMerchant()}
	e.Artifacts = os.Getenv("RELIABILITY_ARTIFACTS")
	if e.Artifacts == "" {
		e.Artifacts = t.TempDir()
	}
	srv := httptest.NewServer(e.Merchant)
	t.Cleanup(srv.Close)
	e.MerchantURL = srv.URL
	e.Cluster = StartCluster(t, bins.Etcd, cfg.Cluster)
	for i := range cfg.Replicas {
		var links []*harness.Proxy
		for _, m := range e.Cluster.Members {
			p := m.Proxy
			if cfg.PrivateLinks {
				var err error
				if p, err = harness.NewProxy(strings.TrimPrefix(m.ClientURL, "http://")); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Close() })
			}
			links = append(links, p)
		}
		e.Links = append(e.Links, links)
		rc := cfg.Intentd
		for _, p := range links {
			rc.Endpoints = append(rc.Endpoints, "http://"+p.Addr())
		}
		e.Intentds = append(e.Intentds, harness.StartIntentd(t, bins, fmt.Sprintf("r%d", i), rc))
	}
	// The history starts once everything serves.
	e.Rec = NewRecorder()
	e.Faults = NewFaultLog(e.Rec)
	return e
}

// Addrs are the replicas' gRPC addresses.
func (e *Env) Addrs() []string {
	var out []string
	for _, d := range e.Intentds {
		out = append(out, d.Addr)
	}
	return out
}

// StartLoad starts a workload on every replica (unless cfg.Dial says
// otherwise); it is stopped when the test ends at the latest.
func (e *Env) StartLoad(cfg LoadConfig) *Load {
	e.T.Helper()
	if cfg.Dial == nil {
		addrs := e.Addrs()
		cfg.Dial = func(int) (*grpc.ClientConn, error) { return harness.Dial(addrs...) }
	}
	if cfg.Name == "" {
		cfg.Name = sanitize(e.T.Name())
	}
	cfg.Merchant = e.MerchantURL
	l, err := StartLoad(e.Rec, cfg)
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(l.Stop)
	return l
}

// WaitOK waits until n calls have been answered OK: the load a fault must
// meet.
func (e *Env) WaitOK(n int, within time.Duration) {
	e.T.Helper()
	deadline := time.Now().Add(within)
	for {
		ok := 0
		for _, c := range e.Rec.Calls() {
			if c.OK() {
				ok++
			}
		}
		if ok >= n {
			return
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("only %d calls answered OK within %v, want %d before any fault", ok, within, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FinishOptions shapes the end-of-run checks.
type FinishOptions struct {
	// Drain bounds how long the intents get to complete after the load
	// stops issuing (default 45s).
	Drain time.Duration
	// MinLoad is how many calls must have been answered OK before the
	// first fault (default 50).
	MinLoad int
	// Grace is how long after a heal calls still count as seeing the fault
	// (default 2s).
	Grace time.Duration
	// AnySeen asks only that some fault was noticed, not every one (a
	// random plan may pick faults a run does not feel, such as killing a
	// follower nobody was talking to).
	AnySeen bool
	// Noticed, when set, counts further evidence that a fault was seen:
	// a fault no call feels as an error or a slow answer (a clock jump)
	// counts as seen when Noticed finds some.
	Noticed func(FaultEvent, []Call) int
	// FaultAfter says the run's fault comes after Finish (a restore from a
	// snapshot, checked by the test itself): no fault proof here.
	FaultAfter bool
}

// Finish stops issuing, lets every intent complete, reads them all back
// and checks the run: the world (one order per intent), the acknowledged
// past, the fault proof, and linearizability with porcupine. Its figures
// go to the report.
func (e *Env) Finish(load *Load, opt FinishOptions) RunFigures {
	t := e.T
	t.Helper()
	if opt.Drain == 0 {
		opt.Drain = 45 * time.Second
	}
	drainStart := time.Now()
	left := load.Drain(opt.Drain)
	drained := time.Since(drainStart)
	load.Stop()
	if len(left) > 0 {
		t.Errorf("%d intents not COMPLETED %v after the load stopped issuing (first: %v)", len(left), opt.Drain, left[:min(5, len(left))])
	}
	for _, p := range load.Problems() {
		t.Error(p)
	}
	run, _ := e.verify(load.Keys(), opt)
	st := load.Stats()
	t.Logf("drained in %v; workers: runs=%d completed=%d executed=%d replayed=%d in-progress=%d left-unknown=%d superseded=%d errors=%d sessions=%d lost-sessions=%d",
		drained.Round(time.Millisecond), st.Runs, st.Completed, st.Executed, st.Replayed, st.InProgress, st.LeftUnknown, st.Superseded, st.RunErrors, st.Sessions, st.SessionsLost)
	return run
}

// verify reads keys back and checks the run's history: the world and the
// acknowledged past (Analyze), the fault proof (unless opt.FaultAfter) and
// linearizability with porcupine. It adds the run to the report and
// returns its figures and the intents as read back.
func (e *Env) verify(keys []string, opt FinishOptions) (RunFigures, map[string]*intentv1.Intent) {
	t := e.T
	t.Helper()
	if opt.MinLoad == 0 {
		opt.MinLoad = 50
	}
	if opt.Grace == 0 {
		opt.Grace = 2 * time.Second
	}
	finals := e.readBack(keys)
	calls := e.Rec.Calls()
	f := Analyze(calls, finals, e.Merchant.ByReference(), RefOrder)
	reportProblems(t, f.Problems)
	if f.CreatedMisreported > 0 {
		t.Errorf("%d intents were created by a Register that answered created=false: a read-back after a lost reply must recognize its own request id", f.CreatedMisreported)
	}

	events := e.Faults.Events()
	proof := ProveFaults(calls, events, opt.Grace)
	extra := map[int]int{}
	if opt.Noticed != nil {
		for i, ev := range events {
			extra[i] = opt.Noticed(ev, calls)
		}
	}
	if !opt.FaultAfter {
		var problems []string
		if opt.Noticed != nil {
			problems = proofProblems(proof, opt.MinLoad, extra)
		} else {
			problems = proof.Problems(opt.MinLoad, opt.AnySeen)
		}
		for _, p := range problems {
			t.Error("fault proof: " + p)
		}
	}

	lin, err := CheckLinearizable(calls, e.Artifacts, t.Name(), time.Minute)
	violations := 0
	switch {
	case err != nil:
		t.Errorf("linearizability check: %v", err)
	case lin.Result == porcupine.Illegal:
		violations = 1
		t.Errorf("linearizability: the history of %d operations on %d intents is not linearizable (intents %v); visualization: %s%s\nthe calls on %s:\n%s",
			lin.Operations, lin.Partitions, lin.Failing, lin.Visualization, e.keepHint(), lin.Failing[0], lin.Story)
	case lin.Result != porcupine.Ok:
		t.Errorf("linearizability: porcupine could not decide (%s) within its time; visualization: %s%s", lin.Result, lin.Visualization, e.keepHint())
	}

	run := RunFigures{
		Name: t.Name(), Operations: len(calls), Intents: len(finals), Faults: events,
		Findings: f, Proof: proof, Violations: violations, Duration: time.Since(e.started),
	}
	e.report.Add(run)
	var seen []string
	for i, ep := range proof.Events {
		seen = append(seen, fmt.Sprintf("%s@%v–%v (%s): errors=%d unavailable=%d slow=%d noticed=%d max=%v recovery=%v",
			ep.Kind, ep.Injected.Round(time.Millisecond), ep.Healed.Round(time.Millisecond), ep.Detail,
			ep.Errors, ep.Unavailable, ep.Slow, extra[i], ep.MaxLatency.Round(time.Millisecond), ep.Recovery.Round(time.Millisecond)))
	}
	t.Logf("run: %d calls, %d intents, %d orders, load before fault %d; porcupine %s on %d ops",
		len(calls), len(finals), f.Orders, proof.LoadBefore, lin.Result, lin.Operations)
	t.Logf("faults: %s", strings.Join(seen, "; "))
	t.Logf("findings: unknown=%d resolved=%d took-effect=%d lapsed=%d stale-reports-refused=%d (completes %d) duplicates=%d lost=%d other=%d",
		f.Unknown, f.Resolved, f.TookEffect, f.Lapsed, f.StaleReports, f.StaleRefused, f.Duplicates, f.Lost, f.Other)
	return run, finals
}

// reportProblems fails the test with each problem, the first 25 of them.
func reportProblems(t *testing.T, problems []string) {
	t.Helper()
	for i, p := range problems {
		if i == 25 {
			t.Errorf("... and %d more problems", len(problems)-i)
			return
		}
		t.Error(p)
	}
}

// keepHint tells how to keep an artifact that a t.TempDir() will lose.
func (e *Env) keepHint() string {
	if os.Getenv("RELIABILITY_ARTIFACTS") != "" {
		return ""
	}
	return " (removed with the test's temporary directory: set RELIABILITY_ARTIFACTS to keep it)"
}

// readBack reads every intent with its history through a recorded client,
// so that the final reads are part of the checked history too.
func (e *Env) readBack(keys []string) map[string]*intentv1.Intent {
	t := e.T
	cc, err := harness.Dial(e.Addrs()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	conn, _ := e.Rec.Conn(cc)
	c := client.New(conn, client.WithCallTimeout(5*time.Second))
	finals := map[string]*intentv1.Intent{}
	failed := 0
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		resp, err := c.Get(ctx, &intentv1.GetRequest{Key: k})
		cancel()
		if err != nil {
			failed++
			if failed <= 5 {
				t.Errorf("final read of %s: %v", k, err)
			}
			continue
		}
		finals[k] = resp.GetIntent()
	}
	return finals
}

// FinishKeys is Finish for a run that drives its intents itself rather
// than through a Load: every key must be COMPLETED already; it reads them
// all back and checks the world (one order per intent), the acknowledged
// past, the fault proof and linearizability with porcupine, and adds the
// run to the report. It returns the run's figures and the intents as read
// back, with their histories. A fault a client sees as a clear refusal
// (RESOURCE_EXHAUSTED), not as an error or a slow answer, counts as seen
// when opt.Noticed finds some.
func (e *Env) FinishKeys(keys []string, opt FinishOptions) (RunFigures, map[string]*intentv1.Intent) {
	t := e.T
	t.Helper()
	run, finals := e.verify(keys, opt)
	notDone := 0
	for _, k := range keys {
		if in, ok := finals[k]; ok && in.GetState() != intentv1.State_STATE_COMPLETED {
			notDone++
			if notDone <= 5 {
				t.Errorf("intent %s ended %s, want COMPLETED", k, in.GetState())
			}
		}
	}
	if notDone > 5 {
		t.Errorf("... %d intents in all not COMPLETED", notDone)
	}
	return run, finals
}
