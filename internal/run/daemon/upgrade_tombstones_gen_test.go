//go:build fixturegen

package daemon_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
)

// TestWriteUpgradeFixture writes testdata/<upgradeFixture>.tar.gz and .json:
// a data directory written by the intentd binary $INTENTD_BIN, built from
// commit $FIXTURE_COMMIT, and what that binary answered for each intent in
// it. How to run it is in upgrade_tombstones_test.go.
func TestWriteUpgradeFixture(t *testing.T) {
	bin, commit := os.Getenv("INTENTD_BIN"), os.Getenv("FIXTURE_COMMIT")
	if bin == "" || len(commit) != 40 {
		t.Fatal("set INTENTD_BIN to an intentd binary and FIXTURE_COMMIT to the full commit it was built from")
	}
	dir := filepath.Join(t.TempDir(), "data")
	m := upgradeManifest{Commit: commit, Created: time.Now().UTC()}

	// First run: the defaults (720h retention, 17520h of tombstones);
	// registrations that ask for a 1s retention become tombstones.
	run := startBinary(t, bin, dir, "--janitor-interval", "100ms")
	m.Entries = append(m.Entries, writeIntents(t, run.conn, "long")...)
	run.stop(t)
	// Second run: tombstones that live an hour (the default retention 1s,
	// the longest a registration may ask for 720h).
	run = startBinary(t, bin, dir, "--janitor-interval", "100ms", "--retention", "1s", "--tombstone-retention", "1h", "--max-retention", "720h")
	m.Entries = append(m.Entries, writeIntents(t, run.conn, "short")...)
	run.stop(t)
	m.Written = time.Now().UTC()

	out := filepath.Join("testdata", upgradeFixture)
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	writeTarGz(t, dir, out+".tar.gz")
	// One intent a line: a diff of a new fixture reads intent by intent.
	entries := m.Entries
	m.Entries = nil
	head, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b := append(head[:len(head)-len(`,"entries":null}`)], ",\n\"entries\": [\n"...)
	for i, e := range entries {
		line, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, line...)
		if i < len(entries)-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
	}
	b = append(b, "]}\n"...)
	if err := json.Unmarshal(b, &m); err != nil || len(m.Entries) != len(entries) {
		t.Fatalf("the manifest does not read back: %v", err)
	}
	if err := os.WriteFile(out+".json", b, 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(out + ".tar.gz")
	t.Logf("wrote %s.tar.gz (%d bytes) and %s.json: %d intents", out, st.Size(), out, len(m.Entries))
}

// binaryRun is one intentd process on a data dir.
type binaryRun struct {
	cmd  *exec.Cmd
	conn *grpc.ClientConn
	done chan error
}

func startBinary(t *testing.T, bin, dir string, args ...string) *binaryRun {
	t.Helper()
	addr := freeport.Addr(t)
	cmd := exec.Command(bin, append([]string{"--data-dir", dir, "--listen", addr, "--metrics-listen", "",
		"--rate-per-principal", "0", "--rate-per-tenant", "0", "--log-level", "warn", "--log-format", "json"}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &binaryRun{cmd: cmd, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.conn = conn
	c := intentv1.NewIntentServiceClient(conn)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, &intentv1.GetRequest{Key: "no-such-intent"})
		cancel()
		if status.Code(err) == codes.NotFound {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("intentd did not serve: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *binaryRun) stop(t *testing.T) {
	t.Helper()
	_ = r.conn.Close()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("intentd exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("intentd did not stop")
	}
}

// fixtureTenants and fixtureKeys spell what a store's etcd keys must keep
// apart: keys that are prefixes of each other, path-like segments, every
// character a key may hold, the longest key and tenant, keys that look
// like other parts of the layout.
var (
	fixtureTenants = []string{"default", "acme", "a_b-c", "9lives", strings.Repeat("t", 64)}
	fixtureKeys    = []string{
		"a", "a/", "a/b", "a//b", "/a", ".", "..", "./x", "../x", "x/..", "x/.",
		"k+1=2@host:443", "-dash_under.score", "UPPER.lower", "with:colons:many",
		"z/looks-like-a-tombstone", "i/looks-like-a-record", "t/default/z/x", "Zr", "x/zr/1",
		strings.Repeat("k", 256),
	}
)

// writeIntents writes, in every tenant, one intent per fixture key that
// ends as a tombstone (COMPLETED, FAILED and CANCELLED in turn, with a 1s
// retention), one with a derived key, and beside them intents that stay:
// COMPLETED with a long retention, PENDING, UNKNOWN and NEEDS_REVIEW. Keys
// carry the run's name. It waits until the janitor turned every 1s
// intent into a tombstone, and records what intentd answers for each.
func writeIntents(t *testing.T, conn *grpc.ClientConn, run string) []upgradeEntry {
	t.Helper()
	c := intentv1.NewIntentServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out []upgradeEntry
	finals := []intentv1.State{intentv1.State_STATE_COMPLETED, intentv1.State_STATE_FAILED, intentv1.State_STATE_CANCELLED}
	for ti, tenant := range fixtureTenants {
		sess, err := c.OpenSession(ctx, &intentv1.OpenSessionRequest{Tenant: tenant, Worker: "fixture", Ttl: durationpb.New(10 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		id := sess.GetSessionId()
		keys := fixtureKeys
		if run == "short" {
			keys = keys[:4] // fewer: what matters is that they expire
		}
		for ki, k := range keys {
			key := run + "/" + k
			if len(key) > 256 {
				key = key[:256]
			}
			e := upgradeEntry{Tenant: tenant, Key: key, Kind: run + "-tombstone"}
			e.State = finals[(ti+ki)%len(finals)].String()
			writeFinal(ctx, t, c, id, &e, time.Second)
			out = append(out, e)
		}
		derived := upgradeEntry{Tenant: tenant, Kind: run + "-tombstone", State: intentv1.State_STATE_COMPLETED.String()}
		idn, err := structpb.NewStruct(map[string]any{"order_id": "ORD-" + run + "-" + tenant, "line": float64(ti)})
		if err != nil {
			t.Fatal(err)
		}
		dk, err := c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Action: "refund.issue", Identity: idn})
		if err != nil {
			t.Fatal(err)
		}
		derived.Key = dk.GetKey()
		writeFinal(ctx, t, c, id, &derived, time.Second)
		out = append(out, derived)
		if run != "long" {
			continue
		}
		kept := upgradeEntry{Tenant: tenant, Key: run + "/kept/" + fixtureKeys[ti], Kind: "retained", State: intentv1.State_STATE_COMPLETED.String()}
		writeFinal(ctx, t, c, id, &kept, 0)
		out = append(out, kept)
		pending := upgradeEntry{Tenant: tenant, Key: run + "/pending/" + fixtureKeys[ti], Kind: "live", State: intentv1.State_STATE_PENDING.String()}
		if _, err := c.Register(ctx, &intentv1.RegisterRequest{Tenant: tenant, Key: pending.Key, Params: fixtureParams(t, pending.Key)}); err != nil {
			t.Fatal(err)
		}
		out = append(out, pending)
		for _, st := range []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW} {
			e := upgradeEntry{Tenant: tenant, Key: run + "/" + strings.ToLower(st.String()) + "/" + fixtureKeys[ti], Kind: "live", State: st.String()}
			a, err := c.Acquire(ctx, &intentv1.AcquireRequest{Tenant: tenant, Key: e.Key, SessionId: id, RequestId: "acq",
				Register: &intentv1.RegisterRequest{Tenant: tenant, Key: e.Key, Params: fixtureParams(t, e.Key)}})
			if err != nil {
				t.Fatal(err)
			}
			if st == intentv1.State_STATE_UNKNOWN {
				_, err = c.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Tenant: tenant, Key: e.Key, Token: a.GetLease().GetToken(), Reason: "fixture"})
			} else {
				_, err = c.Escalate(ctx, &intentv1.EscalateRequest{Tenant: tenant, Key: e.Key, Token: a.GetLease().GetToken(), Reason: "fixture"})
			}
			if err != nil {
				t.Fatalf("%s %s: %v", st, e.Key, err)
			}
			out = append(out, e)
		}
		if _, err := c.CloseSession(ctx, &intentv1.CloseSessionRequest{Tenant: tenant, SessionId: id}); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the janitor, then record what a late retry is told.
	for i := range out {
		e := &out[i]
		if !strings.HasSuffix(e.Kind, "-tombstone") {
			continue
		}
		for {
			_, err := c.Get(ctx, &intentv1.GetRequest{Tenant: e.Tenant, Key: e.Key})
			if reasonOf(err) == "INTENT_EXPIRED" {
				break
			}
			if ctx.Err() != nil || (err != nil && status.Code(err) != codes.FailedPrecondition) {
				t.Fatalf("%s %q: waiting for its tombstone: %v", e.Tenant, e.Key, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		e.Expired = expiredAnswer(ctx, t, c, e.Tenant, e.Key)
	}
	return out
}

// writeFinal registers e, acquires it and ends it in e.State, with the
// given retention (0: the server's default), and records its fingerprint
// and completion time.
func writeFinal(ctx context.Context, t *testing.T, c intentv1.IntentServiceClient, session string, e *upgradeEntry, retention time.Duration) {
	t.Helper()
	reg := &intentv1.RegisterRequest{Tenant: e.Tenant, Key: e.Key, Params: fixtureParams(t, e.Key)}
	if retention > 0 {
		reg.Retention = durationpb.New(retention)
	}
	r, err := c.Register(ctx, reg)
	if err != nil {
		t.Fatalf("register %s %q: %v", e.Tenant, e.Key, err)
	}
	e.Fingerprint = r.GetIntent().GetFingerprint()
	var in *intentv1.Intent
	if e.State == intentv1.State_STATE_CANCELLED.String() {
		resp, err := c.Cancel(ctx, &intentv1.CancelRequest{Tenant: e.Tenant, Key: e.Key, Actor: "fixture", Reason: "withdrawn"})
		if err != nil {
			t.Fatalf("cancel %q: %v", e.Key, err)
		}
		in = resp.GetIntent()
	} else {
		a, err := c.Acquire(ctx, &intentv1.AcquireRequest{Tenant: e.Tenant, Key: e.Key, SessionId: session, RequestId: "acq"})
		if err != nil {
			t.Fatalf("acquire %q: %v", e.Key, err)
		}
		tok := a.GetLease().GetToken()
		if e.State == intentv1.State_STATE_FAILED.String() {
			resp, err := c.Fail(ctx, &intentv1.FailRequest{Tenant: e.Tenant, Key: e.Key, Token: tok, Failure: &intentv1.Failure{Code: "card_declined"}})
			if err != nil {
				t.Fatalf("fail %q: %v", e.Key, err)
			}
			in = resp.GetIntent()
		} else {
			resp, err := c.Complete(ctx, &intentv1.CompleteRequest{Tenant: e.Tenant, Key: e.Key, Token: tok,
				Result: &intentv1.Result{Payload: []byte(`{"order_id":"SO-1"}`)}})
			if err != nil {
				t.Fatalf("complete %q: %v", e.Key, err)
			}
			in = resp.GetIntent()
		}
	}
	if in.GetState().String() != e.State {
		t.Fatalf("%q ended %v, want %s", e.Key, in.GetState(), e.State)
	}
	e.CompletedAt = in.GetCompletedAt().AsTime()
}

func fixtureParams(t *testing.T, key string) *structpb.Struct {
	t.Helper()
	p, err := structpb.NewStruct(map[string]any{"item": "desk lamp", "for": key})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// expiredAnswer is what Acquire and Register answer for a tombstoned key.
func expiredAnswer(ctx context.Context, t *testing.T, c intentv1.IntentServiceClient, tenant, key string) *expiredSeen {
	t.Helper()
	sess, err := c.OpenSession(ctx, &intentv1.OpenSessionRequest{Tenant: tenant, Worker: "fixture-late", Ttl: durationpb.New(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseSession(ctx, &intentv1.CloseSessionRequest{Tenant: tenant, SessionId: sess.GetSessionId()})
	a, err := c.Acquire(ctx, &intentv1.AcquireRequest{Tenant: tenant, Key: key, SessionId: sess.GetSessionId(), RequestId: "late"})
	if err != nil {
		t.Fatalf("late acquire %s %q: %v", tenant, key, err)
	}
	_, rerr := c.Register(ctx, &intentv1.RegisterRequest{Tenant: tenant, Key: key, Params: fixtureParams(t, key)})
	meta := errorMetadata(rerr)
	return &expiredSeen{
		AcquireOutcome: a.GetOutcome().String(), AcquireState: a.GetIntent().GetState().String(),
		AcquireCompletedAt: a.GetIntent().GetCompletedAt().AsTime(), AcquireFingerprint: a.GetIntent().GetFingerprint(),
		RegisterReason: reasonOf(rerr), RegisterFinalState: meta["final_state"], RegisterFingerprint: meta["fingerprint"],
	}
}

// writeTarGz packs dir (its regular files and directories; not the
// socket) into file.
func writeTarGz(t *testing.T, dir, file string) {
	t.Helper()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(gz)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return nil // the socket
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name, h.ModTime, h.Uname, h.Gname, h.Uid, h.Gid = filepath.ToSlash(rel), time.Unix(0, 0), "", "", 0, 0
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = errors.Join(tw.Close(), gz.Close())
	}
	if err != nil {
		t.Fatal(fmt.Errorf("packing %s: %w", dir, err))
	}
}
