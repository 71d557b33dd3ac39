package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/pgtest"
)

// The archive through the built intentd (issue 26): final intents move
// from etcd to PostgreSQL after --archive-after, and every answer about
// them stays the same.

// archived is one intent the tests complete and then follow across tiers:
// its key, params, and the answers read before its move.
type archived struct {
	key    string
	params *structpb.Struct
	replay []byte // the replayed Acquire's response, deterministic bytes
	get    []byte // Get's response
}

// archiveCtx is a call's context, cancelled when the test ends.
func archiveCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wire is m as deterministic bytes.
func wire(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// errReason is the ErrorInfo reason of a gRPC error, "" for none.
func errReason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

// archiveRig is an intentd started with a --config file the test rewrites
// before a restart (the archive turned on later), and a client of it.
type archiveRig struct {
	d      *harness.Intentd
	c      intentv1.IntentServiceClient
	config string
	sess   string
}

// startArchiveRig starts intentd with settings (flag names to values) in
// its config file.
func startArchiveRig(t *testing.T, settings map[string]string) *archiveRig {
	t.Helper()
	r := &archiveRig{config: filepath.Join(t.TempDir(), "intentd.yaml")}
	r.configure(t, settings)
	r.d = harness.StartIntentd(t, harness.Bins(t), "intentd", harness.IntentdConfig{Flags: []string{"--config", r.config}})
	conn, err := harness.Dial(r.d.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r.c = intentv1.NewIntentServiceClient(conn)
	r.openSession(t)
	return r
}

// configure writes the config file.
func (r *archiveRig) configure(t *testing.T, settings map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("{}\n")
	if len(settings) > 0 {
		b.Reset()
		for k, v := range settings {
			fmt.Fprintf(&b, "%s: %q\n", k, v)
		}
	}
	if err := os.WriteFile(r.config, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (r *archiveRig) openSession(t *testing.T) {
	t.Helper()
	s, err := r.c.OpenSession(archiveCtx(t), &intentv1.OpenSessionRequest{Worker: "archive-worker", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	r.sess = s.SessionId
}

// restart stops intentd and starts it again with settings, and opens a
// new session.
func (r *archiveRig) restart(t *testing.T, settings map[string]string) {
	t.Helper()
	if !r.d.Stop() {
		t.Fatal("intentd ignored SIGTERM")
	}
	r.configure(t, settings)
	if err := r.d.Restart(); err != nil {
		t.Fatal(err)
	}
	r.openSession(t)
}

// acquire is an Acquire with register of it, under the rig's session.
func (r *archiveRig) acquire(t *testing.T, it *archived, requestID string) (*intentv1.AcquireResponse, error) {
	t.Helper()
	return r.c.Acquire(archiveCtx(t), &intentv1.AcquireRequest{Key: it.key, SessionId: r.sess, RequestId: requestID,
		Register: &intentv1.RegisterRequest{Key: it.key, Params: it.params, Labels: map[string]string{"suite": "archive"}}})
}

// cycle registers, acquires and completes it, then reads the answers to
// keep: a replay (the same Acquire again, a request of its own) and Get.
func (r *archiveRig) cycle(t *testing.T, it *archived) {
	t.Helper()
	a, err := r.acquire(t, it, "first-"+it.key)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", it.key, err)
	}
	if a.Outcome != intentv1.Outcome_OUTCOME_EXECUTE {
		t.Fatalf("Acquire(%s) = %v, want EXECUTE", it.key, a.Outcome)
	}
	if _, err := r.c.Complete(archiveCtx(t), &intentv1.CompleteRequest{Key: it.key, Token: a.Lease.Token,
		Result: &intentv1.Result{Payload: []byte(`{"refund":"` + it.key + `"}`), ExternalRefs: map[string]string{"psp": "re_" + it.key}}}); err != nil {
		t.Fatalf("Complete(%s): %v", it.key, err)
	}
	it.replay, it.get = r.answers(t, it)
}

// answers are the replay's and Get's answers about it now.
func (r *archiveRig) answers(t *testing.T, it *archived) (replay, get []byte) {
	t.Helper()
	a, err := r.acquire(t, it, "replay-"+it.key)
	if err != nil {
		t.Fatalf("replay of %s: %v", it.key, err)
	}
	if a.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
		t.Fatalf("replay of %s = %v, want COMPLETED", it.key, a.Outcome)
	}
	g, err := r.c.Get(archiveCtx(t), &intentv1.GetRequest{Key: it.key})
	if err != nil {
		t.Fatalf("Get(%s): %v", it.key, err)
	}
	return wire(t, a), wire(t, g)
}

// same checks that every intent answers byte for byte as before its move,
// that History (Get's history) and List hold it, and that a Register
// with other params is FINGERPRINT_MISMATCH.
func (r *archiveRig) same(t *testing.T, when string, its []*archived) {
	t.Helper()
	for _, it := range its {
		replay, get := r.answers(t, it)
		if !bytes.Equal(replay, it.replay) {
			t.Errorf("%s: the replay of %s differs from the one before its move", when, it.key)
		}
		if !bytes.Equal(get, it.get) {
			t.Errorf("%s: Get(%s) differs from the one before its move", when, it.key)
		}
		var g intentv1.GetResponse
		if err := proto.Unmarshal(get, &g); err != nil {
			t.Fatal(err)
		}
		kinds := map[intentv1.HistoryEntry_Kind]bool{}
		for _, h := range g.Intent.History {
			kinds[h.Kind] = true
		}
		if !kinds[intentv1.HistoryEntry_KIND_REGISTERED] || !kinds[intentv1.HistoryEntry_KIND_COMPLETED] {
			t.Errorf("%s: the history of %s lacks its registration or completion: %v", when, it.key, g.Intent.History)
		}
		other, _ := structpb.NewStruct(map[string]any{"amount": 999999})
		_, err := r.c.Register(archiveCtx(t), &intentv1.RegisterRequest{Key: it.key, Params: other})
		if status.Code(err) != codes.FailedPrecondition || errReason(err) != "FINGERPRINT_MISMATCH" {
			t.Errorf("%s: Register(%s) with other params: %v, want FINGERPRINT_MISMATCH", when, it.key, err)
		}
	}
	listed := map[string]intentv1.State{}
	token := ""
	for {
		l, err := r.c.List(archiveCtx(t), &intentv1.ListRequest{Label: "suite=archive", States: []intentv1.State{intentv1.State_STATE_COMPLETED}, PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatalf("%s: List: %v", when, err)
		}
		for _, in := range l.Intents {
			if _, dup := listed[in.Key]; dup {
				t.Errorf("%s: List returned %s twice", when, in.Key)
			}
			listed[in.Key] = in.State
		}
		if token = l.NextPageToken; token == "" {
			break
		}
	}
	for _, it := range its {
		if listed[it.key] != intentv1.State_STATE_COMPLETED {
			t.Errorf("%s: List (pages of 2, across both tiers) lacks %s: %v", when, it.key, listed)
		}
	}
}

// etcdKeys is every key of the intentd's embedded etcd.
func etcdKeys(t *testing.T, d *harness.Intentd) []string {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + filepath.Join(d.DataDir, "etcd.sock")}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(archiveCtx(t), "\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	keys := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = string(kv.Key)
	}
	return keys
}

// waitMoved waits until etcd holds no key naming any of its (the record
// and its index keys gone: the record is in the archive only).
func waitMoved(t *testing.T, d *harness.Intentd, its []*archived, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var left []string
		for _, k := range etcdKeys(t, d) {
			for _, it := range its {
				if strings.HasSuffix(k, "/"+it.key) || strings.Contains(k, "/"+it.key+"/") {
					left = append(left, k)
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v etcd still holds %d keys of the completed intents, e.g. %q", within, len(left), left[0])
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func newArchived(t *testing.T, prefix string, n int) []*archived {
	t.Helper()
	its := make([]*archived, n)
	for i := range its {
		p, err := structpb.NewStruct(map[string]any{"amount": float64(100 + i), "currency": "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		its[i] = &archived{key: fmt.Sprintf("%s-%d", prefix, i), params: p}
	}
	return its
}

// Completed intents leave etcd for PostgreSQL and answer as before: a
// replay byte for byte, Get with its history, List across both tiers, a
// mismatch; after a restart too. With PostgreSQL stopped live intents
// still cycle, and a replay of an archived intent is UNAVAILABLE with
// reason ARCHIVE_UNAVAILABLE; PostgreSQL back, it answers again.
func TestArchiveKeepsEveryAnswer(t *testing.T) {
	pg := pgtest.Start(t)
	settings := map[string]string{"archive-dsn": pg.NewDatabase(t), "archive-after": "1s"}
	r := startArchiveRig(t, settings)
	its := newArchived(t, "arch", 6)
	for _, it := range its {
		r.cycle(t, it)
	}
	waitMoved(t, r.d, its, 90*time.Second)
	r.same(t, "moved", its)

	// A replica remembers final records it read (a replay from memory
	// needs neither tier): cold is not read again after the restart, so
	// that with PostgreSQL stopped only the archive holds it.
	warm, cold := its[:len(its)-1], its[len(its)-1]
	r.restart(t, settings)
	r.same(t, "moved, intentd restarted", warm)

	// Live intents, registered while PostgreSQL answers.
	live := newArchived(t, "live", 3)
	for _, it := range live {
		if _, err := r.c.Register(archiveCtx(t), &intentv1.RegisterRequest{Key: it.key, Params: it.params, Labels: map[string]string{"suite": "live"}}); err != nil {
			t.Fatalf("Register(%s): %v", it.key, err)
		}
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, it := range live {
		a, err := r.acquire(t, it, "live-"+it.key)
		if err != nil {
			t.Fatalf("PostgreSQL stopped: Acquire(%s), a live intent: %v", it.key, err)
		}
		if _, err := r.c.Complete(archiveCtx(t), &intentv1.CompleteRequest{Key: it.key, Token: a.Lease.Token, Result: &intentv1.Result{Payload: []byte(`{}`)}}); err != nil {
			t.Fatalf("PostgreSQL stopped: Complete(%s), a live intent: %v", it.key, err)
		}
	}
	_, err := r.acquire(t, cold, "replay-"+cold.key)
	if status.Code(err) != codes.Unavailable || errReason(err) != "ARCHIVE_UNAVAILABLE" {
		t.Errorf("PostgreSQL stopped: replay of archived %s: %v, want UNAVAILABLE with reason ARCHIVE_UNAVAILABLE", cold.key, err)
	}
	_, err = r.c.Get(archiveCtx(t), &intentv1.GetRequest{Key: cold.key})
	if status.Code(err) != codes.Unavailable || errReason(err) != "ARCHIVE_UNAVAILABLE" {
		t.Errorf("PostgreSQL stopped: Get of archived %s: %v, want UNAVAILABLE with reason ARCHIVE_UNAVAILABLE", cold.key, err)
	}
	// A warm one replays from the replica's memory, PostgreSQL or not.
	if a, err := r.acquire(t, warm[0], "replay-"+warm[0].key); err != nil || !bytes.Equal(wire(t, a), warm[0].replay) {
		t.Errorf("PostgreSQL stopped: replay of %s, read since the restart: %v, want the same answer from memory", warm[0].key, err)
	}
	// A key nobody registered must be asked of the archive too (it might
	// be archived): never created on a guess.
	fresh := newArchived(t, "fresh", 1)[0]
	if _, err := r.acquire(t, fresh, "fresh"); err != nil && errReason(err) != "ARCHIVE_UNAVAILABLE" {
		t.Errorf("PostgreSQL stopped: Acquire with register of a new key: %v, want it served or ARCHIVE_UNAVAILABLE", err)
	} else {
		t.Logf("PostgreSQL stopped: a new registration answered %v", err)
	}

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := r.acquire(t, cold, "replay-"+cold.key)
		if err == nil {
			if !bytes.Equal(wire(t, a), cold.replay) {
				t.Errorf("PostgreSQL back: the replay of %s differs from the one before its move", cold.key)
			}
			break
		}
		if errReason(err) != "ARCHIVE_UNAVAILABLE" || time.Now().After(deadline) {
			t.Fatalf("PostgreSQL back: replay of %s: %v", cold.key, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.same(t, "PostgreSQL back", its)
	// What completed while it was down moves once it is back.
	waitMoved(t, r.d, live, 90*time.Second)
}

// An installation that already holds finished intents turns the archive
// on: restarted with --archive-dsn, its final records move (nothing is
// lost) and answer as before.
func TestArchiveTurnedOnLater(t *testing.T) {
	pg := pgtest.Start(t)
	r := startArchiveRig(t, nil)
	its := newArchived(t, "before", 6)
	for _, it := range its {
		r.cycle(t, it)
	}
	r.restart(t, map[string]string{"archive-dsn": pg.NewDatabase(t), "archive-after": "1s"})
	waitMoved(t, r.d, its, 90*time.Second)
	r.same(t, "archive turned on", its)
}
