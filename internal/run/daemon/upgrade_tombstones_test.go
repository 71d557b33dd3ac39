package daemon_test

// The upgrade fixture: testdata/upgrade-cb9faa7.tar.gz is a data
// directory written by intentd built from commit
// cb9faa7a8d773addc054a1a91ec7b0bfb4a95f5a, with tombstones in that
// version's format (t/<tenant>/z/<key>, indexed under Zr), in five tenants
// and under keys with every character a key may hold; testdata/upgrade-cb9faa7.json
// lists its intents and what that binary answered for each. To write it
// again from a commit (say a later release's):
//
//	commit=$(git rev-parse HEAD)
//	rm -rf /tmp/fixture-src && mkdir /tmp/fixture-src && git archive $commit | tar -x -C /tmp/fixture-src
//	(cd /tmp/fixture-src && go build -o /tmp/intentd-fixture ./cmd/intentd)
//	INTENTD_BIN=/tmp/intentd-fixture FIXTURE_COMMIT=$commit \
//	  go test -tags fixturegen -count=1 -run TestWriteUpgradeFixture ./internal/run/daemon/
//
// (then rename upgradeFixture below and the files to the new commit). The
// generator is upgrade_tombstones_gen_test.go.

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/daemon"
)

// upgradeFixture names the fixture's two files in testdata (.tar.gz, .json).
const upgradeFixture = "upgrade-cb9faa7"

// upgradeManifest is the fixture's .json: the commit whose binary wrote
// the data directory, when, and every intent in it.
type upgradeManifest struct {
	Commit  string         `json:"commit"`
	Created time.Time      `json:"created"`
	Written time.Time      `json:"written"`
	Entries []upgradeEntry `json:"entries"`
}

// upgradeEntry is one intent of the fixture. Kind is long-tombstone (a
// tombstone kept 17520h), short-tombstone (kept 1h), retained (COMPLETED,
// kept 720h) or live (PENDING, UNKNOWN, NEEDS_REVIEW).
type upgradeEntry struct {
	Tenant      string       `json:"tenant"`
	Key         string       `json:"key"`
	Kind        string       `json:"kind"`
	State       string       `json:"state"`
	Fingerprint string       `json:"fingerprint"`
	CompletedAt time.Time    `json:"completed_at,omitzero"`
	Expired     *expiredSeen `json:"expired,omitempty"`
}

// expiredSeen is what the fixture's binary answered a late retry of a
// tombstoned key: Acquire's outcome and intent, Register's refusal.
type expiredSeen struct {
	AcquireOutcome      string    `json:"acquire_outcome"`
	AcquireState        string    `json:"acquire_state"`
	AcquireCompletedAt  time.Time `json:"acquire_completed_at"`
	AcquireFingerprint  string    `json:"acquire_fingerprint"`
	RegisterReason      string    `json:"register_reason"`
	RegisterFinalState  string    `json:"register_final_state"`
	RegisterFingerprint string    `json:"register_fingerprint"`
}

// errorMetadata is the ErrorInfo metadata of a status error.
func errorMetadata(err error) map[string]string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()
		}
	}
	return nil
}

// readUpgradeFixture unpacks the fixture's data directory into a new
// temporary directory and reads its manifest.
func readUpgradeFixture(t *testing.T) (string, upgradeManifest) {
	t.Helper()
	var m upgradeManifest
	b, err := os.ReadFile(filepath.Join("testdata", upgradeFixture+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join("testdata", upgradeFixture+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "data")
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(path, dir+string(filepath.Separator)) {
			t.Fatalf("fixture entry %q outside its directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, 0o700)
		case tar.TypeReg:
			var out *os.File
			if out, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o600); err == nil {
				_, err = io.Copy(out, tr)
				err = errors.Join(err, out.Close())
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

// An installation upgraded from the fixture's version keeps every answer
// its tombstones gave: a late Acquire of a tombstoned key is EXPIRED with
// the state the intent ended in and when, Register is INTENT_EXPIRED; the
// intents still retained or live answer as they did; tombstones past
// their own retention are removed by the janitor as before.
func TestUpgradeKeepsTombstonesOfThePreviousVersion(t *testing.T) {
	dir, m := readUpgradeFixture(t)
	// The store's clock starts just after the fixture was written, so
	// that its tombstones are not due, and moves when the test says.
	var skew atomic.Int64
	skew.Store(int64(time.Minute))
	began := time.Now()
	cfg := testConfig(dir)
	cfg.JanitorInterval = 50 * time.Millisecond
	cfg.Store.Now = func() time.Time { return m.Written.Add(time.Duration(skew.Load()) + time.Since(began)) }
	in := start(t, cfg)
	c := intentv1.NewIntentServiceClient(in.conn)
	raw := embeddedClient(t, cfg)
	// The fixture's tombstones are the previous version's: a key each.
	old := 0
	for _, e := range m.Entries {
		if strings.HasSuffix(e.Kind, "-tombstone") {
			old++
			if !rawExists(t, raw, "/intentd/v1/t/"+e.Tenant+"/z/"+e.Key) {
				t.Fatalf("%s %q: no tombstone key of the previous version in the fixture", e.Tenant, e.Key)
			}
		}
	}
	if n := rawCount(t, raw, "/intentd/v1/Z/"); n != 0 || old == 0 {
		t.Fatalf("the fixture holds %d packed chunks and %d old tombstones, want none and some", n, old)
	}
	sessions := map[string]string{}
	session := func(tenant string) string {
		if id, ok := sessions[tenant]; ok {
			return id
		}
		s, err := c.OpenSession(call(t), &intentv1.OpenSessionRequest{Tenant: tenant, Worker: "upgraded", Ttl: durationpb.New(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		sessions[tenant] = s.GetSessionId()
		return s.GetSessionId()
	}
	checkTombstone := func(e upgradeEntry) {
		t.Helper()
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{Tenant: e.Tenant, Key: e.Key, SessionId: session(e.Tenant), RequestId: "after-upgrade"})
		if err != nil {
			t.Errorf("%s %q: Acquire: %v, want EXPIRED", e.Tenant, e.Key, err)
			return
		}
		want := e.Expired
		if a.GetOutcome().String() != want.AcquireOutcome || a.GetIntent().GetState().String() != want.AcquireState ||
			!a.GetIntent().GetCompletedAt().AsTime().Equal(want.AcquireCompletedAt) {
			t.Errorf("%s %q: Acquire %v, state %v, completed %v; the previous version answered %s, %s, %v",
				e.Tenant, e.Key, a.GetOutcome(), a.GetIntent().GetState(), a.GetIntent().GetCompletedAt().AsTime(),
				want.AcquireOutcome, want.AcquireState, want.AcquireCompletedAt)
		}
		// With register: this version writes at once when it can tell
		// that a key has no tombstone, and an old one must stop it.
		reg := &intentv1.RegisterRequest{Tenant: e.Tenant, Key: e.Key, Params: params(t, 1)}
		a, err = c.Acquire(call(t), &intentv1.AcquireRequest{Tenant: e.Tenant, Key: e.Key, SessionId: session(e.Tenant), RequestId: "after-upgrade-reg", Register: reg})
		if err != nil || a.GetOutcome().String() != want.AcquireOutcome || a.GetIntent().GetState().String() != want.AcquireState {
			t.Errorf("%s %q: Acquire with register: %v, %v; the previous version answered %s, %s", e.Tenant, e.Key, a.GetOutcome(), err, want.AcquireOutcome, want.AcquireState)
		}
		_, err = c.Register(call(t), reg)
		if reasonOf(err) != want.RegisterReason || errorMetadata(err)["final_state"] != want.RegisterFinalState {
			t.Errorf("%s %q: Register: %v (%v), want %s with final_state %s", e.Tenant, e.Key, err, errorMetadata(err), want.RegisterReason, want.RegisterFinalState)
		}
	}
	kinds := map[string]int{}
	for _, e := range m.Entries {
		kinds[e.Kind]++
		switch e.Kind {
		case "long-tombstone", "short-tombstone":
			checkTombstone(e)
		case "retained", "live":
			g, err := c.Get(call(t), &intentv1.GetRequest{Tenant: e.Tenant, Key: e.Key})
			if err != nil || g.GetIntent().GetState().String() != e.State || g.GetIntent().GetFingerprint() != e.Fingerprint && e.Fingerprint != "" {
				t.Errorf("%s %q: Get: %v, state %v, want %s", e.Tenant, e.Key, err, g.GetIntent().GetState(), e.State)
			}
		default:
			t.Fatalf("fixture entry of kind %q", e.Kind)
		}
	}
	if kinds["long-tombstone"] == 0 || kinds["short-tombstone"] == 0 || kinds["retained"] == 0 || kinds["live"] == 0 {
		t.Fatalf("fixture holds %v: every kind is needed", kinds)
	}

	// Past the short tombstones' hour, the janitor removes them, and only
	// them: a late retry then finds nothing.
	skew.Store(int64(2 * time.Hour))
	for _, e := range m.Entries {
		if e.Kind != "short-tombstone" {
			continue
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := c.Get(call(t), &intentv1.GetRequest{Tenant: e.Tenant, Key: e.Key})
			if status.Code(err) == codes.NotFound {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %q: %v, want NOT_FOUND once its tombstone's hour is over", e.Tenant, e.Key, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, e := range m.Entries {
		if e.Kind == "long-tombstone" {
			checkTombstone(e)
		}
	}

	// New tombstones are packed: no key of their own, a chunk for all,
	// and the same answers, the completion to the second.
	var fresh []upgradeEntry
	for i, tenant := range []string{"default", "acme", "9lives"} {
		e := upgradeEntry{Tenant: tenant, Key: "after-upgrade/" + []string{"a", "a/", ".."}[i], State: intentv1.State_STATE_COMPLETED.String()}
		reg := &intentv1.RegisterRequest{Tenant: tenant, Key: e.Key, Params: params(t, 2), Retention: durationpb.New(time.Second)}
		a, err := c.Acquire(call(t), &intentv1.AcquireRequest{Tenant: tenant, Key: e.Key, SessionId: session(tenant), RequestId: "new", Register: reg})
		if err != nil || a.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
			t.Fatalf("%s %q: Acquire with register: %v, %v", tenant, e.Key, a.GetOutcome(), err)
		}
		done, err := c.Complete(call(t), &intentv1.CompleteRequest{Tenant: tenant, Key: e.Key, Token: a.GetLease().GetToken(), Result: &intentv1.Result{Payload: []byte(`{}`)}})
		if err != nil {
			t.Fatal(err)
		}
		e.Expired = &expiredSeen{AcquireOutcome: intentv1.Outcome_OUTCOME_EXPIRED.String(), AcquireState: e.State,
			AcquireCompletedAt: done.GetIntent().GetCompletedAt().AsTime().Truncate(time.Second),
			RegisterReason:     "INTENT_EXPIRED", RegisterFinalState: "COMPLETED"}
		fresh = append(fresh, e)
	}
	skew.Store(int64(3 * time.Hour))
	for _, e := range fresh {
		waitFor(t, e.Key+" expired", func() bool {
			_, err := c.Get(call(t), &intentv1.GetRequest{Tenant: e.Tenant, Key: e.Key})
			return reasonOf(err) == "INTENT_EXPIRED"
		})
		checkTombstone(e)
		if rawExists(t, raw, "/intentd/v1/t/"+e.Tenant+"/z/"+e.Key) {
			t.Errorf("%s %q: a tombstone key of its own; want it packed", e.Tenant, e.Key)
		}
	}
	if n := rawCount(t, raw, "/intentd/v1/Z/"); n != 1 {
		t.Errorf("%d packed chunks, want the one that holds every new tombstone", n)
	}
	in.shutdown(t)
}

// embeddedClient is a client of the embedded etcd of cfg, over its
// socket, closed when the test ends.
func embeddedClient(t *testing.T, cfg daemon.Config) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + cfg.EmbedSocket()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func rawCount(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func rawExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}
