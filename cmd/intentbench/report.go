package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// round is one peer's measured share of one round: how many operations
// finished, in how long, their latencies, and what the peer's server
// spent meanwhile.
type round struct {
	ops     int
	elapsed time.Duration
	lat     []time.Duration // sorted
	cpu     time.Duration   // the server process's CPU during the round; negative: unknown
	revs    int64           // etcd revisions the round caused; negative: unknown
}

func (r round) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

// pct is the q-quantile (0 < q ≤ 1) of the round's latencies, nearest rank.
func (r round) pct(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(r.lat)))) - 1
	return r.lat[min(max(i, 0), len(r.lat)-1)]
}

// cpuPerOp is the server CPU per operation in µs; NaN when unknown.
func (r round) cpuPerOp() float64 {
	if r.cpu < 0 || r.ops == 0 {
		return math.NaN()
	}
	return float64(r.cpu.Microseconds()) / float64(r.ops)
}

// revsPerOp is the etcd revisions per operation; NaN when unknown.
func (r round) revsPerOp() float64 {
	if r.revs < 0 || r.ops == 0 {
		return math.NaN()
	}
	return float64(r.revs) / float64(r.ops)
}

// spread is the median of a figure over rounds, with its smallest and
// largest value.
type spread struct{ med, min, max float64 }

// spreadOf summarizes xs, ignoring NaNs; all NaN (or none) is NaN.
func spreadOf(xs []float64) spread {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return spread{math.NaN(), math.NaN(), math.NaN()}
	}
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{med, v[0], v[len(v)-1]}
}

// over applies f to each round and summarizes.
func over(rs []round, f func(round) float64) spread {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return spreadOf(xs)
}

// format prints the median with its range, in prec decimals.
func (s spread) format(prec int) string {
	if math.IsNaN(s.med) {
		return "n/a"
	}
	if s.min == s.max {
		return num(s.med, prec)
	}
	return num(s.med, prec) + " (" + num(s.min, prec) + "–" + num(s.max, prec) + ")"
}

// num prints x with prec decimals and thousands separators.
func num(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	s := strconv.FormatFloat(math.Abs(x), 'f', prec, 64)
	whole, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	if x < 0 {
		b.WriteByte('-')
	}
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	return b.String()
}

// pctMs is a round's q-quantile latency in ms, for over.
func pctMs(q float64) func(round) float64 {
	return func(r round) float64 { return float64(r.pct(q)) / float64(time.Millisecond) }
}

// pooled is one round of rs's calls together: its quantiles are the run's,
// not a round's. A tail event rarer than a round (a collection of a large
// heap) shows in few rounds' quantiles, so a median of rounds can hide it;
// pooled, it counts for the calls it delayed.
func pooled(rs []round) round {
	var p round
	for _, r := range rs {
		p.ops += r.ops
		p.elapsed += r.elapsed
		p.lat = append(p.lat, r.lat...)
	}
	slices.Sort(p.lat)
	return p
}

// ratio is a ÷ b, NaN when either is unknown or b is zero.
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

// resultFields are the RESULT line's figures, in their order, with the
// decimals each is printed with.
var resultFields = []struct {
	name string
	prec int
}{
	{"cycle_ratio", 2},
	{"cycle_ratio_c1", 2},
	{"replay_ratio", 2},
	{"replay_vs_echo", 2},
	{"replay_ratio_10k", 2},
	{"replay_miss_ratio", 2},
	{"writes_per_intent", 2},
	{"heartbeat_writes_per_s", 2},
	{"acquire_p99_1m_vs_1k", 2},
	{"queue_page_1m_vs_1k", 2},
	{"bytes_per_intent", 0},
	{"rss_mb", 0},
}

// results holds the RESULT line's figures by name; a figure not measured
// (its workload not run, or not measurable against external servers) is
// missing or NaN and prints as n/a.
type results map[string]float64

// line is the RESULT line: every field, in order, even those not measured.
func (r results) line() string {
	var b strings.Builder
	b.WriteString("RESULT")
	for _, f := range resultFields {
		v, ok := r[f.name]
		s := "n/a"
		if ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
			s = strconv.FormatFloat(v, 'f', f.prec, 64)
		}
		b.WriteString(" " + f.name + "=" + s)
	}
	return b.String()
}

// table prints rows as an aligned text table, the first row its header.
func table(w io.Writer, rows [][]string) {
	widths := make([]int, 0)
	for _, row := range rows {
		for i, c := range row {
			n := len([]rune(c))
			if i >= len(widths) {
				widths = append(widths, n)
			} else if n > widths[i] {
				widths[i] = n
			}
		}
	}
	for j, row := range rows {
		var b strings.Builder
		for i, c := range row {
			pad := widths[i] - len([]rune(c))
			if i == 0 {
				b.WriteString(c + strings.Repeat(" ", pad))
			} else {
				b.WriteString("  " + strings.Repeat(" ", pad) + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		if j == 0 {
			total := 0
			for _, wd := range widths {
				total += wd + 2
			}
			fmt.Fprintln(w, strings.Repeat("-", total-2))
		}
	}
	fmt.Fprintln(w)
}
