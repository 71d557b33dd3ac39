package main

import (
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestMain lets the test binary serve as the servers a real run starts
// (startChild runs this binary as intentd or etcd), as main does.
func TestMain(m *testing.M) {
	if code, ok := runChild(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// archiveLine is the ARCHIVE line's form.
var archiveLine = regexp.MustCompile(`^ARCHIVE archive_cycle_ratio_c1=(\S+) archive_cycle_ratio_c64=(\S+) archive_replay_p50_ms=(\S+) archive_replay_p99_ms=(\S+) archive_replay_identical=(true|false|n/a) archive_bytes_per_intent=(\S+) archive_etcd_growth=(\S+) archive_scale_register=(\S+) archive_scale_replay=(\S+)$`)

func TestArchiveLine(t *testing.T) {
	every := archiveFigures{cycleC1: 0.934, cycleC64: 1.016, replayP50: 0.8149, replayP99: 2.5, checked: true, identical: true, bytesPerIntent: 1158.4, growth: 1.0149, scaleRegister: 1.046, scaleReplay: 1.2}
	differ := every
	differ.identical = false
	partial := noArchiveFigures()
	partial.cycleC1, partial.growth = 0.5, math.Inf(1)
	for _, tc := range []struct {
		name string
		fig  archiveFigures
		want string
	}{
		{"every figure", every, "ARCHIVE archive_cycle_ratio_c1=0.93 archive_cycle_ratio_c64=1.02 archive_replay_p50_ms=0.81 archive_replay_p99_ms=2.50 archive_replay_identical=true archive_bytes_per_intent=1158 archive_etcd_growth=1.015 archive_scale_register=1.05 archive_scale_replay=1.20"},
		{"an answer that changed", differ, "ARCHIVE archive_cycle_ratio_c1=0.93 archive_cycle_ratio_c64=1.02 archive_replay_p50_ms=0.81 archive_replay_p99_ms=2.50 archive_replay_identical=false archive_bytes_per_intent=1158 archive_etcd_growth=1.015 archive_scale_register=1.05 archive_scale_replay=1.20"},
		{"nothing measured", noArchiveFigures(), "ARCHIVE archive_cycle_ratio_c1=n/a archive_cycle_ratio_c64=n/a archive_replay_p50_ms=n/a archive_replay_p99_ms=n/a archive_replay_identical=n/a archive_bytes_per_intent=n/a archive_etcd_growth=n/a archive_scale_register=n/a archive_scale_replay=n/a"},
		{"some, one infinite", partial, "ARCHIVE archive_cycle_ratio_c1=0.50 archive_cycle_ratio_c64=n/a archive_replay_p50_ms=n/a archive_replay_p99_ms=n/a archive_replay_identical=n/a archive_bytes_per_intent=n/a archive_etcd_growth=n/a archive_scale_register=n/a archive_scale_replay=n/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.fig.line()
			if got != tc.want {
				t.Errorf("line():\n got %s\nwant %s", got, tc.want)
			}
			if !archiveLine.MatchString(got) {
				t.Errorf("line() %q does not have the ARCHIVE form", got)
			}
		})
	}
}

func TestGrowthRows(t *testing.T) {
	rows := growthRows([]growthPoint{
		{retained: 2000, etcdKeys: 140, inUse: 40 << 10},
		{retained: 20000, etcdKeys: 141, inUse: 44 << 10},
	})
	if len(rows) != 3 {
		t.Fatalf("%d rows, want a header and two points", len(rows))
	}
	if got := strings.Join(rows[2], "|"); got != "20,000|141|44 KiB|1.100|0s" {
		t.Errorf("the last point's row: %q", got)
	}
}

// TestPgBinPicksTheNewest: the newest major that has both initdb and
// postgres; none is errNoPostgres, which the workload skips on.
func TestPgBinPicksTheNewest(t *testing.T) {
	root := t.TempDir()
	glob := filepath.Join(root, "*", "bin")
	install := func(major string, files ...string) {
		dir := filepath.Join(root, major, "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, st := range []struct {
		name    string
		install func()
		want    string // the major; "" none
	}{
		{"nothing installed", func() {}, ""},
		{"a client only", func() { install("17", "psql") }, ""},
		{"a server without initdb", func() { install("16", "postgres") }, ""},
		{"a whole server", func() { install("13", "initdb", "postgres") }, "13"},
		{"an older one beside it", func() { install("9", "initdb", "postgres") }, "13"},
		{"a newer one", func() { install("15", "initdb", "postgres") }, "15"},
		{"a directory that names no major", func() { install("current", "initdb", "postgres") }, "15"},
		{"a file that is not executable", func() {
			install("18", "initdb")
			if err := os.WriteFile(filepath.Join(root, "18", "bin", "postgres"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "15"},
	} {
		st.install()
		got, err := pgBin(glob)
		switch {
		case st.want == "" && !errors.Is(err, errNoPostgres):
			t.Errorf("%s: %q, %v; want errNoPostgres", st.name, got, err)
		case st.want != "" && (err != nil || got != filepath.Join(root, st.want, "bin")):
			t.Errorf("%s: %q, %v; want %s's", st.name, got, err, st.want)
		}
	}
}

func TestArchiveFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.runs("archive") {
		t.Error("the archive workload runs by default; it should run only when named")
	}
	if cfg.archiveIntents != 2000 || cfg.archiveReplayKeys != 2000 || cfg.archiveDSN != "" {
		t.Errorf("defaults: --archive-intents %d, --archive-replay-keys %d, --archive-dsn %q", cfg.archiveIntents, cfg.archiveReplayKeys, cfg.archiveDSN)
	}
	cfg, err = parseFlags([]string{"--workloads", "archive", "--archive-dsn", "postgres://u@db/x", "--archive-intents", "10"}, io.Discard)
	if err != nil || !cfg.runs("archive") || cfg.archiveDSN != "postgres://u@db/x" || cfg.archiveIntents != 10 {
		t.Errorf("--workloads archive: %+v, %v", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--archive-intents", "0"}, "--archive-intents 0: want at least 1"},
		{[]string{"--archive-replay-keys", "-1"}, "--archive-replay-keys -1: want at least 1"},
	} {
		var stderr strings.Builder
		if code := Main(tc.args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("intentbench %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestArchiveSkippedWithoutPostgres: no binaries and no --archive-dsn is
// a run that says why it skipped, prints the ARCHIVE line all n/a, and
// ends well, with the RESULT line last.
func TestArchiveSkippedWithoutPostgres(t *testing.T) {
	defer func(glob string) { pgBinDirs = glob }(pgBinDirs)
	pgBinDirs = filepath.Join(t.TempDir(), "*", "bin")
	var out, stderr strings.Builder
	if code := Main([]string{"--workloads", "archive"}, &out, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(out.String(), archiveSkipped) {
		t.Errorf("output does not say %q:\n%s", archiveSkipped, out.String())
	}
	if !strings.Contains(out.String(), noArchiveFigures().line()+"\n") {
		t.Errorf("no ARCHIVE line all n/a:\n%s", out.String())
	}
	if !resultLine.MatchString(lines[len(lines)-1]) {
		t.Errorf("last line %q is not the RESULT line", lines[len(lines)-1])
	}
}

// TestArchiveWorkload runs the workload, tiny, against a PostgreSQL of
// its own: every figure measured, the answers the same after the move.
func TestArchiveWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and two intentds (-short)")
	}
	if _, err := pgBin(pgBinDirs); err != nil {
		t.Skipf("%v: run ./scripts/install-postgres.sh", err)
	}
	var out, stderr strings.Builder
	code := Main([]string{"--workloads", "archive", "--duration", "200ms", "--rounds", "1",
		"--archive-intents", "20", "--archive-replay-keys", "20"}, &out, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), stderr.String())
	}
	var line string
	for l := range strings.Lines(out.String()) {
		if strings.HasPrefix(l, "ARCHIVE ") {
			line = strings.TrimSpace(l)
		}
	}
	m := archiveLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no ARCHIVE line of the right form in:\n%s", out.String())
	}
	for i, name := range []string{"cycle_ratio_c1", "cycle_ratio_c64", "replay_p50_ms", "replay_p99_ms", "replay_identical", "bytes_per_intent", "etcd_growth"} {
		if m[i+1] == "n/a" {
			t.Errorf("archive_%s not measured: %s", name, line)
		}
	}
	if m[5] != "true" {
		t.Errorf("answers after the move differ from those before: %s\n%s", line, out.String())
	}
}

func TestPerOp(t *testing.T) {
	var none *pgServer
	for _, tc := range []struct {
		name   string
		c0, c1 time.Duration
		ops    int64
		want   float64
	}{
		{"measured", time.Second, 3 * time.Second, 1000, 2000},
		{"no ops", time.Second, 3 * time.Second, 0, math.NaN()},
		{"unknown before", -1, time.Second, 10, math.NaN()},
		{"a server the benchmark did not start", none.cpu(), none.cpu(), 10, math.NaN()},
	} {
		if got := perOp(tc.c0, tc.c1, tc.ops); !same(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPostgresServer: the workload's own server starts, makes a database,
// answers on it, counts its processes' CPU, and leaves nothing behind.
func TestPostgresServer(t *testing.T) {
	bin, err := pgBin(pgBinDirs)
	if err != nil {
		t.Skipf("%v: run ./scripts/install-postgres.sh", err)
	}
	ctx := t.Context()
	p, err := startPostgres(ctx, bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	dsn, err := p.createDB(ctx, "bench_test")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	c0 := p.cpu()
	var n int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM generate_series(1, 3000000)").Scan(&n); err != nil || n != 3000000 {
		t.Fatalf("a query: %d, %v", n, err)
	}
	if c1 := p.cpu(); c0 < 0 || c1-c0 < 10*time.Millisecond {
		t.Errorf("the server's CPU: %v before a query that takes some, %v after", c0, c1)
	}
	conn.Close(ctx)
	p.stop()
	if _, err := os.Stat(p.base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind: %v", p.base, err)
	}
	if p.cpu() >= 0 && p.c.exited() == nil {
		t.Error("the server still runs after stop")
	}
}
