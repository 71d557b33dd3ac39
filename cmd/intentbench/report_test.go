package main

import (
	"io"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"
)

// resultLine is the RESULT line's form, as scripts/test.sh checks it
// after the benchmark's smoke run.
var resultLine = regexp.MustCompile(`^RESULT cycle_ratio=(\S+) cycle_ratio_c1=(\S+) replay_ratio=(\S+) replay_vs_echo=(\S+) replay_ratio_10k=(\S+) replay_miss_ratio=(\S+) writes_per_intent=(\S+) heartbeat_writes_per_s=(\S+) acquire_p99_1m_vs_1k=(\S+) queue_page_1m_vs_1k=(\S+) bytes_per_intent=(\S+) rss_mb=(\S+)$`)

func TestResultLine(t *testing.T) {
	tests := []struct {
		name string
		res  results
		want string
	}{
		{"every figure", results{
			"cycle_ratio": 0.357, "cycle_ratio_c1": 0.449, "replay_ratio": 0.8, "replay_vs_echo": 0.31,
			"replay_ratio_10k": 1.014, "replay_miss_ratio": 0.7049,
			"writes_per_intent": 2, "heartbeat_writes_per_s": 0, "acquire_p99_1m_vs_1k": 1.234,
			"queue_page_1m_vs_1k": 0.99, "bytes_per_intent": 4123.6, "rss_mb": 212.4,
		}, "RESULT cycle_ratio=0.36 cycle_ratio_c1=0.45 replay_ratio=0.80 replay_vs_echo=0.31 replay_ratio_10k=1.01 replay_miss_ratio=0.70 writes_per_intent=2.00 heartbeat_writes_per_s=0.00 acquire_p99_1m_vs_1k=1.23 queue_page_1m_vs_1k=0.99 bytes_per_intent=4124 rss_mb=212"},
		{"nothing measured", results{},
			"RESULT cycle_ratio=n/a cycle_ratio_c1=n/a replay_ratio=n/a replay_vs_echo=n/a replay_ratio_10k=n/a replay_miss_ratio=n/a writes_per_intent=n/a heartbeat_writes_per_s=n/a acquire_p99_1m_vs_1k=n/a queue_page_1m_vs_1k=n/a bytes_per_intent=n/a rss_mb=n/a"},
		{"unknown and infinite figures", results{"cycle_ratio": math.NaN(), "replay_ratio": math.Inf(1), "rss_mb": 300},
			"RESULT cycle_ratio=n/a cycle_ratio_c1=n/a replay_ratio=n/a replay_vs_echo=n/a replay_ratio_10k=n/a replay_miss_ratio=n/a writes_per_intent=n/a heartbeat_writes_per_s=n/a acquire_p99_1m_vs_1k=n/a queue_page_1m_vs_1k=n/a bytes_per_intent=n/a rss_mb=300"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.res.line()
			if got != tc.want {
				t.Errorf("line():\n got %s\nwant %s", got, tc.want)
			}
			if !resultLine.MatchString(got) {
				t.Errorf("line() %q does not have the RESULT form", got)
			}
		})
	}
}

// TestResultFieldsAreTheDocumented: the fields, in order, are those the
// form above (and the smoke run's check) expects.
func TestResultFieldsAreTheDocumented(t *testing.T) {
	var names []string
	for _, f := range resultFields {
		names = append(names, f.name)
	}
	got := strings.Join(names, " ")
	want := "cycle_ratio cycle_ratio_c1 replay_ratio replay_vs_echo replay_ratio_10k replay_miss_ratio writes_per_intent heartbeat_writes_per_s acquire_p99_1m_vs_1k queue_page_1m_vs_1k bytes_per_intent rss_mb"
	if got != want {
		t.Errorf("RESULT fields %q, want %q", got, want)
	}
}

func rounds(rates ...float64) []round {
	var rs []round
	for _, r := range rates {
		rs = append(rs, round{ops: int(r), elapsed: time.Second})
	}
	return rs
}

func TestRatios(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name    string
		a, b    []round
		med     float64
		min, ma float64
	}{
		{"same round pairs", rounds(100, 200, 300), rounds(200, 200, 200), 1, 0.5, 1.5},
		{"median of an even count is the mean of the middle two", rounds(100, 300), rounds(100, 100), 2, 1, 3},
		{"a zero rate on the right is not a ratio", rounds(100, 100, 100), rounds(0, 50, 100), 1.5, 1, 2},
		{"no rounds", nil, nil, nan, nan, nan},
		{"extra rounds of one side are left out", rounds(100, 100, 900), rounds(100, 100), 1, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := pairRatio(tc.a, tc.b)
			if !same(got.med, tc.med) || !same(got.min, tc.min) || !same(got.max, tc.ma) {
				t.Errorf("pairRatio: got %v, want {%v %v %v}", got, tc.med, tc.min, tc.ma)
			}
		})
	}
}

func same(a, b float64) bool {
	return (math.IsNaN(a) && math.IsNaN(b)) || math.Abs(a-b) < 1e-9
}

func TestRoundFigures(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 200; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	r := round{ops: 200, elapsed: 2 * time.Second, lat: lat, cpu: 500 * time.Millisecond, revs: 400}
	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		{"rate", r.rate(), 100},
		{"p50", float64(r.pct(0.5)), float64(100 * time.Millisecond)},
		{"p99", float64(r.pct(0.99)), float64(198 * time.Millisecond)},
		{"p100", float64(r.pct(1)), float64(200 * time.Millisecond)},
		{"CPU µs per op", r.cpuPerOp(), 2500},
		{"revisions per op", r.revsPerOp(), 2},
		{"unknown CPU", round{ops: 1, cpu: -1}.cpuPerOp(), math.NaN()},
		{"unknown revisions", round{ops: 1, revs: -1}.revsPerOp(), math.NaN()},
	} {
		if !same(tc.got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestNum(t *testing.T) {
	for _, tc := range []struct {
		x    float64
		prec int
		want string
	}{
		{1234567.891, 0, "1,234,568"},
		{999, 0, "999"},
		{1000, 2, "1,000.00"},
		{-4321.5, 1, "-4,321.5"},
		{math.NaN(), 2, "n/a"},
	} {
		if got := num(tc.x, tc.prec); got != tc.want {
			t.Errorf("num(%v, %d): got %q, want %q", tc.x, tc.prec, got, tc.want)
		}
	}
}

// TestBadFlagsNameTheFlag: every refusal names the flag it is about and
// exits 2 before anything starts.
func TestBadFlagsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "soon"}, `--duration "soon": not valid`},
		{[]string{"--duration", "10ms"}, "--duration 10ms: want at least 100ms"},
		{[]string{"--rounds", "0"}, "--rounds 0"},
		{[]string{"--levels", "1,x"}, `--levels "1,x": "x" is not a concurrency level`},
		{[]string{"--levels", "16,1"}, "--levels \"16,1\": want ascending levels"},
		{[]string{"--replay-levels", ""}, "--replay-levels"},
		{[]string{"--payload", "8"}, "--payload 8"},
		{[]string{"--payload-text", "json"}, `--payload-text "json": want random or repeat`},
		{[]string{"--workloads", "cycle,fast"}, `unknown workload "fast"`},
		{[]string{"--heartbeat-intents", "10"}, "--heartbeat-intents 10"},
		{[]string{"--heartbeat-intents", "100000"}, "--heartbeat-intents 100000"},
		{[]string{"--session-ttl", "1s"}, "--session-ttl 1s"},
		{[]string{"--scale-large", "1000"}, "--scale-large 1000"},
		{[]string{"--intentd-etcd", "http://127.0.0.1:2379"}, "--intentd-etcd: only with --intentd-addr"},
		{[]string{"--no-such-flag"}, "--no-such-flag"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var stderr strings.Builder
		code := Main(tc.args, io.Discard, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("intentbench %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestDefaultFlagsAreValid(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("default flags: %v", err)
	}
	if got := strings.Join(cfg.workloads, ","); got != strings.Join(workloads, ",") {
		t.Errorf("default workloads %q, want all: %q", got, strings.Join(workloads, ","))
	}
}

// TestPayloadTextIsWhatItSays: random text is letters and digits, the same
// for a seed (every intent of a run, and the raw peer, write the same
// bytes), another for another seed, and far from the one repeated letter
// of repeat.
func TestPayloadTextIsWhatItSays(t *testing.T) {
	random, again, other := payloadText("random", 300, 1), payloadText("random", 300, 1), payloadText("random", 300, 2)
	if len(random) != 300 || random != again {
		t.Fatalf("random text: %d bytes, stable %v", len(random), random == again)
	}
	if random[:32] == other[:32] {
		t.Errorf("random texts of two seeds begin alike: %q", random[:32])
	}
	seen := map[rune]bool{}
	for _, r := range random {
		if !strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", r) {
			t.Fatalf("random text holds %q", r)
		}
		seen[r] = true
	}
	if len(seen) < 50 {
		t.Errorf("random text uses %d distinct characters, want most of 62", len(seen))
	}
	if got := payloadText("repeat", 300, 1); got != strings.Repeat("x", 300) {
		t.Errorf("repeat text = %q", got)
	}
}

// A tail in one round of five, 1.2 % of the run's calls: the median
// of the rounds' p99 hides it, the pooled p99 does not.
func TestPooledKeepsARareTail(t *testing.T) {
	ms := time.Millisecond
	quiet := func() round {
		r := round{ops: 100, elapsed: time.Second}
		for range 100 {
			r.lat = append(r.lat, ms)
		}
		return r
	}
	rs := []round{quiet(), quiet(), quiet(), quiet(), quiet()}
	for i := range 6 {
		rs[2].lat[94+i] = 10 * ms // already sorted: the slowest last
	}
	if got := over(rs, pctMs(0.99)).med; got != 1 {
		t.Errorf("median of the rounds' p99 = %v ms, want 1", got)
	}
	all := pooled(rs)
	if all.ops != 500 || all.elapsed != 5*time.Second || len(all.lat) != 500 {
		t.Fatalf("pooled: %d ops in %v, %d latencies; want 500 in 5s", all.ops, all.elapsed, len(all.lat))
	}
	if got := pctMs(0.99)(all); got != 10 {
		t.Errorf("pooled p99 = %v ms, want 10", got)
	}
	if got := pctMs(0.98)(all); got != 1 {
		t.Errorf("pooled p98 = %v ms, want 1", got)
	}
}
