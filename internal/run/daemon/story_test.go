package daemon_test

import (
	"bufio"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
)

// families scrapes /metrics at addr and parses it.
func families(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	scrape(t, addr) // waits for the listener
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value is the value of the series of name whose labels include the given
// name=value pairs (a histogram's: its count); 0 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// series names one series: a metric and label pairs, "name,value,...".
type series struct {
	name, labels string
}

func (s series) String() string { return s.name + "{" + s.labels + "}" }

func (s series) in(fams map[string]*dto.MetricFamily) float64 {
	var pairs []string
	if s.labels != "" {
		pairs = strings.Split(s.labels, ",")
	}
	return value(fams, s.name, pairs...)
}

// A scenario moves each counter by exactly what happened: 4 registers and a
// changed one refused (1 fingerprint conflict), 4 EXECUTE + 1 RECONCILE + 1
// replayed COMPLETED, 1 MarkUnknown, 2 lapsed leases (one noticed by the
// janitor, one by an Acquire — unless the janitor got there first), 1
// stale Complete; and leaves 1 UNKNOWN and 1 NEEDS_REVIEW in the review
// queue and 1 session open.
func TestMetricsTellTheStory(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = freeport.Addr(t)
	cfg.JanitorInterval = 200 * time.Millisecond
	in := start(t, cfg)
	c := intentv1.NewIntentServiceClient(in.conn)
	before := families(t, cfg.MetricsListen)

	for _, k := range []string{"story-a", "story-b", "story-c", "story-d"} {
		if _, err := c.Register(call(t), &intentv1.RegisterRequest{Key: k, Params: params(t, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Register(call(t), &intentv1.RegisterRequest{Key: "story-a", Params: params(t, 2)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Register with changed params: %v, want FAILED_PRECONDITION", err)
	}
	session := func(worker string) string {
		s, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: worker, Ttl: durationpb.New(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		return s.GetSessionId()
	}
	closeSession := func(id string) {
		if _, err := c.CloseSession(call(t), &intentv1.CloseSessionRequest{SessionId: id}); err != nil {
			t.Fatal(err)
		}
	}
	seq := 0
	acquire := func(key, sess string, want intentv1.Outcome) uint64 {
		t.Helper()
		seq++
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{Key: key, SessionId: sess, RequestId: "r" + string(rune('a'+seq))})
		if err != nil || a.GetOutcome() != want {
			t.Fatalf("Acquire(%s): %v %v, want %v", key, a.GetOutcome(), err, want)
		}
		return a.GetLease().GetToken()
	}
	complete := func(key string, token uint64) error {
		_, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: key, Token: token, Result: &intentv1.Result{Payload: []byte("done")}})
		return err
	}
	w1 := session("w1")

	// a: executed, completed, replayed.
	if err := complete("story-a", acquire("story-a", w1, intentv1.Outcome_OUTCOME_EXECUTE)); err != nil {
		t.Fatal(err)
	}
	acquire("story-a", w1, intentv1.Outcome_OUTCOME_COMPLETED)
	// b: marked unknown, then escalated by a reviewer.
	tb := acquire("story-b", w1, intentv1.Outcome_OUTCOME_EXECUTE)
	if _, err := c.MarkUnknown(call(t), &intentv1.MarkUnknownRequest{Key: "story-b", Token: tb, Reason: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Escalate(call(t), &intentv1.EscalateRequest{Key: "story-b", Reason: "cannot tell", Actor: "rev"}); err != nil {
		t.Fatal(err)
	}
	// d: its worker goes away; the janitor records the lapse.
	w3 := session("w3")
	acquire("story-d", w3, intentv1.Outcome_OUTCOME_EXECUTE)
	closeSession(w3)
	deadline := time.Now().Add(20 * time.Second)
	for value(families(t, cfg.MetricsListen), "intentd_janitor_items_total", "action", "lapsed") == value(before, "intentd_janitor_items_total", "action", "lapsed") {
		if time.Now().After(deadline) {
			t.Fatal("the janitor did not record the lapse of story-d within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// c: its worker goes away; the next Acquire reconciles, and the first
	// worker's late Complete is refused as stale.
	w2 := session("w2")
	tc := acquire("story-c", w2, intentv1.Outcome_OUTCOME_EXECUTE)
	closeSession(w2)
	tc2 := acquire("story-c", w1, intentv1.Outcome_OUTCOME_RECONCILE)
	if err := complete("story-c", tc); status.Code(err) != codes.Aborted {
		t.Fatalf("Complete under the superseded token: %v, want ABORTED", err)
	}
	if err := complete("story-c", tc2); err != nil {
		t.Fatal(err)
	}

	// The queue and sessions are counted every 5 health intervals.
	var after map[string]*dto.MetricFamily
	gauges := map[series]float64{
		{"intentd_review_queue_intents", "state,UNKNOWN"}:      1,
		{"intentd_review_queue_intents", "state,NEEDS_REVIEW"}: 1,
		{"intentd_sessions_open", ""}:                          1,
		{"intentd_ready", ""}:                                  1,
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		after = families(t, cfg.MetricsListen)
		settled := true
		for s, want := range gauges {
			settled = settled && s.in(after) == want
		}
		if settled || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for s, want := range gauges {
		if got := s.in(after); got != want {
			t.Errorf("%v = %v, want %v", s, got, want)
		}
	}

	delta := func(name string, labels ...string) float64 {
		return value(after, name, labels...) - value(before, name, labels...)
	}
	byJanitor := delta("intentd_lease_lapses_total", "noticed_by", "janitor")
	if byJanitor != 1 {
		t.Logf("the janitor recorded story-c's lapse before the Acquire did (%v lapses by the janitor)", byJanitor)
	}
	want := map[series]float64{
		{"intentd_acquire_outcomes_total", "outcome,EXECUTE"}:      4,
		{"intentd_acquire_outcomes_total", "outcome,RECONCILE"}:    1,
		{"intentd_acquire_outcomes_total", "outcome,COMPLETED"}:    1,
		{"intentd_acquire_outcomes_total", ""}:                     6,
		{"intentd_stale_token_refusals_total", "method,Complete"}:  1,
		{"intentd_stale_token_refusals_total", ""}:                 1,
		{"intentd_fingerprint_conflicts_total", "method,Register"}: 1,
		{"intentd_fingerprint_conflicts_total", ""}:                1,
		{"intentd_marked_unknown_total", ""}:                       1,
		{"intentd_lease_lapses_total", ""}:                         2,
		{"intentd_lease_lapses_total", "noticed_by,acquire"}:       2 - byJanitor,
		{"intentd_janitor_items_total", "action,lapsed"}:           byJanitor,
		{"intentd_intents_attempts_exhausted_total", ""}:           0,
		{"intentd_store_replays_from_memory_total", ""}:            1,
		{"intentd_store_ambiguous_commits_total", ""}:              0,
		// 4 registers, 5 grants, 2 completions, 1 MarkUnknown, 1
		// escalation, the stale Complete kept as evidence, and each lapse
		// the janitor recorded.
		{"intentd_store_commits_total", ""}:                                     14 + byJanitor,
		{"grpc_server_handled_total", "grpc_method,Complete,grpc_code,Aborted"}: 1,
	}
	for s, w := range want {
		if got := s.in(after) - s.in(before); got != w {
			t.Errorf("%v moved by %v, want %v", s, got, w)
		}
	}
	if writes, commits := delta("intentd_etcd_txn_duration_seconds", "kind", "write"), delta("intentd_store_commits_total"); writes < commits {
		t.Errorf("intentd_etcd_txn_duration_seconds{kind=write} counted %v transactions, fewer than the %v commits", writes, commits)
	}
	if rev := value(after, "intentd_etcd_revision"); rev <= value(before, "intentd_etcd_revision") {
		t.Errorf("intentd_etcd_revision = %v after %v commits, want above %v", rev, delta("intentd_store_commits_total"), value(before, "intentd_etcd_revision"))
	}
	if reads := delta("intentd_etcd_txn_duration_seconds", "kind", "read"); reads == 0 {
		t.Error("intentd_etcd_txn_duration_seconds{kind=read} counted no transaction")
	}
	// The story's intents and sessions are remembered, within the budget.
	for _, cache := range []string{"records", "sessions"} {
		if n := value(after, "intentd_store_cache_entries", "cache", cache); n < 1 {
			t.Errorf("intentd_store_cache_entries{cache=%s} = %v, want the story's", cache, n)
		}
	}
	if b := value(after, "intentd_store_cache_bytes"); b < 1 || b > etcdstore.DefaultCacheBytes {
		t.Errorf("intentd_store_cache_bytes = %v, want some, at most --cache-bytes %d", b, etcdstore.DefaultCacheBytes)
	}
}

// The metrics table of docs/OPERATIONS.md (once the README's) and /metrics
// name the same intentd_ metrics, with the same types.
func TestMetricsTableMatchesExport(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.MetricsListen = freeport.Addr(t)
	start(t, cfg)
	exported := map[string]string{}
	for name, f := range families(t, cfg.MetricsListen) {
		if strings.HasPrefix(name, "intentd_") {
			exported[name] = strings.ToLower(f.GetType().String())
		}
	}

	f, err := os.Open("../../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(intentd_[a-z_]+)` \\| (counter|gauge|histogram) \\|")
	documented := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			if _, dup := documented[m[1]]; dup {
				t.Errorf("docs/OPERATIONS.md lists %s twice", m[1])
			}
			documented[m[1]] = m[2]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(documented) == 0 {
		t.Fatal("docs/OPERATIONS.md has no metrics table (| `intentd_…` | type |)")
	}
	for _, name := range slices.Sorted(maps.Keys(exported)) {
		switch doc, ok := documented[name]; {
		case !ok:
			t.Errorf("/metrics exports %s (%s), the metrics table of docs/OPERATIONS.md does not list it", name, exported[name])
		case doc != exported[name]:
			t.Errorf("docs/OPERATIONS.md lists %s as a %s, /metrics exports a %s", name, doc, exported[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(documented)) {
		if _, ok := exported[name]; !ok {
			t.Errorf("docs/OPERATIONS.md lists %s, /metrics does not export it", name)
		}
	}
}
