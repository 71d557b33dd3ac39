package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// copyDir copies an etcd data directory (stopped) file by file, keeping
// modes: what an operator's snapshot of it would restore.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(dst, info.Mode().Perm())
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, info.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("copy %s: %v", from, err)
	}
}

// restoreDir replaces an etcd data directory with a copy taken earlier:
// exactly an `etcdutl snapshot restore` without --bump-revision.
func restoreDir(t *testing.T, copied, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	copyDir(t, copied, dir)
}

// runToExit runs intentd expecting it to refuse to start, and returns why
// and what it logged.
func runToExit(t *testing.T, cfg daemon.Config) (error, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs testlog.Buffer
	err := daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(&logs, nil)), func(addr string) {
		t.Errorf("intentd started serving on %s, want a refusal", addr)
		cancel()
	})
	return err, logs.String()
}

// waitExit waits for an instance to stop on its own and returns Run's
// error.
func (in *instance) waitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	err, ok := in.Wait(within)
	if !ok {
		t.Fatalf("intentd still running after %v", within)
	}
	_ = in.conn.Close()
	return err
}

// readFloorFile returns the floor file's only installation and revision.
func readFloorFile(t *testing.T, dataDir string) (string, int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, etcdstore.FloorFileName))
	if err != nil {
		t.Fatal(err)
	}
	var floors map[string]int64
	if err := json.Unmarshal(b, &floors); err != nil {
		t.Fatalf("floor file %q: %v", b, err)
	}
	if len(floors) != 1 {
		t.Fatalf("floor file %s, want one installation", b)
	}
	for id, rev := range floors {
		return id, rev
	}
	return "", 0
}

// climb makes n intents go through acquire and complete, so that etcd's
// revision climbs, and returns the last token handed out.
func climb(t *testing.T, in *instance, n int) uint64 {
	t.Helper()
	c := intentv1.NewIntentServiceClient(in.conn)
	sess, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var token uint64
	for i := range n {
		key := fmt.Sprintf("climb-%d-%d", time.Now().UnixNano(), i)
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{
			Key: key, SessionId: sess.GetSessionId(), RequestId: key,
			Register: &intentv1.RegisterRequest{Key: key, Params: params(t, 1)},
		})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", key, err)
		}
		token = a.GetLease().GetToken()
		if _, err := c.Complete(call(t), &intentv1.CompleteRequest{Key: key, Token: token, Result: &intentv1.Result{Payload: []byte("ok")}}); err != nil {
			t.Fatalf("Complete(%s): %v", key, err)
		}
	}
	return token
}

// mustRefuse checks a refusal names the revisions, the installation, the
// fix and the floor file, plainly.
func mustRefuse(t *testing.T, err error, what, installation string, floor int64, file string) {
	t.Helper()
	back, ok := errors.AsType[*etcdstore.RolledBackError](err)
	if !ok || !errors.Is(err, intent.ErrStoreRolledBack) {
		t.Fatalf("Run = %v, want a *etcdstore.RolledBackError matching intent.ErrStoreRolledBack", err)
	}
	if back.Floor != floor || back.Revision >= floor || back.Installation != installation || back.File != file {
		t.Errorf("refusal %+v, want a revision below floor %d, installation %s, file %s", back, floor, installation, file)
	}
	msg := err.Error()
	for _, want := range []string{
		what, "etcd's revision ", fmt.Sprintf("is behind the %d this replica already saw for installation %s", floor, installation),
		"restored from an older snapshot without a revision bump", "fencing tokens would go backwards",
		"etcdutl snapshot restore --bump-revision", "--mark-compacted", "delete " + file + " only if no token handed out before is still held",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
}

// mustLogRefusal checks the refusal was logged at error level.
func mustLogRefusal(t *testing.T, logs string) {
	t.Helper()
	if !strings.Contains(logs, "level=ERROR msg=\"etcd's revision went back") {
		t.Errorf("refusal not logged at error level; logs:\n%s", logs)
	}
}

// An etcd restored from an older snapshot without a revision bump is
// refused at start: its tokens would repeat ones already handed out.
// Deleting the floor file is the operator's way to accept that.
func TestRefusesStoreWhoseRevisionWentBack(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	floorFile := filepath.Join(dir, etcdstore.FloorFileName)

	// A first run creates the installation id; its etcd, stopped, is the
	// snapshot.
	start(t, cfg).shutdown(t)
	snapshot := filepath.Join(t.TempDir(), "etcd")
	copyDir(t, filepath.Join(dir, "etcd"), snapshot)

	second := start(t, cfg)
	last := climb(t, second, 20)
	second.shutdown(t)
	installation, floor := readFloorFile(t, dir)
	// A token is derived from the revision that issued it (revision ×
	// TokenSlots + slot): the floor holds revisions.
	if issued := int64(last / uint64(machine.TokenSlots)); floor < issued {
		t.Fatalf("floor file holds %d, want at least %d, the revision that issued the last token %d", floor, issued, last)
	}

	restoreDir(t, snapshot, filepath.Join(dir, "etcd"))
	err, logs := runToExit(t, cfg)
	mustRefuse(t, err, "refusing to start", installation, floor, floorFile)
	mustLogRefusal(t, logs)
	t.Logf("refusal: %v", err)

	// The operator knows no old token is still held: without the file,
	// intentd starts on the restored store and hands out tokens again.
	if err := os.Remove(floorFile); err != nil {
		t.Fatal(err)
	}
	third := start(t, cfg)
	if tok := climb(t, third, 1); tok == 0 {
		t.Fatal("no token after the floor file was deleted")
	}
	third.shutdown(t)
	if id, _ := readFloorFile(t, dir); id != installation {
		t.Fatalf("floor file names installation %s, want the restored %s", id, installation)
	}
}

// startEtcdAt starts an etcd member on dir that clients find at endpoint
// (http://127.0.0.1:port), as a restarted cluster member would be.
func startEtcdAt(t *testing.T, dir, endpoint string) *etcdtest.Server {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return etcdtest.StartWith(t, dir, func(c *embed.Config) {
		c.ListenClientUrls, c.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
	})
}

// A running intentd whose external etcd is replaced by one restored from
// an older snapshot stops serving and exits with the refusal; restarted
// (as a supervisor would), it refuses to start.
func TestStopsServingWhenRevisionGoesBack(t *testing.T) {
	etcdDir, dataDir := t.TempDir(), t.TempDir()
	srv := etcdtest.StartDir(t, etcdDir)
	endpoint := srv.Endpoints[0]
	cfg := testConfig(dataDir)
	cfg.EtcdEndpoints = []string{endpoint}
	floorFile := filepath.Join(dataDir, etcdstore.FloorFileName)

	start(t, cfg).shutdown(t) // creates the installation id
	srv.Stop()
	snapshot := filepath.Join(t.TempDir(), "etcd")
	copyDir(t, etcdDir, snapshot)

	srv = startEtcdAt(t, etcdDir, endpoint)
	running := start(t, cfg)
	climb(t, running, 20)
	srv.Stop()
	restoreDir(t, snapshot, etcdDir)
	startEtcdAt(t, etcdDir, endpoint)

	err := running.waitExit(t, 60*time.Second)
	installation, floor := readFloorFile(t, dataDir)
	mustRefuse(t, err, "stopped serving", installation, floor, floorFile)

	err, logs := runToExit(t, cfg)
	mustRefuse(t, err, "refusing to start", installation, floor, floorFile)
	mustLogRefusal(t, logs)
}

// A fresh etcd is a new installation: the floor of another one does not
// hold it back, and the file keeps both.
func TestNewClusterIsANewInstallation(t *testing.T) {
	dataDir := t.TempDir()
	cfg := testConfig(dataDir)
	cfg.EtcdEndpoints = etcdtest.Start(t).Endpoints
	in := start(t, cfg)
	climb(t, in, 20)
	in.shutdown(t)

	cfg.EtcdEndpoints = etcdtest.Start(t).Endpoints
	start(t, cfg).shutdown(t)
	b, err := os.ReadFile(filepath.Join(dataDir, etcdstore.FloorFileName))
	if err != nil {
		t.Fatal(err)
	}
	var floors map[string]int64
	if err := json.Unmarshal(b, &floors); err != nil || len(floors) != 2 {
		t.Fatalf("floor file %s (%v), want two installations", b, err)
	}
}
