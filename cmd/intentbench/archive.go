package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
)

// The archive workload (only when named; issue 26): intentd with a
// PostgreSQL archive against intentd without one, each an intentd of its
// own on an embedded etcd of its own, the same flags but the archive's
// (--archive-dsn, --archive-after archiveAfter; both --janitor-interval
// archiveJanitor, so that records move soon after they are due, and
// --health-interval archiveHealth, so that intentd counts the final
// records etcd holds every few seconds).
//
//   - etcd stays small: --archive-intents (N) completed intents through
//     the archived intentd's API, then more up to 10·N; at each point of
//     the curve, once the archive holds every one of them, etcd is
//     compacted and defragmented and its database in use read;
//   - cycle: Acquire with register (EXECUTE), Complete, with the archive
//     against without, at C=1 and C=64, in interleaved rounds;
//   - replay: --archive-replay-keys COMPLETED intents on each intentd, the
//     archived one's replay answered (and kept, deterministically
//     marshalled) before its record moves; once moved, both intentds are
//     restarted with the smallest cache (missCacheBytes), every answer is
//     compared byte for byte with the one kept, and replays round-robin
//     over the keys are timed at C=1: from the archive against from etcd;
//   - bytes: PostgreSQL's pg_total_relation_size of the intents table
//     (heap, TOAST, indexes) after VACUUM ANALYZE, ÷ its rows.
//
// PostgreSQL is the one --archive-dsn names (a database the benchmark may
// fill), or else a server of its own from Debian's packages (the newest
// under pgBinDirs: initdb in a temporary directory, a free loopback port,
// PostgreSQL's defaults otherwise, fsync on). Without either the workload
// is skipped and says so. Its figures go on a line of their own (ARCHIVE
// ...), not into RESULT (see docs/PERFORMANCE.md, "The archive in
// intentbench", for the figures and their targets):
//
//	archive_cycle_ratio_c1     cycles/s with the archive ÷ without, C=1 (target ≥ 0.9)
//	archive_cycle_ratio_c64    the same at C=64 (target ≥ 0.9)
//	archive_replay_p50_ms      p50 of a replay answered from the archive, C=1
//	archive_replay_p99_ms      its p99 (target ≤ 5)
//	archive_replay_identical   every answer after the move byte for byte the one before (target true)
//	archive_bytes_per_intent   the archive's bytes per archived intent (target ≤ 1,200)
//	archive_etcd_growth        etcd's database in use at 10·N retained intents ÷ at N (target ≤ 1.10)
//	archive_scale_register     a new registration's p99 with --archive-scale rows ÷ before (target ≤ 1.3; archivescale.go)
//	archive_scale_replay       an archived replay's p99 the same way (target ≤ 1.3)

const (
	// archiveAfter is the archived intentd's --archive-after: short, so
	// that the workload's records move within seconds, and long enough
	// that an answer read right after the Complete is read before the move.
	archiveAfter = 2 * time.Second
	// archiveJanitor is both intentds' --janitor-interval: the archiver
	// runs in the janitor's sweep.
	archiveJanitor = 500 * time.Millisecond
	// archiveHealth is both intentds' --health-interval: intentd counts
	// the final records etcd holds every five of them (depthsEvery).
	archiveHealth = 400 * time.Millisecond
	depthsEvery   = 5 * archiveHealth
	// archiveLevels are the cycle's concurrencies.
	archiveLow, archiveHigh = 1, 64
	// archiveDB is the database the workload's own PostgreSQL server
	// archives into.
	archiveDB = "intentbench"
)

// pgBinDirs is where the workload looks for PostgreSQL's server binaries:
// Debian's layout, one directory per major version (a variable for the
// tests).
var pgBinDirs = "/usr/lib/postgresql/*/bin"

// errNoPostgres: no PostgreSQL server binaries are installed.
var errNoPostgres = errors.New("no PostgreSQL server binaries (initdb and postgres)")

// archiveSkipped is what the workload prints when it cannot run.
const archiveSkipped = "skipped: archive workload needs PostgreSQL (scripts/install-postgres.sh)"

// growthSteps are the curve's points, in multiples of --archive-intents.
var growthSteps = []int{1, 2, 5, 10}

// archiveFigures are the workload's figures; NaN (or identical unchecked)
// prints as n/a.
type archiveFigures struct {
	cycleC1, cycleC64      float64
	replayP50, replayP99   float64
	checked, identical     bool
	bytesPerIntent, growth float64
	// scaleRegister and scaleReplay: the scale phase's p99 ratios.
	scaleRegister, scaleReplay float64
}

func noArchiveFigures() archiveFigures {
	nan := math.NaN()
	return archiveFigures{cycleC1: nan, cycleC64: nan, replayP50: nan, replayP99: nan, bytesPerIntent: nan, growth: nan, scaleRegister: nan, scaleReplay: nan}
}

// line is the ARCHIVE line: every figure, in order, even those not
// measured.
func (f archiveFigures) line() string {
	v := func(x float64, prec int) string {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return "n/a"
		}
		return strconv.FormatFloat(x, 'f', prec, 64)
	}
	same := "n/a"
	if f.checked {
		same = strconv.FormatBool(f.identical)
	}
	return fmt.Sprintf("ARCHIVE archive_cycle_ratio_c1=%s archive_cycle_ratio_c64=%s archive_replay_p50_ms=%s archive_replay_p99_ms=%s archive_replay_identical=%s archive_bytes_per_intent=%s archive_etcd_growth=%s archive_scale_register=%s archive_scale_replay=%s",
		v(f.cycleC1, 2), v(f.cycleC64, 2), v(f.replayP50, 2), v(f.replayP99, 2), same, v(f.bytesPerIntent, 0), v(f.growth, 3), v(f.scaleRegister, 2), v(f.scaleReplay, 2))
}

// archiveRun is one run of the workload: its PostgreSQL, its two intentds.
type archiveRun struct {
	b           *bench
	pg          *pgServer // nil: --archive-dsn's
	dsn         string
	db          *pgx.Conn
	plain, arch *intentdServer
	rows0       int64 // the archive's rows before the workload's first intent
	created     int64 // intents completed on the archived intentd
	fig         archiveFigures
}

// growthPoint is one point of the curve.
type growthPoint struct {
	retained, etcdKeys int64
	finalInEtcd        float64 // intentd_etcd_final_intents
	inUse              int64
	moved              time.Duration // from the last Complete until the archive held them all
}

func (b *bench) runArchive(ctx context.Context) error {
	r := &archiveRun{b: b, fig: noArchiveFigures(), dsn: b.cfg.archiveDSN}
	defer r.close()
	if r.dsn == "" {
		bin, err := pgBin(pgBinDirs)
		if errors.Is(err, errNoPostgres) {
			fmt.Fprintf(b.out, "archive: %s (%v)\n%s\n\n", archiveSkipped, err, r.fig.line())
			return nil
		}
		if err != nil {
			return err
		}
		b.progress("archive: starting PostgreSQL from %s", bin)
		if r.pg, err = startPostgres(ctx, bin, b.dir); err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		if r.dsn, err = r.pg.createDB(ctx, archiveDB); err != nil {
			return fmt.Errorf("archive: %w", err)
		}
	}
	err := r.run(ctx)
	fmt.Fprintf(b.out, "%s\n\n", r.fig.line())
	return err
}

func (r *archiveRun) close() {
	for _, s := range []*intentdServer{r.plain, r.arch} {
		if s != nil {
			s.close()
		}
	}
	if r.db != nil {
		r.db.Close(context.Background())
	}
	if r.pg != nil {
		r.pg.stop()
	}
}

// flags are an intentd's flags: the archive's for the archived one, and
// with a small cache the smallest.
func (r *archiveRun) flags(archived, smallCache bool) []string {
	f := []string{"--janitor-interval", archiveJanitor.String(), "--health-interval", archiveHealth.String()}
	if archived {
		f = append(f, "--archive-dsn", r.dsn, "--archive-after", archiveAfter.String())
	}
	if smallCache {
		f = append(f, "--cache-bytes", strconv.Itoa(missCacheBytes))
	}
	return f
}

func (r *archiveRun) run(ctx context.Context) error {
	b := r.b
	var err error
	if r.plain, err = b.startIntentdBin(ctx, "archive-plain", "", nil, r.flags(false, false)...); err != nil {
		return err
	}
	if r.arch, err = b.startIntentdBin(ctx, "archive-archived", "", nil, r.flags(true, false)...); err != nil {
		return err
	}
	// intentd made the schema at start.
	if r.db, err = pgx.Connect(ctx, r.dsn); err != nil {
		return fmt.Errorf("archive: connecting to --archive-dsn: %w", err)
	}
	var version string
	if err := r.db.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return err
	}
	if r.rows0, err = r.rows(ctx); err != nil {
		return err
	}
	where := "a PostgreSQL server of its own (defaults, fsync on)"
	if r.pg == nil {
		where = "--archive-dsn's PostgreSQL"
	}
	fmt.Fprintf(b.out, "archive: PostgreSQL %s, %s; intentd with --archive-after %s against intentd without an archive, both --janitor-interval %s and --health-interval %s\n\n", version, where, archiveAfter, archiveJanitor, archiveHealth)

	if err := r.growth(ctx); err != nil {
		return err
	}
	if err := r.cycle(ctx); err != nil {
		return err
	}
	replayKeys, err := r.replay(ctx)
	if err != nil {
		return err
	}
	if err := r.bytes(ctx); err != nil {
		return err
	}
	if b.cfg.archiveScale == 0 {
		return nil
	}
	return r.scale(ctx, replayKeys)
}

// rows is how many intents the archive holds.
func (r *archiveRun) rows(ctx context.Context) (int64, error) {
	var n int64
	if err := r.db.QueryRow(ctx, "SELECT count(*) FROM intents").Scan(&n); err != nil {
		return 0, fmt.Errorf("archive: counting its rows: %w", err)
	}
	return n, nil
}

// waitMoved waits until the archive holds every intent completed on the
// archived intentd, then until intentd's own count of the final records
// etcd holds (intentd_etcd_final_intents, taken every depthsEvery) reads
// 0 in a count taken after that.
func (r *archiveRun) waitMoved(ctx context.Context) error {
	want := r.rows0 + r.created
	limit := 5*time.Minute + time.Duration(r.created)*time.Millisecond
	deadline := time.Now().Add(limit)
	wait := func() error {
		if err := r.arch.child.exited(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
			return nil
		}
	}
	for {
		n, err := r.rows(ctx)
		if err != nil {
			return err
		}
		if n >= want {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("archive: %d of %d intents moved to the archive within %s", n-r.rows0, r.created, limit)
		}
		if err := wait(); err != nil {
			return err
		}
	}
	fresh := time.Now().Add(depthsEvery + 100*time.Millisecond)
	for time.Now().Before(fresh) || r.arch.metric("intentd_etcd_final_intents") != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("archive: every intent in the archive, but intentd_etcd_final_intents still %s after %s", num(r.arch.metric("intentd_etcd_final_intents"), 0), limit)
		}
		if err := wait(); err != nil {
			return err
		}
	}
	return nil
}

// growth completes intents on the archived intentd up to each point of
// the curve and reads etcd's database in use once they moved.
func (r *archiveRun) growth(ctx context.Context) error {
	b, n := r.b, r.b.cfg.archiveIntents
	ids, err := b.sessions(ctx, r.arch, archiveHigh, cycleTTL)
	if err != nil {
		return err
	}
	defer b.closeSessions(r.arch, ids)
	var points []growthPoint
	for _, step := range growthSteps {
		target := int64(step * n)
		if more := target - r.created; more > 0 {
			b.progress("archive, etcd growth: completing %d intents (%d in all)", more, target)
			if _, err := b.completeMany(ctx, r.arch, ids, "g", int(more)); err != nil {
				return fmt.Errorf("archive, etcd growth: %w", err)
			}
			r.created = target
		}
		t := time.Now()
		if err := r.waitMoved(ctx); err != nil {
			return err
		}
		p := growthPoint{moved: time.Since(t)}
		if p.retained, err = r.rows(ctx); err != nil {
			return err
		}
		if p.inUse, err = compactDefrag(ctx, r.arch.etcd); err != nil {
			return fmt.Errorf("archive, etcd growth: %w", err)
		}
		if p.etcdKeys, err = countKeys(ctx, r.arch.etcd); err != nil {
			return err
		}
		points = append(points, p)
	}
	r.fig.growth = ratio(float64(points[len(points)-1].inUse), float64(points[0].inUse))
	fmt.Fprintf(b.out, "archive, etcd growth: completed intents through the archived intentd's API (C=%d), up to %d; at each point, once the archive held them all and intentd counted none final in etcd, etcd compacted and defragmented; moved within: from the last Complete (the first point waits for the archiver's start)\n", archiveHigh, r.created)
	table(b.out, growthRows(points))
	return nil
}

// growthRows is the curve's table.
func growthRows(points []growthPoint) [][]string {
	rows := [][]string{{"retained intents (archive rows)", "etcd keys", "etcd db in use", "÷ first point", "all moved within"}}
	for _, p := range points {
		rows = append(rows, []string{
			num(float64(p.retained), 0), num(float64(p.etcdKeys), 0),
			kib(p.inUse), num(ratio(float64(p.inUse), float64(points[0].inUse)), 3),
			p.moved.Round(100 * time.Millisecond).String(),
		})
	}
	return rows
}

// kib prints bytes in KiB.
func kib(b int64) string {
	if b <= 0 {
		return "n/a"
	}
	return num(float64(b)/1024, 0) + " KiB"
}

// cycle compares the cycle with the archive and without at C=1 and C=64.
func (r *archiveRun) cycle(ctx context.Context) error {
	b := r.b
	var ids [2][]string
	servers := []*intentdServer{r.arch, r.plain}
	for i, s := range servers {
		var err error
		if ids[i], err = b.sessions(ctx, s, archiveHigh, cycleTTL); err != nil {
			return err
		}
		defer b.closeSessions(s, ids[i])
	}
	var archCycles atomic.Int64
	peers := []peer{
		{"with the archive", r.arch.proc, r.arch.etcd, func(ctx context.Context, w int) (time.Duration, error) {
			archCycles.Add(1)
			return 0, b.cycle(ctx, r.arch, ids[0][w], b.key("ac"))
		}},
		{"without", r.plain.proc, r.plain.etcd, func(ctx context.Context, w int) (time.Duration, error) {
			return 0, b.cycle(ctx, r.plain, ids[1][w], b.key("pc"))
		}},
	}
	rows := [][]string{{"cycle", "with /s", "without /s", "with ÷ without", "with p50 / p99 ms", "without p50 / p99 ms", "with CPU µs/cycle", "without CPU µs/cycle", "PostgreSQL CPU µs/cycle", "archive reads/cycle"}}
	for _, c := range []int{archiveLow, archiveHigh} {
		reads0, cycles0, pg0 := r.arch.metric("intentd_archive_reads_total"), archCycles.Load(), r.pg.cpu()
		rs, err := b.interleave(ctx, "archive, cycle", peers, c)
		if err != nil {
			return err
		}
		cycles := archCycles.Load() - cycles0
		reads := ratio(r.arch.metric("intentd_archive_reads_total")-reads0, float64(cycles))
		pgCPU := perOp(pg0, r.pg.cpu(), cycles)
		ratio := pairRatio(rs[0], rs[1])
		if c == archiveLow {
			r.fig.cycleC1 = ratio.med
		} else {
			r.fig.cycleC64 = ratio.med
		}
		rows = append(rows, []string{
			fmt.Sprintf("C=%d", c),
			over(rs[0], round.rate).format(0), over(rs[1], round.rate).format(0), ratio.format(2),
			latencies(rs[0]), latencies(rs[1]),
			over(rs[0], round.cpuPerOp).format(0), over(rs[1], round.cpuPerOp).format(0),
			num(pgCPU, 0), num(reads, 2),
		})
	}
	r.created += archCycles.Load()
	fmt.Fprintf(b.out, "archive, cycle: fresh intent, Acquire with register (EXECUTE) + Complete, with the archive against without, %d B payloads; %d rounds of %s each, interleaved; median (min–max); CPU: intentd's (its embedded etcd's included), and PostgreSQL's (the postmaster and its live children, warm-ups and the archiver's moves included) per cycle with the archive\n", b.cfg.payload, b.cfg.rounds, b.cfg.duration)
	table(b.out, rows)
	return nil
}

// answer is an Acquire's answer as deterministic bytes.
func answer(m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// kept is an archived intent's replay answer read before its move.
type kept struct {
	key    string
	answer []byte
}

// replay completes --archive-replay-keys intents on each intentd, keeps
// the archived one's answers read before the move, waits for the move,
// restarts both intentds with the smallest cache, compares the answers
// and times replays at C=1.
func (r *archiveRun) replay(ctx context.Context) ([]string, error) {
	b, n := r.b, r.b.cfg.archiveReplayKeys
	b.progress("archive, replay: completing %d intents on each intentd", n)
	ids, err := b.sessions(ctx, r.arch, 16, cycleTTL)
	if err != nil {
		return nil, err
	}
	keptAnswers, late, err := r.completeKeeping(ctx, ids, n)
	b.closeSessions(r.arch, ids)
	if err != nil {
		return nil, err
	}
	r.created += int64(n)
	if ids, err = b.sessions(ctx, r.plain, 16, cycleTTL); err != nil {
		return nil, err
	}
	plainKeys, err := b.completeMany(ctx, r.plain, ids, "pr", n)
	b.closeSessions(r.plain, ids)
	if err != nil {
		return nil, err
	}
	if err := r.waitMoved(ctx); err != nil {
		return nil, err
	}
	b.progress("archive, replay: restarting both intentds with --cache-bytes %d", missCacheBytes)
	for _, s := range []**intentdServer{&r.arch, &r.plain} {
		name, archived := (*s).name, *s == r.arch
		(*s).close()
		if *s, err = b.startIntentdBin(ctx, name, "", nil, r.flags(archived, true)...); err != nil {
			return nil, err
		}
	}
	var archIDs, plainIDs []string
	if archIDs, err = b.sessions(ctx, r.arch, 1, cycleTTL); err != nil {
		return nil, err
	}
	defer b.closeSessions(r.arch, archIDs)
	if plainIDs, err = b.sessions(ctx, r.plain, 1, cycleTTL); err != nil {
		return nil, err
	}
	defer b.closeSessions(r.plain, plainIDs)

	// Every answer, now from the archive, against the one before the move.
	reads0 := r.arch.metric("intentd_archive_reads_total")
	var differ []string
	for _, k := range keptAnswers {
		resp, err := r.arch.rpc.Acquire(ctx, b.acquireRequest(k.key, archIDs[0], "after-"+k.key))
		if err != nil {
			return nil, fmt.Errorf("archive, replay of the archived %s: %w", k.key, err)
		}
		got, err := answer(resp)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(got, k.answer) {
			differ = append(differ, k.key)
		}
	}
	checkReads := r.arch.metric("intentd_archive_reads_total") - reads0
	r.fig.checked, r.fig.identical = len(keptAnswers) > 0, len(differ) == 0

	var archNext, plainNext, archCalls atomic.Int64
	archKeys := make([]string, len(keptAnswers))
	for i, k := range keptAnswers {
		archKeys[i] = k.key
	}
	if len(archKeys) == 0 {
		return nil, fmt.Errorf("archive, replay: every answer was read too late to be before its move (%d)", late)
	}
	reads0, memory0, calls0, pg0 := r.arch.metric("intentd_archive_reads_total"), r.arch.metric("intentd_store_replays_from_memory_total"), archCalls.Load(), r.pg.cpu()
	rs, err := b.interleave(ctx, "archive, replay", []peer{
		{"from the archive", r.arch.proc, nil, b.replayOp(r.arch, archIDs[0], archKeys, &archNext, &archCalls)},
		{"from etcd, no archive", r.plain.proc, nil, b.replayOp(r.plain, plainIDs[0], plainKeys, &plainNext, nil)},
	}, archiveLow)
	if err != nil {
		return nil, err
	}
	calls := float64(archCalls.Load() - calls0)
	pgCPU := perOp(pg0, r.pg.cpu(), archCalls.Load()-calls0)
	readsPer := ratio(r.arch.metric("intentd_archive_reads_total")-reads0, calls)
	fromMemory := ratio(r.arch.metric("intentd_store_replays_from_memory_total")-memory0, calls)
	p50, p99 := pctMs(0.5), pctMs(0.99)
	r.fig.replayP50, r.fig.replayP99 = over(rs[0], p50).med, over(rs[0], p99).med

	fmt.Fprintf(b.out, "archive, replay: Acquire (with register, same fingerprint) of %d distinct COMPLETED intents round-robin at C=%d, each intentd restarted with --cache-bytes %d (its smallest) once they moved: from the archive, against the same of as many intents in etcd on the intentd without one; %d rounds of %s, interleaved\n",
		n, archiveLow, missCacheBytes, b.cfg.rounds, b.cfg.duration)
	table(b.out, [][]string{
		{"replay", "p50 ms", "p99 ms", "per s", "intentd CPU µs/call", "PostgreSQL CPU µs/call", "archive reads/replay", "from memory"},
		{"from the archive", over(rs[0], p50).format(2), over(rs[0], p99).format(2), over(rs[0], round.rate).format(0), over(rs[0], round.cpuPerOp).format(0), num(pgCPU, 0), num(readsPer, 2), percent(fromMemory)},
		{"from etcd, no archive", over(rs[1], p50).format(2), over(rs[1], p99).format(2), over(rs[1], round.rate).format(0), over(rs[1], round.cpuPerOp).format(0), "", "", ""},
		{"archive ÷ etcd", pairQuantileRatio(rs[0], rs[1], 0.5).format(2), pairQuantileRatio(rs[0], rs[1], 0.99).format(2), "", "", "", "", ""},
	})
	verdict := "byte for byte the same"
	if len(differ) > 0 {
		verdict = fmt.Sprintf("%d DIFFERENT (first: %s)", len(differ), differ[0])
	}
	fmt.Fprintf(b.out, "answers after the move against before it: %d compared, %s (%s archive reads for them); %d read too late to be before the move, not compared\n\n",
		len(keptAnswers), verdict, num(checkReads, 0), late)
	return archKeys, nil
}

// completeKeeping completes n fresh intents on the archived intentd with
// len(ids) workers and, right after each Complete, replays it and keeps
// the answer: read before its move when it came back within archiveAfter
// of the Acquire that began its cycle (the record is final only after
// that Acquire, and moves archiveAfter after it is final). Answers read
// later are not kept; late counts them.
func (r *archiveRun) completeKeeping(ctx context.Context, ids []string, n int) (out []kept, late int, err error) {
	b := r.b
	var mu sync.Mutex
	var next atomic.Int64
	var first firstError
	var wg sync.WaitGroup
	for w := range ids {
		wg.Go(func() {
			for int(next.Add(1)) <= n && first.get() == nil {
				key := b.key("ar")
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				t := time.Now()
				err := b.cycle(cctx, r.arch, ids[w], key)
				var resp *intentv1.AcquireResponse
				if err == nil {
					resp, err = r.arch.rpc.Acquire(cctx, b.acquireRequest(key, ids[w], "before-"+key))
				}
				in := time.Since(t) < archiveAfter
				cancel()
				var a []byte
				if err == nil && resp.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
					err = fmt.Errorf("replay of %s: outcome %v, want COMPLETED", key, resp.GetOutcome())
				}
				if err == nil {
					a, err = answer(resp)
				}
				if err != nil {
					first.set(fmt.Errorf("archive, replay: %w", err))
					return
				}
				mu.Lock()
				if in {
					out = append(out, kept{key, a})
				} else {
					late++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out, late, first.get()
}

// bytes reads the archive's size per intent: pg_total_relation_size of the
// intents table after VACUUM ANALYZE, ÷ its rows.
func (r *archiveRun) bytes(ctx context.Context) error {
	if _, err := r.db.Exec(ctx, "VACUUM (ANALYZE) intents"); err != nil {
		return fmt.Errorf("archive: VACUUM: %w", err)
	}
	var total, heap, indexes, rows int64
	if err := r.db.QueryRow(ctx, `SELECT pg_total_relation_size('intents'), pg_relation_size('intents'), pg_indexes_size('intents'), (SELECT count(*) FROM intents)`).Scan(&total, &heap, &indexes, &rows); err != nil {
		return fmt.Errorf("archive: its size: %w", err)
	}
	per := func(x int64) string { return num(ratio(float64(x), float64(rows)), 1) }
	r.fig.bytesPerIntent = ratio(float64(total), float64(rows))
	fmt.Fprintf(r.b.out, "archive, bytes: PostgreSQL's own sizes of the intents table after VACUUM ANALYZE, ÷ its rows (records of %d B payloads, as the cycle's)\n", r.b.cfg.payload)
	table(r.b.out, [][]string{
		{"rows", "total (pg_total_relation_size)", "per intent", "table", "per intent", "indexes", "per intent", "TOAST and maps, per intent"},
		{num(float64(rows), 0), kib(total), per(total), kib(heap), per(heap), kib(indexes), per(indexes), per(total - heap - indexes)},
	})
	return nil
}

// pgBin is the newest directory glob matches (one per major version,
// named by it) that holds both initdb and postgres.
func pgBin(glob string) (string, error) {
	dirs, _ := filepath.Glob(glob)
	best, bestMajor := "", -1
	for _, d := range dirs {
		major, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil || major <= bestMajor {
			continue
		}
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			best, bestMajor = d, major
		}
	}
	if best == "" {
		return "", fmt.Errorf("%w in %s", errNoPostgres, glob)
	}
	return best, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// pgServer is the workload's own PostgreSQL server: a cluster initdb made
// in a temporary directory of its own (its unix socket there too), serving
// 127.0.0.1 on a free port, trusting local connections as the superuser
// postgres. Run as root, initdb and postgres run as the user postgres
// (Debian's packages make it), or nobody where there is none: they refuse
// to run as root.
type pgServer struct {
	port int
	base string // data in base/data, the socket in base
	c    *child
}

// startPostgres makes a cluster with bin's initdb and starts bin's
// postgres on it, its log in logDir/postgres.log; the server dies with
// the benchmark.
func startPostgres(ctx context.Context, bin, logDir string) (_ *pgServer, err error) {
	// A unix socket's path is at most 107 bytes: a short directory of its
	// own, under the system's temporary directory, not the bench's.
	base, err := os.MkdirTemp("", "intentbench-pg-")
	if err != nil {
		return nil, err
	}
	p := &pgServer{base: base}
	defer func() {
		if err != nil {
			p.stop()
		}
	}()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = unprivileged(base); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(base, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C")
	initdb.Env = pgEnv()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, bytes.TrimSpace(out))
	}
	logPath := filepath.Join(logDir, "postgres.log")
	for range 3 { // another process may take the free port first
		addr, err := freeport.Loopback()
		if err != nil {
			return nil, err
		}
		_, port, _ := strings.Cut(addr, ":")
		if p.port, err = strconv.Atoi(port); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", port, "-k", base, "-c", "listen_addresses=127.0.0.1")
		cmd.Env = pgEnv()
		cmd.Stdout, cmd.Stderr = f, f
		// SIGQUIT, postgres's immediate shutdown, if the benchmark dies
		// first; a process group of its own keeps a terminal's ^C off it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
		err = cmd.Start()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("starting postgres: %w", err)
		}
		p.c = &child{name: "postgres", cmd: cmd, log: logPath, done: make(chan struct{})}
		go func(c *child) { c.err = cmd.Wait(); close(c.done) }(p.c)
		err = poll(ctx, p.c, "accepting connections", func(ctx context.Context) error {
			conn, err := pgx.Connect(ctx, p.dsn("postgres"))
			if err == nil {
				conn.Close(ctx)
			}
			return err
		})
		if err == nil {
			return p, nil
		}
		if p.c.exited() == nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		p.c = nil // it exited: another port
	}
	return nil, fmt.Errorf("postgres did not start on a free port; its log: %s", logPath)
}

// unprivileged is the credential postgres runs with when we are root, the
// base directory handed to that user.
func unprivileged(base string) (*syscall.Credential, error) {
	var u *user.User
	var err error
	for _, name := range []string{"postgres", "nobody"} {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("running as root, and neither user postgres nor nobody exists to run PostgreSQL as: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	if err := os.Chown(base, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// pgEnv is the environment of initdb and postgres: ours, without what
// would point them elsewhere or change their locale.
func pgEnv() []string {
	out := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=")
	})
	return append(out, "LC_ALL=C", "TZ=UTC")
}

// cpu is the CPU time, user and system, of the server's processes: the
// postmaster and its children alive now (its connections' backends, which
// the pools keep, and its background workers; each in a process group of
// its own), and those that have ended, which the postmaster reaped (a
// query's parallel workers, a connection closed): the kernel adds their
// time to the postmaster's children's time. Negative when unknown.
func (p *pgServer) cpu() time.Duration {
	if p == nil || p.c == nil {
		return -1
	}
	postmaster := p.c.pid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	var sum time.Duration
	add := func(c time.Duration) {
		if c > 0 {
			sum += c
		}
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, ok := proc{pid}.stat()
		switch {
		case !ok:
		case pid == postmaster:
			add(statTicks(f, statUtime))
			add(statTicks(f, statCutime))
		case len(f) > statPPid && f[statPPid] == strconv.Itoa(postmaster):
			add(statTicks(f, statUtime))
		}
	}
	return sum
}

// perOp is the CPU spent from c0 to c1 per op, in µs; NaN when unknown.
func perOp(c0, c1 time.Duration, ops int64) float64 {
	if c0 < 0 || c1 < 0 || ops <= 0 {
		return math.NaN()
	}
	return float64((c1 - c0).Microseconds()) / float64(ops)
}

// dsn names database db on the server, as the superuser, over loopback.
func (p *pgServer) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// createDB creates database name and returns its DSN.
func (p *pgServer) createDB(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, p.dsn("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return p.dsn(name), nil
}

// stop shuts the server down fast (SIGINT: sessions are ended, not waited
// for), immediately after 15 s, and removes its directory.
func (p *pgServer) stop() {
	if c := p.c; c != nil {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-c.done:
			case <-time.After(15 * time.Second):
				_ = c.cmd.Process.Signal(syscall.SIGQUIT)
				select {
				case <-c.done:
				case <-time.After(15 * time.Second):
					_ = c.cmd.Process.Kill()
					<-c.done
				}
			}
		}
	}
	os.RemoveAll(p.base)
}

// replayOp replays keys round-robin on s (Acquire with register, the same
// fingerprint) under session, wanting COMPLETED; calls, when set, counts
// them.
func (b *bench) replayOp(s *intentdServer, session string, keys []string, next, calls *atomic.Int64) op {
	return func(ctx context.Context, w int) (time.Duration, error) {
		i := next.Add(1)
		key := keys[int(i)%len(keys)]
		resp, err := s.rpc.Acquire(ctx, b.acquireRequest(key, session, fmt.Sprintf("ar-%s-%d", b.run, i)))
		if err != nil {
			return 0, fmt.Errorf("acquire %s: %w", key, err)
		}
		if resp.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
			return 0, fmt.Errorf("acquire %s: outcome %v, want COMPLETED", key, resp.GetOutcome())
		}
		if calls != nil {
			calls.Add(1)
		}
		return 0, nil
	}
}
