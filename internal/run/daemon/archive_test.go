package daemon_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/pgtest"
)

// A --archive-dsn intentd cannot start with stops it before anything
// serves, with an error naming the flag and never the password: one that
// does not parse (a bad flag, as Validate finds it), one nothing answers
// at, one PostgreSQL refuses (no such database). The last two are
// ArchiveDSNError, which intentd exits 2 on.
func TestArchiveDSNRefusedAtStart(t *testing.T) {
	pg := pgtest.Start(t)
	const password = "s3cret-pw"
	for _, tc := range []struct {
		name, dsn string
		dsnError  bool // an ArchiveDSNError, not Validate's
		says      string
	}{
		{"does not parse", "postgres://intentd:" + password + "@127.0.0.1:notaport/db", false, "--archive-dsn"},
		{"nothing answers", "postgres://intentd:" + password + "@" + freeport.Addr(t) + "/db?sslmode=disable", true, "did not answer"},
		{"refused", "postgres://" + pgtest.Superuser + ":" + password + "@" + pg.Addr() + "/nosuchdb?sslmode=disable", true, "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.ArchiveDSN = tc.dsn
			cfg.DialTimeout = 5 * time.Second
			start := time.Now()
			err, logs := runToExit(t, cfg)
			if err == nil {
				t.Fatal("intentd started, want a refusal")
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("refusal took %v, want it within about --dial-timeout", took)
			}
			msg := err.Error()
			if !strings.Contains(msg, "--archive-dsn") || !strings.Contains(msg, tc.says) {
				t.Errorf("error %q: want it to name --archive-dsn and say %q", msg, tc.says)
			}
			if strings.Contains(msg, password) || strings.Contains(logs, password) {
				t.Errorf("the password shows: error %q, logs %q", msg, logs)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line", msg)
			}
			if _, ok := errors.AsType[*daemon.ArchiveDSNError](err); ok != tc.dsnError {
				t.Errorf("ArchiveDSNError = %v, want %v (%v)", ok, tc.dsnError, err)
			}
		})
	}
}

// httpBody GETs url and returns its status and body.
func httpBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// With --archive-dsn the daemon moves a completed intent to PostgreSQL
// after --archive-after, /metrics shows both tiers, and with PostgreSQL
// stopped: a read of the archived intent answers UNAVAILABLE with reason
// ARCHIVE_UNAVAILABLE (never INTERNAL), a live intent still completes,
// /readyz stays 200 saying the archive is degraded; PostgreSQL back, the
// intent answers again.
func TestArchiveInTheDaemon(t *testing.T) {
	pg := pgtest.Start(t)
	cfg := testConfig(t.TempDir())
	cfg.ArchiveDSN = pg.NewDatabase(t)
	cfg.Store.ArchiveAfter = time.Second
	cfg.JanitorInterval = 200 * time.Millisecond
	cfg.MetricsListen = freeport.Addr(t)
	in := start(t, cfg)
	c := intentv1.NewIntentServiceClient(in.conn)
	sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	cycle := func(key string) {
		t.Helper()
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{Key: key, SessionId: sess.SessionId, RequestId: "r-" + key,
			Register: &intentv1.RegisterRequest{Key: key, Params: params(t, 1)}})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", key, err)
		}
		if _, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: key, Token: a.Lease.Token, Result: &intentv1.Result{Payload: []byte(`{"ok":true}`)}}); err != nil {
			t.Fatalf("Complete(%s): %v", key, err)
		}
	}
	cycle("moved-1")
	live, err := c.Register(call(t), &intentv1.RegisterRequest{Key: "live-1", Params: params(t, 2)})
	if err != nil {
		t.Fatal(err)
	}
	_ = live

	metricsURL := "http://" + cfg.MetricsListen
	deadline := time.Now().Add(30 * time.Second)
	for {
		body := scrape(t, cfg.MetricsListen)
		if v, ok := metricValue(body, "intentd_archive_moved_total"); ok && v >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("intent not moved to the archive within 30s; /metrics:\n%s", grepLines(body, "intentd_archive"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	body := scrape(t, cfg.MetricsListen)
	for _, name := range []string{"intentd_archive_lag_seconds", "intentd_archive_unavailable", "intentd_archive_reads_total",
		`intentd_archive_call_duration_seconds_count{op="put"}`, `intentd_archive_errors_total{kind="unavailable"}`, `intentd_archive_rows{table="intents"}`} {
		if _, ok := metricLine(body, name); !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if g, err := c.Get(call(t), &intentv1.GetRequest{Key: "moved-1"}); err != nil || g.Intent.State != intentv1.State_STATE_COMPLETED {
		t.Fatalf("Get(moved-1) from the archive = %v, %v; want COMPLETED", g, err)
	}
	// The console's overview shows both tiers (authentication off: the
	// visitor is the anonymous admin).
	overview := func(wants ...string) {
		t.Helper()
		code, page := httpBody(t, metricsURL+"/console/t/default/overview")
		for _, w := range wants {
			if code != http.StatusOK || !strings.Contains(page, w) {
				t.Errorf("console overview: %d, lacks %q:\n%s", code, w, page)
			}
		}
	}
	overview("Where intents are kept", "final intents not moved yet", "archive (PostgreSQL)", "answering, 1 moved by this replica")

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err = c.Get(call(t), &intentv1.GetRequest{Key: "moved-1"})
	if status.Code(err) != codes.Unavailable || reasonOf(err) != "ARCHIVE_UNAVAILABLE" {
		t.Errorf("Get(moved-1), PostgreSQL stopped: %v; want UNAVAILABLE with reason ARCHIVE_UNAVAILABLE", err)
	}
	// The live intent cycles: nothing of it is in the archive.
	a, err := c.Acquire(call(t), &intentv1.AcquireRequest{Key: "live-1", SessionId: sess.SessionId, RequestId: "r-live-1"})
	if err != nil {
		t.Fatalf("Acquire(live-1), PostgreSQL stopped: %v", err)
	}
	if _, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: "live-1", Token: a.Lease.Token, Result: &intentv1.Result{Payload: []byte(`{}`)}}); err != nil {
		t.Fatalf("Complete(live-1), PostgreSQL stopped: %v", err)
	}
	deadline = time.Now().Add(15 * time.Second)
	for {
		code, body := httpBody(t, metricsURL+"/readyz")
		if code == http.StatusOK && strings.Contains(body, "degraded: archive") {
			break
		}
		if code != http.StatusOK || time.Now().After(deadline) {
			t.Fatalf("/readyz, PostgreSQL stopped: %d %q; want 200 saying the archive is degraded", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v, _ := metricValue(scrape(t, cfg.MetricsListen), "intentd_archive_unavailable"); v != 1 {
		t.Errorf("intentd_archive_unavailable = %v with PostgreSQL stopped, want 1", v)
	}
	// The live states are still counted (from etcd), the final ones not.
	overview("NOT ANSWERING", "finished intents cannot be counted", `<span class="n">0</span> <span class="badge state-in-progress">IN_PROGRESS</span>`, `<span class="n">?</span> <span class="badge state-completed">COMPLETED</span>`)

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		g, err := c.Get(call(t), &intentv1.GetRequest{Key: "moved-1"})
		if err == nil && g.Intent.State == intentv1.State_STATE_COMPLETED {
			break
		}
		if reasonOf(err) != "ARCHIVE_UNAVAILABLE" || time.Now().After(deadline) {
			t.Fatalf("Get(moved-1), PostgreSQL back: %v, %v", g, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	deadline = time.Now().Add(15 * time.Second)
	for {
		code, body := httpBody(t, metricsURL+"/readyz")
		if code == http.StatusOK && strings.TrimSpace(body) == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz, PostgreSQL back: %d %q; want 200 ok", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	in.shutdown(t)
}

// metricLine reports whether the metric name (with its labels, if
// given) has a line in body.
func metricLine(body, name string) (string, bool) {
	for line := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(line, name+" ") {
			return line, true
		}
	}
	return "", false
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// docs/BACKUP.md's backup and restore with the archive, run as written:
// the etcd snapshot first, then pg_dump. An intent moved to the archive
// before the snapshot comes back from the dump; one that ended before the
// snapshot and moved after it (in etcd's snapshot, and by the dump's time
// only in PostgreSQL) comes back with the same answer; one completed after
// the snapshot and moved before the dump is found in the archive
// (the restore loses less than etcd's alone); nothing registered after the
// dump is there.
func TestBackupAndRestoreWithTheArchive(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"etcdctl", "etcdutl"} {
		if _, err := os.Stat(filepath.Join(root, "bin", tool)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("bin/%s missing in CI: scripts/install-tools.sh must build it: %v", tool, err)
			}
			t.Skipf("bin/%s not installed; run ./scripts/install-tools.sh", tool)
		}
	}
	pgBin, err := pgtest.Bin()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", pgBin+":"+os.Getenv("PATH")) // pg_dump, pg_restore of the server's version
	backup := docBlocks(t, root, "archive-backup", "docs/BACKUP.md")
	restore := docBlocks(t, root, "restore", "docs/BACKUP.md") + "\n" + docBlocks(t, root, "archive-restore", "docs/BACKUP.md")
	snapshot, dump, ok := strings.Cut(strings.TrimSpace(backup), "\n")
	if !ok || !strings.Contains(snapshot, "etcdctl") || !strings.Contains(dump, "pg_dump") {
		t.Fatalf("docs/BACKUP.md's archive backup: want the etcd snapshot's line, then pg_dump's:\n%s", backup)
	}

	pg := pgtest.Start(t)
	data := filepath.Join(t.TempDir(), "data")
	cfg := testConfig(data)
	cfg.ArchiveDSN = pg.NewDatabase(t)
	cfg.Store.ArchiveAfter = 3 * time.Second
	cfg.JanitorInterval = 200 * time.Millisecond
	cfg.MetricsListen = freeport.Addr(t)
	work := t.TempDir()
	env := []string{"DATA_DIR=" + data, "ARCHIVE_DSN=" + cfg.ArchiveDSN}

	in := start(t, cfg)
	c := intentv1.NewIntentServiceClient(in.conn)
	sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	complete := func(key string) {
		t.Helper()
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{Key: key, SessionId: sess.SessionId, RequestId: "r-" + key,
			Register: &intentv1.RegisterRequest{Key: key, Params: params(t, 1)}})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", key, err)
		}
		if _, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: key, Token: a.Lease.Token, Result: &intentv1.Result{Payload: []byte(`{"done":"` + key + `"}`)}}); err != nil {
			t.Fatalf("Complete(%s): %v", key, err)
		}
	}
	moved := func() float64 {
		v, _ := metricValue(scrape(t, cfg.MetricsListen), "intentd_archive_moved_total")
		return v
	}
	waitMovedTotal := func(n float64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for moved() < n {
			if time.Now().After(deadline) {
				t.Fatalf("intentd_archive_moved_total still %v after 60s, want %v", moved(), n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	get := func(key string) ([]byte, error) {
		g, err := c.Get(call(t), &intentv1.GetRequest{Key: key})
		if err != nil {
			return nil, err
		}
		return proto.MarshalOptions{Deterministic: true}.Marshal(g)
	}

	complete("moved-before")
	waitMovedTotal(1)
	complete("between")
	runBlock(t, root, work, snapshot, env...)
	if n := moved(); n != 1 {
		t.Fatalf("%v intents moved by the snapshot's end, want 1 (the test's timing: --archive-after 3s)", n)
	}
	waitMovedTotal(2) // "between" leaves etcd
	complete("after-snapshot")
	waitMovedTotal(3)
	runBlock(t, root, work, dump, env...)
	complete("after-dump")
	want := map[string][]byte{}
	for _, k := range []string{"moved-before", "between", "after-snapshot"} {
		if want[k], err = get(k); err != nil {
			t.Fatalf("Get(%s) before the restore: %v", k, err)
		}
	}
	in.shutdown(t)

	cfg.ArchiveDSN = pg.NewDatabase(t) // the dump is restored into an empty database
	runBlock(t, root, work, restore, "DATA_DIR="+data, "ARCHIVE_DSN="+cfg.ArchiveDSN)
	in = start(t, cfg)
	c = intentv1.NewIntentServiceClient(in.conn)
	for k, w := range want {
		got, err := get(k)
		if err != nil {
			t.Errorf("Get(%s) after the restore: %v, want it back", k, err)
			continue
		}
		// The intent comes back whole; the answer's revision field of a
		// record etcd holds is the same (the bump leaves stored records).
		if !bytes.Equal(got, w) {
			t.Errorf("Get(%s) after the restore differs from before", k)
		}
	}
	if _, err := c.Get(call(t), &intentv1.GetRequest{Key: "after-dump"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get(after-dump) after the restore: %v, want NOT_FOUND (completed after both backups, never moved)", err)
	}
	in.shutdown(t)
}
