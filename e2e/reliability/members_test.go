package reliability

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// etcd members fail: the leader killed, two of three members down, a member
// paused, the leader partitioned from its peers.

// Scenario 1. The etcd leader is killed (kill -9) under load, the two
// survivors elect a new one, and the old leader comes back on its data
// directory. Every call meeting the election either waits or fails as
// unknown; none of them may cost an intent a second order, a lost
// acknowledgement or a token that goes backwards.
func TestEtcdLeaderKilled(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	old := leader(t, e.Cluster)
	ev := e.Faults.Inject("kill-leader", "etcd %s, SIGKILL", old.Name)
	old.Kill()
	next := leader(t, e.Cluster)
	if next == old {
		t.Fatalf("etcd %s still leads after it was killed", old.Name)
	}
	t.Logf("etcd %s killed; %s leads after %v", old.Name, next.Name, e.Rec.Since()-ev.Injected)
	time.Sleep(2 * time.Second) // load on two members
	restart(t, old)
	e.Faults.Heal(ev)
	leader(t, e.Cluster)
	time.Sleep(2 * time.Second) // load on three again
	e.Finish(load, FinishOptions{})
}

// Scenario 2. Quorum is lost: the leader and one follower are killed and
// stay down for 10s, so the survivor can elect nobody. intentd must answer
// every call within its own deadlines — UNAVAILABLE, safe to retry — and
// hang none, although the clients here would wait 20s per attempt; once the
// two members are back, service returns and every intent completes, once.
func TestEtcdQuorumLost(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	cfg := e.Intentds[0].Config
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed(), CallTimeout: 20 * time.Second})
	e.WaitOK(100, 20*time.Second)

	old := leader(t, e.Cluster)
	victims := []*Member{old, e.Cluster.Followers(old)[0]}
	ev := e.Faults.Inject("quorum-loss", "etcd %s and %s, SIGKILL, down 10s", victims[0].Name, victims[1].Name)
	for _, m := range victims {
		m.Kill()
	}
	time.Sleep(3 * time.Second)
	if m, err := e.Cluster.Leader(context.Background()); err == nil {
		t.Errorf("with 2 of 3 members down, %s still leads", m.Name)
	}
	time.Sleep(7 * time.Second)
	for _, m := range victims {
		restart(t, m)
	}
	e.Faults.Heal(ev)
	leader(t, e.Cluster)
	time.Sleep(3 * time.Second)
	run := e.Finish(load, FinishOptions{Drain: time.Minute})

	// Within its deadlines: one operation with its retries, plus one etcd
	// call to describe a holder, plus scheduling slack.
	bound := cfg.OperationTimeout + cfg.RequestTimeout + time.Second
	unavailable, during := 0, 0
	for _, c := range e.Rec.Calls() {
		if c.Start < ev.Injected || c.Start > ev.Healed || c.Method == "Heartbeat" {
			continue
		}
		during++
		if c.Latency() > bound {
			t.Errorf("%s %s started at %v during the outage and took %v, more than %v: it hung (%s %s)",
				c.Method, c.In.Key, c.Start.Round(time.Millisecond), c.Latency().Round(time.Millisecond), bound, c.Code, c.Message)
		}
		if c.Code == codes.Unavailable && c.Reason == "STORE_UNAVAILABLE" {
			unavailable++
		}
	}
	t.Logf("during the outage: %d calls, %d answered UNAVAILABLE by intentd", during, unavailable)
	if unavailable == 0 {
		t.Errorf("no call was answered UNAVAILABLE (STORE_UNAVAILABLE) by intentd while etcd had no quorum")
	}
	if r := run.Proof.Events[0].Recovery; r < 0 || r > 15*time.Second {
		t.Errorf("service returned %v after the heal, want within 15s", r)
	}
}

// Scenario 3. The leader is paused (SIGSTOP) for 3s, six election timeouts:
// the others elect a new leader while the old one still holds its sockets
// and answers nothing; then it continues, finds itself deposed, and
// rejoins. Calls routed to the paused member time out and are retried.
func TestEtcdMemberPaused(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	old := leader(t, e.Cluster)
	ev := e.Faults.Inject("pause-leader", "etcd %s, SIGSTOP for 3s (election timeout 500ms)", old.Name)
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}
	next := leader(t, e.Cluster) // asks only the members that run
	if next == old {
		t.Fatalf("paused etcd %s still leads", old.Name)
	}
	t.Logf("etcd %s paused; %s leads after %v", old.Name, next.Name, e.Rec.Since()-ev.Injected)
	time.Sleep(3*time.Second - (e.Rec.Since() - ev.Injected))
	if err := old.Cont(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(ev)
	leader(t, e.Cluster)
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{})
}

// Faults on etcd's peer links. The leader is partitioned from the other
// two members for 5s while every client still reaches all three: the
// majority elects a new leader, the old one steps down (it can no longer
// hear a quorum), and intentd's calls that land on it fail or wait rather
// than decide anything on a minority. Then the partition heals.
func TestEtcdLeaderPartitioned(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{Cluster: ClusterConfig{PeerProxies: true}})
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)

	old := leader(t, e.Cluster)
	ev := e.Faults.Inject("partition-leader", "etcd %s cut off from its peers", old.Name)
	if err := e.Cluster.Partition(old); err != nil {
		t.Fatal(err)
	}
	next := majorityLeader(t, e.Cluster, old)
	t.Logf("etcd %s partitioned; %s leads the majority after %v", old.Name, next.Name, e.Rec.Since()-ev.Injected)
	time.Sleep(4 * time.Second)
	e.Cluster.HealPartition()
	e.Faults.Heal(ev)
	leader(t, e.Cluster)
	time.Sleep(2 * time.Second)
	e.Finish(load, FinishOptions{})
	for _, m := range e.Cluster.Members {
		st := m.PeerProxy.Stats()
		t.Logf("etcd %s peer proxy: accepted %d, refused %d, reset %d", m.Name, st.Accepted, st.Refused, st.Reset)
	}
	if st := old.PeerProxy.Stats(); st.Refused+st.Reset == 0 {
		t.Error("fault proof: the partitioned member's peer proxy refused and reset nothing")
	}
}

// majorityLeader waits up to 10s until the members other than cut agree on
// a leader that is not cut.
func majorityLeader(t *testing.T, c *Cluster, cut *Member) *Member {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var lead uint64
		agree := true
		byID := map[uint64]*Member{}
		for _, m := range c.Members {
			if m == cut {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := m.status(ctx)
			cancel()
			if err != nil || st.Leader == 0 || (lead != 0 && st.Leader != lead) {
				agree = false
				break
			}
			lead = st.Leader
			byID[st.Header.GetMemberId()] = m
		}
		if m, ok := byID[lead]; agree && ok {
			return m
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the members other than %s elected no leader among themselves within 10s", cut.Name)
	return nil
}

// Scenario 2b. Retries of finished intents outlive a lost quorum. A
// replica completes more intents than its record cache (the smallest,
// 1 MiB) holds, so that most of their replays must read etcd; then two of
// the three members are killed. A replay of a final record is answered
// from whatever member is up (a serializable read: a final record's answer
// never changes, the argument that lets a replay come from memory), so
// every retry still gets its stored result, byte for byte, while a new
// registration, which needs the quorum, is refused UNAVAILABLE.
func TestReplaysOutliveQuorumLoss(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{Intentd: harness.IntentdConfig{Flags: []string{"--cache-bytes", "1048576"}}})
	addr := e.Intentds[0].Addr
	api := intentv1.NewIntentServiceClient(mustDial(t, addr))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := api.OpenSession(ctx, &intentv1.OpenSessionRequest{Worker: "replayer", Ttl: durationpb.New(5 * time.Minute)})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	const n = 1500
	note := strings.Repeat("the approved terms of this purchase, kept whole. ", 6)
	acquire := func(ctx context.Context, i int, requestID string) (*intentv1.AcquireResponse, error) {
		key := fmt.Sprintf("replay-quorum-%04d", i)
		params, err := structpb.NewStruct(map[string]any{"note": note, "order": float64(i)})
		if err != nil {
			t.Fatal(err)
		}
		return api.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: s.SessionId, RequestId: requestID,
			Register: &intentv1.RegisterRequest{Key: key, Params: params}})
	}
	replays := make([][]byte, n)
	var g errgroup.Group
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			a, err := acquire(ctx, i, "first")
			if err != nil || a.Outcome != intentv1.Outcome_OUTCOME_EXECUTE {
				return fmt.Errorf("Acquire %d = %v, %v; want EXECUTE", i, a.GetOutcome(), err)
			}
			if _, err := api.Complete(ctx, &intentv1.CompleteRequest{Key: a.Intent.Key, Token: a.Lease.Token,
				Result: &intentv1.Result{Payload: []byte(fmt.Sprintf(`{"order":"o-%d","note":%q}`, i, note))}}); err != nil {
				return fmt.Errorf("Complete %d: %v", i, err)
			}
			r, err := acquire(ctx, i, "replay")
			if err != nil || r.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
				return fmt.Errorf("replay %d = %v, %v; want COMPLETED", i, r.GetOutcome(), err)
			}
			replays[i] = wireBytes(t, r)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	old := leader(t, e.Cluster)
	victims := []*Member{old, e.Cluster.Followers(old)[0]}
	ev := e.Faults.Inject("quorum-loss", "etcd %s and %s, SIGKILL", victims[0].Name, victims[1].Name)
	for _, m := range victims {
		m.Kill()
	}
	defer func() {
		for _, m := range victims {
			restart(t, m)
		}
		e.Faults.Heal(ev)
		leader(t, e.Cluster)
	}()
	time.Sleep(3 * time.Second)
	if m, err := e.Cluster.Leader(context.Background()); err == nil {
		t.Fatalf("with 2 of 3 members down, %s still leads", m.Name)
	}

	fresh, cancelFresh := context.WithTimeout(ctx, 10*time.Second)
	_, err = acquire(fresh, n, "fresh")
	cancelFresh()
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a new registration without a quorum answered %v, want UNAVAILABLE", err)
	}
	start := time.Now()
	same, failed := 0, 0
	for i := 0; i < n && failed < 10; i++ {
		one, cancelOne := context.WithTimeout(ctx, 5*time.Second)
		r, err := acquire(one, i, "retry")
		cancelOne()
		switch {
		case err != nil:
			failed++
			t.Errorf("replay %d without a quorum: %v", i, err)
		case !bytes.Equal(wireBytes(t, r), replays[i]):
			t.Errorf("replay %d without a quorum answered %v, not its stored answer", i, r)
		default:
			same++
		}
	}
	t.Logf("without a quorum: %d of %d replays answered their stored answer in %v, %d failed", same, n, time.Since(start).Round(time.Millisecond), failed)
}
