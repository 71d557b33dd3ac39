package reliability

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/pgtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The archive tier's scenarios (issue 26): replicas with --archive-dsn on
// one real PostgreSQL (internal/testing/pgtest), final intents moving to
// it after --archive-after 1s, under the suite's load, while PostgreSQL or
// a replica fails. Records move only once the storage format version
// advanced (about 15 s after the replicas started; no flag shortens it),
// so every run first waits until some final intents have moved.
//
// A fresh registration asks the archive whether its key was ever archived
// (docs/DESIGN.md, "Two tiers: etcd and the archive", "Not yet"): while
// PostgreSQL is down new keys cannot be registered. The load therefore
// works through a bank of intents registered before the faults, handed to
// the workers at a steady pace (archiveFeedEvery): live intents, whose
// calls never ask the archive.

const (
	// archiveFeedEvery is the pace at which the bank's intents are handed
	// to the workers.
	archiveFeedEvery = 25 * time.Millisecond
	// archiveBefore is the reference window before the first fault.
	archiveBefore = 5 * time.Second
	// archiveMinRatio is the completion rate during a fault, as a share
	// of the rate before it, below which the run fails.
	archiveMinRatio = 0.5
	// archiveResume bounds how long moves may stop after the janitor's
	// replica was killed: its election key's session TTL (10s) and a pass.
	archiveResume = 20 * time.Second
	// archivePause is how long TestArchiveJanitorPausedPastItsElection
	// holds the janitor's replica: past its election's session TTL (10s),
	// so that another replica leads and moves meanwhile.
	archivePause = 18 * time.Second
)

// archiveFlags are a replica's flags for an archive at dsn.
func archiveFlags(dsn string) []string {
	return []string{"--archive-dsn", dsn, "--archive-after", "1s"}
}

// coldIntent is an intent completed before the faults and moved to the
// archive: its key, params, and its answers read before the move.
type coldIntent struct {
	key         string
	params      *structpb.Struct
	replay, get []byte
}

// wireBytes is m as deterministic bytes.
func wireBytes(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reasonOf is the ErrorInfo reason of a gRPC error, "" for none.
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

// coldProber completes intents outside the recorded history (they are not
// the load's), keeps their answers, and later asks for them again.
type coldProber struct {
	t    *testing.T
	sess string
	// by is the client the intents are completed through, ask the ones
	// they are asked again through (another replica: its cache has never
	// seen them, so it must ask the archive).
	by, ask intentv1.IntentServiceClient
}

func newColdProber(t *testing.T, by, ask string) *coldProber {
	t.Helper()
	p := &coldProber{t: t}
	for _, a := range []struct {
		addr string
		c    *intentv1.IntentServiceClient
	}{{by, &p.by}, {ask, &p.ask}} {
		cc, err := harness.Dial(a.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		*a.c = intentv1.NewIntentServiceClient(cc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := p.by.OpenSession(ctx, &intentv1.OpenSessionRequest{Worker: "cold-prober", Ttl: durationpb.New(5 * time.Minute)})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	p.sess = s.SessionId
	return p
}

func (p *coldProber) acquire(ctx context.Context, c intentv1.IntentServiceClient, it *coldIntent, requestID string) (*intentv1.AcquireResponse, error) {
	return c.Acquire(ctx, &intentv1.AcquireRequest{Key: it.key, SessionId: p.sess, RequestId: requestID,
		Register: &intentv1.RegisterRequest{Key: it.key, Params: it.params}})
}

// complete registers, acquires and completes n intents named prefix-i and
// reads the answers to keep (a replay, Get).
func (p *coldProber) complete(prefix string, n int) []*coldIntent {
	t := p.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []*coldIntent
	for i := range n {
		par, err := structpb.NewStruct(map[string]any{"amount": float64(500 + i), "currency": "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		it := &coldIntent{key: fmt.Sprintf("%s-%02d", prefix, i), params: par}
		a, err := p.acquire(ctx, p.by, it, "first-"+it.key)
		if err != nil || a.Outcome != intentv1.Outcome_OUTCOME_EXECUTE {
			t.Fatalf("Acquire(%s) = %v, %v; want EXECUTE", it.key, a.GetOutcome(), err)
		}
		if _, err := p.by.Complete(ctx, &intentv1.CompleteRequest{Key: it.key, Token: a.Lease.Token,
			Result: &intentv1.Result{Payload: []byte(`{"cold":"` + it.key + `"}`)}}); err != nil {
			t.Fatalf("Complete(%s): %v", it.key, err)
		}
		r, err := p.acquire(ctx, p.by, it, "replay-"+it.key)
		if err != nil || r.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
			t.Fatalf("replay of %s = %v, %v; want COMPLETED", it.key, r.GetOutcome(), err)
		}
		g, err := p.by.Get(ctx, &intentv1.GetRequest{Key: it.key})
		if err != nil {
			t.Fatalf("Get(%s): %v", it.key, err)
		}
		it.replay, it.get = wireBytes(t, r), wireBytes(t, g)
		out = append(out, it)
	}
	return out
}

// probeKind classifies one answer about a cold intent.
type probeKind int

const (
	probeSame        probeKind = iota // the answer before the move, byte for byte
	probeUnavailable                  // UNAVAILABLE with reason ARCHIVE_UNAVAILABLE
	probeUnknown                      // UNAVAILABLE or DEADLINE_EXCEEDED otherwise
	probeWrong                        // any other answer: a wrong one
)

// probe is one answer about a cold intent.
type probe struct {
	at     time.Duration
	kind   probeKind
	detail string
}

// ask replays it and reads it on the asking replica and classifies both
// answers.
func (p *coldProber) ask1(it *coldIntent) []probe {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	classify := func(m proto.Message, err error, want []byte) probeKind {
		switch {
		case err == nil && bytes.Equal(wireBytes(p.t, m), want):
			return probeSame
		case err == nil:
			return probeWrong
		case status.Code(err) == codes.Unavailable && reasonOf(err) == "ARCHIVE_UNAVAILABLE":
			return probeUnavailable
		case status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded:
			return probeUnknown
		}
		return probeWrong
	}
	r, err := p.acquire(ctx, p.ask, it, "replay-"+it.key)
	k1 := classify(r, err, it.replay)
	d1 := fmt.Sprintf("replay of %s: %v (outcome %v)", it.key, err, r.GetOutcome())
	g, err := p.ask.Get(ctx, &intentv1.GetRequest{Key: it.key})
	k2 := classify(g, err, it.get)
	d2 := fmt.Sprintf("Get(%s): %v (state %v)", it.key, err, g.GetIntent().GetState())
	return []probe{{kind: k1, detail: d1}, {kind: k2, detail: d2}}
}

// probing asks about its, round robin, until stop is closed, and returns
// every answer (timed on rec's clock).
func (p *coldProber) probing(rec *Recorder, its []*coldIntent, stop <-chan struct{}) func() []probe {
	var mu sync.Mutex
	var out []probe
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			at := rec.Since()
			ps := p.ask1(its[i%len(its)])
			mu.Lock()
			for _, pr := range ps {
				pr.at = at
				out = append(out, pr)
			}
			mu.Unlock()
		}
	}()
	return func() []probe {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return out
	}
}

// untilSame asks about every one of its until each answers as before its
// move, within d; it fails the test on a wrong answer or when d passes.
func (p *coldProber) untilSame(its []*coldIntent, d time.Duration) {
	t := p.t
	t.Helper()
	deadline := time.Now().Add(d)
	for _, it := range its {
		for {
			ps := p.ask1(it)
			if ps[0].kind == probeSame && ps[1].kind == probeSame {
				break
			}
			for _, pr := range ps {
				if pr.kind == probeWrong {
					t.Errorf("archive back: a wrong answer: %s", pr.detail)
					return
				}
			}
			if time.Now().After(deadline) {
				t.Errorf("archive back: %s still answers %s / %s after %v", it.key, ps[0].detail, ps[1].detail, d)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// awaitMoved waits until etcd holds no key naming any of its: each record
// is in the archive only.
func awaitMoved(t *testing.T, admin *clientv3.Client, its []*coldIntent, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := admin.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly())
		cancel()
		left := -1
		if err == nil {
			left = 0
			for _, kv := range resp.Kvs {
				k := string(kv.Key)
				for _, it := range its {
					if strings.HasSuffix(k, "/"+it.key) || strings.Contains(k, "/"+it.key+"/") {
						left++
					}
				}
			}
		}
		if left == 0 {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("after %v etcd still holds %d keys of the cold intents (%v): the archiver did not move them", within, left, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// feedBank hands keys to load's workers, one every archiveFeedEvery, until
// stop is closed or the bank is empty; what is left is handed over at
// once when it returns, so that every registered intent completes.
func feedBank(load *Load, keys []string, stop <-chan struct{}) (wait func() int) {
	done := make(chan int)
	go func() {
		tick := time.NewTicker(archiveFeedEvery)
		defer tick.Stop()
		i := 0
		defer func() {
			load.Adopt(keys[i:])
			done <- i
		}()
		for ; i < len(keys); i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			load.Adopt(keys[i : i+1])
		}
	}()
	return func() int { return <-done }
}

// TestArchivePostgresStoppedAndPaused: two replicas share one archive
// (--archive-after 1s) under load; PostgreSQL is paused (SIGSTOP, every
// process of it) 5 s, then, 2 s after it resumed, stopped 5 s and started
// again. Live intents keep completing at least at half the rate before
// the faults; answers about archived intents are the ones before their
// move or UNAVAILABLE with reason ARCHIVE_UNAVAILABLE while it is down,
// never another; once it is back, they are the ones before the move.
// Every check of Finish holds.
func TestArchivePostgresStoppedAndPaused(t *testing.T) {
	pg, _, e, admin := archiveEnv(t)
	name := sanitize(t.Name())

	// Cold intents, completed on r0 and asked about on r1; one set for
	// each fault, since a replica remembers a record it read once.
	prober := newColdProber(t, e.Intentds[0].Addr, e.Intentds[1].Addr)
	coldPause := prober.complete(name+"-cold-pause", 8)
	coldStop := prober.complete(name+"-cold-stop", 8)

	// The bank: live intents registered while PostgreSQL answers.
	var bank []string
	for i := range 1200 {
		bank = append(bank, fmt.Sprintf("%s-%05d", name, i))
	}
	registerAll(t, recordedClient(t, e, e.Intentds[0].Addr), bank, func(i int) *intentv1.RegisterRequest {
		return &intentv1.RegisterRequest{Params: params(i)}
	})
	moved := awaitMoved(t, admin, append(append([]*coldIntent(nil), coldPause...), coldStop...), 60*time.Second)
	t.Logf("the cold intents left etcd %v after the bank was registered", moved.Round(time.Millisecond))

	load := e.StartLoad(LoadConfig{Max: -1, Workers: 6, Seed: harness.Seed()})
	stopFeed := make(chan struct{})
	fed := feedBank(load, bank, stopFeed)
	e.WaitOK(100, 20*time.Second)
	time.Sleep(archiveBefore)

	phase := func(kind, detail string, its []*coldIntent, fault, heal func() error) (FaultEvent, []probe) {
		stop := make(chan struct{})
		ev := e.Faults.Inject(kind, "%s", detail)
		if err := fault(); err != nil {
			t.Fatal(err)
		}
		answers := prober.probing(e.Rec, its, stop)
		time.Sleep(5 * time.Second)
		close(stop)
		ps := answers()
		if err := heal(); err != nil {
			t.Fatal(err)
		}
		e.Faults.Heal(ev)
		return *ev, ps
	}
	pause, pauseProbes := phase("pause-archive", "PostgreSQL SIGSTOPped 5s", coldPause,
		func() error { pg.Pause(); return nil }, func() error { pg.Resume(); return nil })
	time.Sleep(2 * time.Second)
	stopped, stopProbes := phase("stop-archive", "PostgreSQL stopped 5s, started again", coldStop,
		pg.Stop, pg.Start)
	time.Sleep(3 * time.Second)
	prober.untilSame(append(append([]*coldIntent(nil), coldPause...), coldStop...), 30*time.Second)
	close(stopFeed)
	t.Logf("the bank fed %d of %d intents at one every %v before the end (the rest at once)", fed(), len(bank), archiveFeedEvery)

	noticed := map[string]int{}
	for _, f := range []struct {
		ev FaultEvent
		ps []probe
	}{{pause, pauseProbes}, {stopped, stopProbes}} {
		counts := map[probeKind]int{}
		for _, pr := range f.ps {
			counts[pr.kind]++
			if pr.kind == probeWrong {
				t.Errorf("%s: a wrong answer about an archived intent: %s", f.ev.Kind, pr.detail)
			}
		}
		noticed[f.ev.Kind] = counts[probeUnavailable]
		t.Logf("%s: answers about archived intents: same=%d archive-unavailable=%d other-unavailable=%d wrong=%d",
			f.ev.Kind, counts[probeSame], counts[probeUnavailable], counts[probeUnknown], counts[probeWrong])
		if counts[probeUnavailable] == 0 {
			t.Errorf("%s: no answer about an archived intent was ARCHIVE_UNAVAILABLE (%d answers)", f.ev.Kind, len(f.ps))
		}
	}
	e.Finish(load, FinishOptions{Noticed: func(ev FaultEvent, _ []Call) int { return noticed[ev.Kind] }})

	before := load.Throughput(Window{pause.Injected - archiveBefore, pause.Injected})
	t.Logf("before the faults: %v", before)
	for _, ev := range []FaultEvent{pause, stopped} {
		during := load.Throughput(Window{ev.Injected, ev.Healed})
		ratio := 0.0
		if before.PerSecond > 0 {
			ratio = during.PerSecond / before.PerSecond
		}
		t.Logf("%s: %v (%.0f%% of before)", ev.Kind, during, 100*ratio)
		if ratio < archiveMinRatio {
			t.Errorf("%s: live intents completed at %.1f/s while the archive was down, %.0f%% of the %.1f/s before, want at least %.0f%%",
				ev.Kind, during.PerSecond, 100*ratio, before.PerSecond, 100*archiveMinRatio)
		}
	}
}

// inEtcd returns which of keys etcd holds any key of (the record or an
// index naming it).
func inEtcd(t *testing.T, admin *clientv3.Client, keys []string) map[string]bool {
	t.Helper()
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := admin.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	held := map[string]bool{}
	for _, kv := range resp.Kvs {
		for _, seg := range strings.Split(string(kv.Key), "/") {
			if want[seg] {
				held[seg] = true
			}
		}
	}
	return held
}

// psql runs sql on the database at dsn with PostgreSQL's own client (the
// server's binaries: pgtest.Bin) and returns its rows, one a line, fields
// separated by "|".
func psql(t *testing.T, dsn, sql string) []string {
	t.Helper()
	bin, err := pgtest.Bin()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("psql %q: %v: %s", sql, err, stderr.String())
	}
	var rows []string
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" {
			rows = append(rows, l)
		}
	}
	return rows
}

// inArchive returns how many rows the archive's intents table holds of
// each of keys (of any tenant) that it holds at all.
func inArchive(t *testing.T, dsn string, keys []string) map[string]int {
	t.Helper()
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	out := map[string]int{}
	for _, row := range psql(t, dsn, "SELECT key, count(*) FROM intents GROUP BY key") {
		k, n, ok := strings.Cut(row, "|")
		c, err := strconv.Atoi(n)
		if !ok || err != nil {
			t.Fatalf("psql: unexpected row %q", row)
		}
		if want[k] {
			out[k] = c
		}
	}
	return out
}

// checkTiers waits until etcd holds nothing of keys (final intents all:
// each moves once past --archive-after) and checks that each is then in
// the archive, once: in exactly one tier.
func checkTiers(t *testing.T, admin *clientv3.Client, dsn string, keys []string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var left map[string]bool
	for {
		left = inEtcd(t, admin, keys)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(left) > 0 {
		var some []string
		for k := range left {
			if len(some) < 5 {
				some = append(some, k)
			}
		}
		t.Errorf("%d of %d final intents still in etcd 60s after the load ended, e.g. %v", len(left), len(keys), some)
	}
	rows := inArchive(t, dsn, keys)
	missing, twice := 0, 0
	for _, k := range keys {
		switch n := rows[k]; {
		case n == 0 && !left[k]:
			missing++
			if missing <= 5 {
				t.Errorf("%s is in neither tier", k)
			}
		case n > 1:
			twice++
			t.Errorf("%s has %d rows in the archive", k, n)
		case n == 1 && left[k]:
			t.Errorf("%s is in both tiers", k)
		}
	}
	t.Logf("tiers: %d final intents, %d in the archive, %d still in etcd, %d in neither, %d twice", len(keys), len(rows), len(left), missing, twice)
}

// getBytes reads each key through c and returns Get's answers as
// deterministic bytes.
func getBytes(t *testing.T, c intentv1.IntentServiceClient, keys []string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		g, err := c.Get(ctx, &intentv1.GetRequest{Key: k})
		cancel()
		if err != nil {
			t.Errorf("Get(%s): %v", k, err)
			continue
		}
		out[k] = wireBytes(t, g)
	}
	return out
}

// TestArchiveReplicaKilledMidMove: two replicas archive under load
// (--archive-after 1s: every pass of the janitor moves records); the
// replica holding the janitor election (the one that moves) is SIGKILLed
// three times while the archive is gaining rows (a pass under way), each
// time restarted 1 s later; the next kill waits until moves resumed (the
// dead janitor's election key lives out its session's TTL first). A kill between a
// record's archive write and its etcd delete leaves it in etcd, answering
// as before, and the next pass writes the same row again. Afterwards every
// final intent is in exactly one tier (etcd holds nothing of it once it
// moved, the archive one row), the intents read just before each kill
// answer byte for byte as then, and every check of Finish holds.
func TestArchiveReplicaKilledMidMove(t *testing.T) {
	sc := startArchiveScenario(t, LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e, load := sc.e, sc.load
	time.Sleep(2 * time.Second)

	// Answers to keep: the intents most recently completed at each kill,
	// in etcd or on their way out of it.
	reader := sc.reader()
	kept := map[string][]byte{}
	recent := func(n int) []string {
		settled := load.Settled()
		keys := load.Keys()
		var out []string
		for i := len(keys) - 1; i >= 0 && len(out) < n; i-- {
			if _, ok := settled[keys[i]]; ok {
				out = append(out, keys[i])
			}
		}
		return out
	}
	arch := sc.rows
	var served []int64
	for round := range 3 {
		// A killed janitor's election key outlives it (its etcd session's
		// TTL): moves resume once it expired and another replica leads.
		n, waited := arch.moving()
		sweeper, other := janitorReplica(t, e)
		for k, b := range getBytes(t, reader, recent(20)) {
			kept[k] = b
		}
		ev := e.Faults.Inject("kill-janitor", "replica %s (the janitor's), SIGKILL mid-pass (archive at %d rows, growing; moves resumed after %v), restarted after 1s (kill %d of 3)",
			sweeper.Name, n, waited.Round(100*time.Millisecond), round+1)
		otherBefore := other.Served()
		sweeper.Kill()
		time.Sleep(time.Second)
		served = append(served, other.Served()-otherBefore)
		if err := sweeper.Restart(); err != nil {
			t.Fatal(err)
		}
		e.Faults.Heal(ev)
	}
	n, waited := arch.moving()
	t.Logf("moves resumed %v after the last kill's restart (archive at %d rows)", waited.Round(100*time.Millisecond), n)
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{Noticed: func(ev FaultEvent, _ []Call) int {
		for i, x := range e.Faults.Events() {
			if x.Injected == ev.Injected {
				return int(served[i])
			}
		}
		return 0
	}})

	sc.check(reader, kept, "just before a kill")
}

// TestArchiveJanitorPausedPastItsElection: two replicas archiving the same
// intents at once. The replica holding the janitor election is SIGSTOPped
// mid-pass (the archive gaining rows: some records written to PostgreSQL
// and not yet deleted from etcd) for archivePause, longer than its
// election's session TTL: the other replica is elected and moves the same
// due records, those the paused one had already written included; then
// the paused one resumes where it stopped, still believing it leads, and
// finishes its pass. Moves resume while it is paused; afterwards every
// final intent is in exactly one tier (one archive row, nothing in etcd),
// the intents read just before the pause answer byte for byte as then,
// and every check of Finish holds.
func TestArchiveJanitorPausedPastItsElection(t *testing.T) {
	sc := startArchiveScenario(t, LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e, load := sc.e, sc.load
	time.Sleep(2 * time.Second)

	reader := sc.reader()
	var recent []string
	settled, keys := load.Settled(), load.Keys()
	for i := len(keys) - 1; i >= 0 && len(recent) < 40; i-- {
		if _, ok := settled[keys[i]]; ok {
			recent = append(recent, keys[i])
		}
	}
	kept := getBytes(t, reader, recent)

	arch := sc.rows
	n, _ := arch.moving()
	sweeper, other := janitorReplica(t, e)
	ev := e.Faults.Inject("pause-janitor", "replica %s (the janitor's), SIGSTOP for %v mid-pass (archive at %d rows, growing), then SIGCONT", sweeper.Name, archivePause, n)
	otherBefore := other.Served()
	if err := sweeper.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = sweeper.Resume()
		}
	})
	start := time.Now()
	// The other replica takes over once the paused one's election key
	// expired: moves resume while it is still paused.
	arch.moving()
	if into := time.Since(start); into >= archivePause {
		t.Errorf("moves resumed only %v after the janitor was paused, not while it was", into.Round(100*time.Millisecond))
	} else {
		t.Logf("moves resumed %v into the pause", into.Round(100*time.Millisecond))
	}
	if d := archivePause - time.Since(start); d > 0 {
		time.Sleep(d)
	}
	served := other.Served() - otherBefore
	if err := sweeper.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	e.Faults.Heal(ev)
	// The resumed replica finishes its pass and finds itself no longer
	// elected; moves go on.
	time.Sleep(3 * time.Second)
	n, waited := arch.moving()
	t.Logf("after the resume: archive at %d rows, moving (%v)", n, waited.Round(100*time.Millisecond))
	e.Finish(load, FinishOptions{Noticed: func(FaultEvent, []Call) int { return int(served) }})

	sc.check(reader, kept, "before the pause")
}

// archiveScenario is how the scenarios with a replica or etcd failing
// under load begin: PostgreSQL, two replicas archiving into it
// (archiveFlags), four cold intents completed and moved, the load of cfg
// running and answering, and the first records moved (once the storage
// format version advanced).
type archiveScenario struct {
	t      *testing.T
	e      *Env
	admin  *clientv3.Client
	dsn    string
	prober *coldProber
	cold   []*coldIntent
	load   *Load
	rows   *archiveRows
}

// archiveEnv starts PostgreSQL with a database of the test's and two
// replicas archiving into it (archiveFlags).
func archiveEnv(t *testing.T) (pg *pgtest.Server, dsn string, e *Env, admin *clientv3.Client) {
	t.Helper()
	pg = pgtest.Start(t)
	dsn = pg.NewDatabase(t)
	e = NewEnv(t, report, EnvConfig{Replicas: 2, Intentd: harness.IntentdConfig{Flags: archiveFlags(dsn)}})
	admin, err := e.Cluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	return pg, dsn, e, admin
}

func startArchiveScenario(t *testing.T, cfg LoadConfig) *archiveScenario {
	t.Helper()
	_, dsn, e, admin := archiveEnv(t)
	prober := newColdProber(t, e.Intentds[0].Addr, e.Intentds[1].Addr)
	cold := prober.complete(sanitize(t.Name())+"-cold", 4)
	load := e.StartLoad(cfg)
	e.WaitOK(100, 20*time.Second)
	moved := awaitMoved(t, admin, cold, 60*time.Second)
	t.Logf("the first records left etcd %v after the load began", moved.Round(time.Millisecond))
	return &archiveScenario{t: t, e: e, admin: admin, dsn: dsn, prober: prober, cold: cold, load: load, rows: newArchiveRows(t, dsn)}
}

// reader is a client of every replica, for the answers a scenario keeps.
func (sc *archiveScenario) reader() intentv1.IntentServiceClient {
	cc, err := harness.Dial(sc.e.Addrs()...)
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.t.Cleanup(func() { _ = cc.Close() })
	return intentv1.NewIntentServiceClient(cc)
}

// check, after Finish: every final intent of the load and the cold ones
// is in exactly one tier; each answer in kept (read through reader
// before the fault, when) is byte for byte Get's answer now; the cold
// intents answer as before their move.
func (sc *archiveScenario) check(reader intentv1.IntentServiceClient, kept map[string][]byte, when string) {
	t := sc.t
	t.Helper()
	keys := sc.load.Keys()
	for _, it := range sc.cold {
		keys = append(keys, it.key)
	}
	checkTiers(t, sc.admin, sc.dsn, keys)
	if len(kept) > 0 {
		differ := 0
		now := getBytes(t, reader, slices.Sorted(maps.Keys(kept)))
		for k, b := range kept {
			if !bytes.Equal(now[k], b) {
				differ++
				if differ <= 5 {
					t.Errorf("Get(%s) differs from its answer %s (%d bytes then, %d now)", k, when, len(b), len(now[k]))
				}
			}
		}
		t.Logf("answers kept %s: %d, the same after the moves: %d", when, len(kept), len(kept)-differ)
	}
	sc.prober.untilSame(sc.cold, 10*time.Second)
}

// archiveRows counts the rows of the archive's intents table.
type archiveRows struct {
	t   *testing.T
	dsn string
}

func newArchiveRows(t *testing.T, dsn string) *archiveRows { return &archiveRows{t: t, dsn: dsn} }

func (a *archiveRows) count() int {
	a.t.Helper()
	rows := psql(a.t, a.dsn, "SELECT count(*) FROM intents")
	if len(rows) != 1 {
		a.t.Fatalf("psql: count(*) answered %q", rows)
	}
	n, err := strconv.Atoi(rows[0])
	if err != nil {
		a.t.Fatalf("psql: count(*) answered %q", rows[0])
	}
	return n
}

// moving waits until the archive gained rows within the last 200ms (a
// pass of the archiver is under way), for archiveResume at most, and
// returns the rows then and how long it waited.
func (a *archiveRows) moving() (int, time.Duration) {
	a.t.Helper()
	start := time.Now()
	last := a.count()
	for time.Since(start) < archiveResume {
		time.Sleep(200 * time.Millisecond)
		n := a.count()
		if n > last {
			return n, time.Since(start)
		}
		last = n
	}
	a.t.Fatalf("the archive gained no row for %v: no replica moves records (a dead janitor's election key lives out a 10s session TTL; then another replica must lead)", archiveResume)
	return 0, 0
}

// TestArchiveEtcdLeaderStalled: two replicas archive (--archive-after 1s)
// under the stalled-member scenarios' closed loop (eight workers
// registering, acquiring, ordering and completing back to back); the etcd
// leader is SIGSTOPped for 3 s while a pass of the archiver is under way.
// From 1 s after the stall began until it ended intents complete at least
// at half the rate of the 5 s before; after it, at least a tenth (no
// stall) and moves resume; every final intent then ends in exactly one
// tier, archived intents answer as before their move, and every check of
// Finish holds.
func TestArchiveEtcdLeaderStalled(t *testing.T) {
	sc := startArchiveScenario(t, LoadConfig{Workers: 8, SelfRegister: true, Redeliver: 10, Seed: harness.Seed()})
	e, load, rows := sc.e, sc.load, sc.rows
	time.Sleep(stallBefore)

	n, _ := rows.moving()
	m := leader(t, e.Cluster)
	const stalled = 3 * time.Second
	ev := e.Faults.Inject("pause-leader", "etcd %s, SIGSTOP for %v mid-pass (archive at %d rows, growing)", m.Name, stalled, n)
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(stalled)
	if err := m.Cont(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(ev)
	time.Sleep(stallAfter)
	n2, waited := rows.moving()
	t.Logf("4s after the heal the archive gained rows within %v (%d rows; %d at the stall)", waited.Round(100*time.Millisecond), n2, n)
	e.Finish(load, FinishOptions{})

	before := load.Throughput(Window{ev.Injected - stallBefore, ev.Injected})
	during := load.Throughput(Window{ev.Injected + time.Second, ev.Healed})
	after := load.Throughput(Window{ev.Healed + time.Second, ev.Healed + stallAfter})
	t.Logf("before the stall: %v", before)
	t.Logf("during it, from 1s in: %v", during)
	t.Logf("after the heal: %v", after)
	if during.PerSecond < archiveMinRatio*before.PerSecond {
		t.Errorf("with etcd %s stalled while archiving, intents completed at %.1f/s from 1s in: %.0f%% of the %.1f/s before, want at least %.0f%%",
			m.Name, during.PerSecond, 100*during.PerSecond/before.PerSecond, before.PerSecond, 100*archiveMinRatio)
	}
	if after.PerSecond < stallMinAfter*before.PerSecond {
		t.Errorf("after etcd %s came back, intents completed at %.1f/s: %.0f%% of the %.1f/s before, want at least %.0f%%",
			m.Name, after.PerSecond, 100*after.PerSecond/before.PerSecond, before.PerSecond, 100*stallMinAfter)
	}
	logFailedSessionCalls(t, e.Rec.Calls())
	sc.check(nil, nil, "")
}

// logFailedSessionCalls logs the Heartbeat and OpenSession calls that
// failed, by method, code and reason, with the span of their ends: where
// to look when workers lost their sessions.
func logFailedSessionCalls(t *testing.T, calls []Call) {
	t.Helper()
	type span struct {
		n          int
		first, end time.Duration
	}
	seen := map[string]*span{}
	for _, c := range calls {
		if c.OK() || (c.Method != "Heartbeat" && c.Method != "OpenSession") {
			continue
		}
		k := fmt.Sprintf("%s %v %s", c.Method, c.Code, c.Reason)
		sp, ok := seen[k]
		if !ok {
			sp = &span{first: c.End}
			seen[k] = sp
		}
		sp.n++
		sp.first, sp.end = min(sp.first, c.End), max(sp.end, c.End)
	}
	for _, k := range slices.Sorted(maps.Keys(seen)) {
		sp := seen[k]
		t.Logf("failed session calls: %s: %d, ending %v–%v", k, sp.n, sp.first.Round(time.Millisecond), sp.end.Round(time.Millisecond))
	}
}
