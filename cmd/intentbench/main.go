// Command intentbench measures intentd against the raw etcd writes beneath
// it, in one run, on one machine: every server in a process of its own,
// every comparison in interleaved rounds (A, B, A, B …), each figure the
// median of its rounds with their minimum and maximum.
//
//	go run ./cmd/intentbench
//
// It starts intentd (intentd's own command, as cmd/intentd runs it, with
// its default embedded etcd, fsync on, rate limits off), a bare embedded
// etcd with its defaults as the raw peer, and a gRPC server answering
// health checks as the floor of any gRPC service, then runs the workloads
// named by --workloads:
//
//   - cycle: a fresh intent, Acquire with register (EXECUTE) then Complete,
//     against two raw CAS transactions on the raw etcd (create if absent,
//     update if unchanged; same payload), at each --levels concurrency;
//   - replay: Acquire of a COMPLETED intent, against a raw linearizable Get
//     of the same record and against the health check; then --replay-keys
//     distinct COMPLETED intents retried round-robin, against raw Gets of
//     as many records, on intentd and on an intentd of its own with the
//     smallest cache, where every replay reads etcd (replaykeys.go), the
//     latter beside a front that answers the same retries with intentd's
//     stored answers and does nothing else, the floor of a miss (front.go);
//   - contention: --contention-workers workers on --contention-intents
//     intents at a time (every intent must be executed exactly once);
//   - heartbeat: --heartbeat-intents intents held by --heartbeat-workers
//     workers for --heartbeat-duration: the etcd writes per second that
//     keeping them alive causes;
//   - scale: Acquire and review-queue page latency with --scale-small
//     against --scale-large stored intents (two intentds of their own);
//     then intentd's peak RSS with the large store, and the bytes in use
//     per retained intent after compaction and defragmentation;
//   - tombstones (not in the default run: storing a million takes
//     minutes): Register and Acquire of tombstoned keys, and Acquire with
//     register of fresh ones, with --tombstones stored, against the same
//     in an earlier version's intentd (--tombstone-baseline); what the
//     tombstones cost intentd's RSS and etcd's database (tombstones.go);
//   - gateway (not in the default run): a worker's cycle through the
//     fencing gateway (intentd gateway) to a trivial upstream, against
//     intentd's cycle, at each --levels concurrency; its figures on a line
//     of their own, GATEWAY ... (gateway.go);
//   - archive (not in the default run; issue 26): intentd with a PostgreSQL
//     archive (--archive-dsn, or a server of its own from Debian's
//     packages) against intentd without one: etcd's database in use as
//     retained intents grow from --archive-intents to ten times as many,
//     the cycle at C=1 and C=64, replays answered from the archive (and
//     byte for byte the answer before the move), the archive's bytes per
//     intent, and with --archive-scale new registrations and archived
//     replays before and after the archive grows to that many rows in
//     bulk; its figures on a line of their own, ARCHIVE ... (archive.go,
//     archivescale.go).
//
// CPU time per operation of each server process comes from
// /proc/<pid>/stat, memory from /proc/<pid>/status. It prints a table per
// workload and ends with one line:
//
//	RESULT cycle_ratio=… cycle_ratio_c1=… replay_ratio=… replay_vs_echo=… replay_ratio_10k=… replay_miss_ratio=… writes_per_intent=… heartbeat_writes_per_s=… acquire_p99_1m_vs_1k=… queue_page_1m_vs_1k=… bytes_per_intent=… rss_mb=…
//
// (n/a for a figure not measured). docs/PERFORMANCE.md says what each
// figure means. --intentd-addr and --etcd-endpoints measure running
// servers instead (their CPU and memory are then unknown); the scale
// workload always starts its own. Exit status: 0 after a full run, 1 when
// a server or a call fails, 2 for a bad flag.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/intentd/intentd/internal/run/cliflag"
)

// workloads in the order they run: the default run; optionalWorkloads run
// only when --workloads names them, after those.
var (
	workloads         = []string{"replay", "cycle", "contention", "heartbeat", "scale"}
	optionalWorkloads = []string{"tombstones", "gateway", "archive"}
)

// config is the run's settings, from the flags.
type config struct {
	duration          time.Duration
	rounds            int
	levels            []int
	replayLevels      []int
	replayKeys        int // distinct COMPLETED intents retried round-robin (replaykeys.go)
	payload           int
	payloadText       string
	workloads         []string
	contentionWorkers int
	contentionIntents int
	hbWorkers         int
	hbIntents         int
	hbDuration        time.Duration
	hbTTL             time.Duration
	scaleSmall        int
	scaleLarge        int
	scaleWorkers      int
	// scaleEtcdApart runs the scale workload's intentds on etcds in
	// processes of their own, so that intentd's memory is told from its
	// store's.
	scaleEtcdApart bool
	intentdAddr    string
	intentdEtcd    []string
	etcdEndpoints  []string
	// heapProfiles, if set, is where each started intentd's heap profile
	// is written when its memory is reported.
	heapProfiles string
	// tombstones is how many tombstones the tombstones workload stores;
	// tombstoneBaseline an earlier intentd binary it measures beside this
	// one ("": none); tombstoneWorkers its concurrency.
	tombstones        int
	tombstoneBaseline string
	tombstoneWorkers  int
	// archiveDSN is the PostgreSQL the archive workload archives into
	// ("": a server of its own); archiveIntents the N of its etcd growth
	// curve (N to 10·N); archiveReplayKeys the intents it replays;
	// archiveScale the rows its scale phase grows the archive to (0: no
	// such phase).
	archiveDSN        string
	archiveIntents    int
	archiveReplayKeys int
	archiveScale      int
}

func (c config) runs(w string) bool { return slices.Contains(c.workloads, w) }

// usageError is a bad flag: nothing was started, exit 2.
type usageError struct{ err error }

func (u *usageError) Error() string { return u.err.Error() }

func bad(format string, args ...any) error { return &usageError{fmt.Errorf(format, args...)} }

// parseFlags reads and validates the flags; every error names its flag.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := pflag.NewFlagSet("intentbench", pflag.ContinueOnError)
	// pflag would print its own error and the usage; Main prints one line.
	fs.SetOutput(io.Discard)
	fs.DurationVar(&c.duration, "duration", time.Second, "length of one peer's share of one round")
	fs.IntVar(&c.rounds, "rounds", 3, "interleaved rounds per comparison")
	levels := fs.String("levels", "1,16,64,256", "cycle concurrency levels, comma-separated, ascending")
	replayLevels := fs.String("replay-levels", "1,64", "replay concurrency levels, comma-separated, ascending")
	fs.IntVar(&c.replayKeys, "replay-keys", 10000, "distinct COMPLETED intents the replay workload retries round-robin, on intentd with its default cache and on one with the smallest (every replay then reads etcd)")
	fs.IntVar(&c.payload, "payload", 300, "bytes of params and of result per intent (the raw peer writes as many)")
	fs.StringVar(&c.payloadText, "payload-text", "random", "what the payloads hold: random (letters and digits, as ids and tokens: they hardly compress) or repeat (one letter over and over: compresses to nothing)")
	all := append(slices.Clone(workloads), optionalWorkloads...)
	list := fs.String("workloads", strings.Join(workloads, ","), "workloads to run, comma-separated: "+strings.Join(all, ", ")+" ("+strings.Join(optionalWorkloads, " and ")+" only when named)")
	fs.IntVar(&c.contentionWorkers, "contention-workers", 64, "workers in the contention workload")
	fs.IntVar(&c.contentionIntents, "contention-intents", 8, "intents they contend for at a time")
	fs.IntVar(&c.hbWorkers, "heartbeat-workers", 50, "workers in the heartbeat workload, one session each")
	fs.IntVar(&c.hbIntents, "heartbeat-intents", 1000, "intents they hold")
	fs.DurationVar(&c.hbDuration, "heartbeat-duration", 30*time.Second, "how long the heartbeat workload counts etcd writes")
	fs.DurationVar(&c.hbTTL, "session-ttl", 15*time.Second, "TTL of the heartbeat workload's sessions; they heartbeat every TTL/3")
	fs.IntVar(&c.scaleSmall, "scale-small", 1000, "completed intents stored in the small store of the scale workload")
	fs.IntVar(&c.scaleLarge, "scale-large", 1000000, "completed intents stored in the large store (the figures' '1m'; seeding a million takes about 35 s on 2 cores)")
	fs.IntVar(&c.scaleWorkers, "scale-workers", 16, "concurrent Acquires in the scale workload")
	fs.BoolVar(&c.scaleEtcdApart, "scale-etcd-apart", false, "run the scale workload's intentds on etcds in processes of their own (as with an external etcd cluster), so that the memory table shows intentd's and its etcd's apart")
	fs.StringVar(&c.intentdAddr, "intentd-addr", "", "measure a running intentd at this gRPC address instead of starting one (plaintext, no authentication)")
	intentdEtcd := fs.String("intentd-etcd", "", "with --intentd-addr: its etcd's endpoints, comma-separated, to count the revisions it writes")
	fs.IntVar(&c.tombstones, "tombstones", 1000000, "tombstones stored in each intentd of the tombstones workload")
	fs.StringVar(&c.tombstoneBaseline, "tombstone-baseline", "", "an earlier version's intentd binary, measured beside this version's in the tombstones workload (empty: this version's alone)")
	fs.IntVar(&c.tombstoneWorkers, "tombstone-workers", 1, "concurrent calls in the tombstones workload")
	fs.StringVar(&c.archiveDSN, "archive-dsn", "", "the archive workload's PostgreSQL: a database it may fill (empty: it starts a server of its own from Debian's packages, scripts/install-postgres.sh)")
	fs.IntVar(&c.archiveIntents, "archive-intents", 2000, "retained intents at the first point of the archive workload's etcd growth curve; it ends at ten times as many")
	fs.IntVar(&c.archiveReplayKeys, "archive-replay-keys", 2000, "archived intents the archive workload replays round-robin, far more than the smallest cache holds")
	fs.IntVar(&c.archiveScale, "archive-scale", 0, "rows the archive workload's scale phase grows the archive to in bulk, comparing new registrations and archived replays before and after (0: no scale phase; issue 26's target is 10000000, about 12 GB of PostgreSQL)")
	fs.StringVar(&c.heapProfiles, "heap-profiles", "", "write each started intentd's heap profile (pprof, in use after a GC) into this directory when its memory is reported: <name>.heap")
	etcdEndpoints := fs.String("etcd-endpoints", "", "use this running etcd cluster (comma-separated endpoints) as the raw peer instead of starting one; it must not be intentd's")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stderr, "Usage of intentbench (see docs/PERFORMANCE.md):\n%s", fs.FlagUsages())
			return c, err
		}
		return c, &usageError{cliflag.Explain(err)}
	}
	if fs.NArg() > 0 {
		return c, bad("unexpected argument %q: intentbench takes flags only", fs.Arg(0))
	}
	var err error
	if c.levels, err = parseLevels("--levels", *levels); err != nil {
		return c, err
	}
	if c.replayLevels, err = parseLevels("--replay-levels", *replayLevels); err != nil {
		return c, err
	}
	c.intentdEtcd, c.etcdEndpoints = splitList(*intentdEtcd), splitList(*etcdEndpoints)
	for _, w := range splitList(*list) {
		if !slices.Contains(all, w) {
			return c, bad("--workloads %q: unknown workload %q, want some of %s", *list, w, strings.Join(all, ", "))
		}
	}
	for _, w := range all { // in their order, each once
		if slices.Contains(splitList(*list), w) {
			c.workloads = append(c.workloads, w)
		}
	}
	switch {
	case len(c.workloads) == 0:
		return c, bad("--workloads %q: want at least one of %s", *list, strings.Join(all, ", "))
	case c.duration < 100*time.Millisecond:
		return c, bad("--duration %s: want at least 100ms", c.duration)
	case c.rounds < 1:
		return c, bad("--rounds %d: want at least 1", c.rounds)
	case c.replayKeys < 1:
		return c, bad("--replay-keys %d: want at least 1", c.replayKeys)
	case c.payload < 16 || c.payload > 65536:
		return c, bad("--payload %d: want 16 to 65536 bytes", c.payload)
	case c.payloadText != "random" && c.payloadText != "repeat":
		return c, bad("--payload-text %q: want random or repeat", c.payloadText)
	case c.contentionWorkers < 1 || c.contentionIntents < 1:
		return c, bad("--contention-workers %d, --contention-intents %d: want at least 1 each", c.contentionWorkers, c.contentionIntents)
	case c.hbWorkers < 1:
		return c, bad("--heartbeat-workers %d: want at least 1", c.hbWorkers)
	case c.hbIntents < c.hbWorkers || (c.hbIntents+c.hbWorkers-1)/c.hbWorkers > 128:
		return c, bad("--heartbeat-intents %d: want at least --heartbeat-workers (%d) and at most 128 per worker (a heartbeat names at most 128 leases)", c.hbIntents, c.hbWorkers)
	case c.hbDuration <= 0:
		return c, bad("--heartbeat-duration %s: want more than 0", c.hbDuration)
	case c.hbTTL < 2*time.Second || c.hbTTL > 300*time.Second:
		return c, bad("--session-ttl %s: want 2s to 300s (the API's range)", c.hbTTL)
	case c.scaleSmall < 1:
		return c, bad("--scale-small %d: want at least 1", c.scaleSmall)
	case c.scaleLarge <= c.scaleSmall:
		return c, bad("--scale-large %d: want more than --scale-small (%d)", c.scaleLarge, c.scaleSmall)
	case c.scaleWorkers < 1:
		return c, bad("--scale-workers %d: want at least 1", c.scaleWorkers)
	case c.tombstones < 2:
		return c, bad("--tombstones %d: want at least 2", c.tombstones)
	case c.tombstoneWorkers < 1:
		return c, bad("--tombstone-workers %d: want at least 1", c.tombstoneWorkers)
	case c.archiveIntents < 1:
		return c, bad("--archive-intents %d: want at least 1", c.archiveIntents)
	case c.archiveReplayKeys < 1:
		return c, bad("--archive-replay-keys %d: want at least 1", c.archiveReplayKeys)
	case c.archiveScale < 0:
		return c, bad("--archive-scale %d: want 0 (no scale phase) or the archive's rows", c.archiveScale)
	case len(c.intentdEtcd) > 0 && c.intentdAddr == "":
		return c, bad("--intentd-etcd: only with --intentd-addr (a started intentd's etcd is known)")
	}
	return c, nil
}

// parseLevels reads an ascending list of concurrency levels.
func parseLevels(flag, s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 4096 {
			return nil, bad("%s %q: %q is not a concurrency level, want whole numbers from 1 to 4096", flag, s, f)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, bad("%s %q: want ascending levels", flag, s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, bad("%s %q: want at least one level", flag, s)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func main() {
	if code, ok := runChild(); ok {
		os.Exit(code)
	}
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the benchmark with args and returns its exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "intentbench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "intentbench:", err)
		return 1
	}
	return 0
}

func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	dir, err := os.MkdirTemp("", "intentbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	progress := func(format string, args ...any) {
		fmt.Fprintf(stderr, "intentbench %6s  %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, args...))
	}
	b, err := newBench(cfg, stdout, progress, dir)
	if err != nil {
		return err
	}
	// The machine's load average says how far other work may have moved
	// the figures (the ratios, measured in adjacent rounds, less so).
	fmt.Fprintf(stdout, "intentbench: %s, %d CPUs, GOMAXPROCS %d; workloads %s; load average %s\n\n", runtime.Version(), runtime.NumCPU(), runtime.GOMAXPROCS(0), strings.Join(cfg.workloads, ", "), loadAverage())
	// The scale stores take most of a minute to seed: when the heartbeat
	// workload runs, they are seeded while it waits out its intervals.
	var seeding chan scalePrep // once the preparation started
	if cfg.runs("scale") && cfg.runs("heartbeat") {
		b.whileHeartbeat = func() {
			seeding = make(chan scalePrep, 1)
			go func() {
				st, err := b.prepareScale(ctx)
				seeding <- scalePrep{st, err}
			}()
		}
	}
	if cfg.runs("replay") || cfg.runs("cycle") || cfg.runs("contention") || cfg.runs("heartbeat") || cfg.runs("gateway") {
		if err := b.runMain(ctx); err != nil {
			if seeding != nil {
				if p := <-seeding; p.stores != nil {
					p.stores.close()
				}
			}
			return err
		}
	}
	if cfg.runs("scale") {
		var p scalePrep
		if seeding != nil {
			p = <-seeding
		} else {
			p.stores, p.err = b.prepareScale(ctx)
		}
		if p.err != nil {
			return p.err
		}
		defer p.stores.close()
		if err := b.runScale(ctx, p.stores); err != nil {
			return err
		}
	}
	if cfg.runs("tombstones") {
		if err := b.runTombstones(ctx); err != nil {
			return err
		}
	}
	if cfg.runs("archive") {
		if err := b.runArchive(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "took %s; load average %s\n", time.Since(start).Round(time.Second), loadAverage())
	fmt.Fprintln(stdout, b.res.line())
	return nil
}

// scalePrep is what prepareScale returned.
type scalePrep struct {
	stores *scaleStores
	err    error
}

// runMain runs the workloads on the main intentd, next to the raw etcd
// and the echo server, and stops them all before the scale workload
// starts its own.
func (b *bench) runMain(ctx context.Context) error {
	var in *intentdServer
	var err error
	if b.cfg.intentdAddr != "" {
		in, err = externalIntentd(ctx, b.cfg.intentdAddr, b.cfg.intentdEtcd)
	} else {
		in, err = b.startIntentd(ctx, "intentd", nil)
	}
	if err != nil {
		return err
	}
	defer in.close()
	var raw *etcdServer
	if b.cfg.runs("replay") || b.cfg.runs("cycle") {
		if len(b.cfg.etcdEndpoints) > 0 {
			raw, err = externalEtcd(ctx, b.cfg.etcdEndpoints)
		} else {
			raw, err = startEtcd(ctx, b.dir, "raw-etcd")
		}
		if err != nil {
			return err
		}
		defer raw.close()
	}
	if b.cfg.runs("replay") {
		echo, err := startEcho(ctx, b.dir)
		if err != nil {
			return err
		}
		defer echo.close()
		if err := b.runReplay(ctx, in, raw, echo); err != nil {
			return err
		}
		if err := b.runReplayKeys(ctx, in, raw); err != nil {
			return err
		}
	}
	if b.cfg.runs("cycle") {
		if err := b.runCycle(ctx, in, raw); err != nil {
			return err
		}
	}
	if b.cfg.runs("contention") {
		if err := b.runContention(ctx, in); err != nil {
			return err
		}
	}
	if b.cfg.runs("gateway") {
		if err := b.runGateway(ctx, in); err != nil {
			return err
		}
	}
	if b.cfg.runs("heartbeat") {
		if in.etcd == nil {
			b.progress("heartbeat: intentd's etcd unknown (--intentd-etcd): its writes are not counted")
		}
		if err := b.runHeartbeat(ctx, in); err != nil {
			return err
		}
	}
	if m := in.proc.memory(); m.peak > 0 {
		b.res["rss_mb"] = float64(m.peak) / (1 << 20)
		fmt.Fprintf(b.out, "intentd after these workloads: RSS %s (anonymous %s), peak %s; Go heap in use %s, of which its caches %s (estimated)\n\n", mib(m.rss), mib(m.anon), mib(m.peak), mib(in.heap()), mib(in.cacheBytes()))
	}
	return b.saveHeap(in)
}

// loadAverage is the 1, 5 and 15 minute load averages of /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
