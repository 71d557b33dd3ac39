package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// bench holds what every workload shares: the settings, the payloads, a
// key sequence unique to this run, and the figures of the RESULT line.
type bench struct {
	cfg      config
	out      io.Writer
	progress func(format string, args ...any)
	dir      string
	run      string // in every key, so that runs against one intentd never collide
	seq      atomic.Int64
	params   *structpb.Struct
	result   []byte
	rawValue []byte
	res      results
	// whileHeartbeat, if set, is called once, on the workload's goroutine,
	// when the heartbeat workload starts its measured wait (run starts
	// seeding the scale stores then).
	whileHeartbeat func()
}

func newBench(cfg config, out io.Writer, progress func(string, ...any), dir string) (*bench, error) {
	// Params whose canonical JSON, {"note":"…"}, is cfg.payload bytes;
	// a result payload of the same size; the raw peer writes as many.
	text, other := payloadText(cfg.payloadText, cfg.payload, 1), payloadText(cfg.payloadText, cfg.payload, 2)
	params, err := structpb.NewStruct(map[string]any{"note": text[:cfg.payload-len(`{"note":""}`)]})
	if err != nil {
		return nil, err
	}
	return &bench{
		cfg: cfg, out: out, progress: progress, dir: dir,
		run:      fmt.Sprintf("%x", time.Now().UnixNano()),
		params:   params,
		result:   []byte(`{"r":"` + other[:cfg.payload-len(`{"r":""}`)] + `"}`),
		rawValue: []byte(text),
		res:      results{},
	}, nil
}

// payloadText is n bytes of payload text of the kind --payload-text names:
// letters and digits drawn from the given seed (random), which intentd's
// compression of final records can hardly shrink (about 6 bits a byte),
// or one letter over and over (repeat), which it shrinks to almost
// nothing. The params and the result are drawn from seeds of their own,
// so that neither compresses into a reference to the other; every intent
// of a run carries the same two, as a copy of the seeded template does.
func payloadText(kind string, n int, seed uint64) string {
	if kind == "repeat" {
		return strings.Repeat("x", n)
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	r := rand.New(rand.NewPCG(seed, 1024))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func (b *bench) key(kind string) string { return fmt.Sprintf("%s-%s-%d", kind, b.run, b.seq.Add(1)) }

// acquireRequest is a worker's Acquire of key under session that
// registers the intent in the same call (a worker's first call, and every
// retry of it).
func (b *bench) acquireRequest(key, session, requestID string) *intentv1.AcquireRequest {
	return &intentv1.AcquireRequest{
		Key: key, SessionId: session, RequestId: requestID,
		Register: &intentv1.RegisterRequest{Key: key, Params: b.params, RequestId: "r-" + key},
	}
}

// acquireNew acquires a fresh intent and returns its token.
func (b *bench) acquireNew(ctx context.Context, s *intentdServer, session, key string) (uint64, error) {
	resp, err := s.rpc.Acquire(ctx, b.acquireRequest(key, session, "a-"+key))
	if err != nil {
		return 0, fmt.Errorf("acquire %s: %w", key, err)
	}
	if resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
		return 0, fmt.Errorf("acquire %s: outcome %v, want EXECUTE", key, resp.GetOutcome())
	}
	return resp.GetLease().GetToken(), nil
}

func (b *bench) complete(ctx context.Context, s *intentdServer, key string, token uint64) error {
	_, err := s.rpc.Complete(ctx, &intentv1.CompleteRequest{Key: key, Token: token, Result: &intentv1.Result{Payload: b.result}})
	if err != nil {
		return fmt.Errorf("complete %s: %w", key, err)
	}
	return nil
}

// cycle is one intent's happy path: Acquire with register (EXECUTE), then
// Complete.
func (b *bench) cycle(ctx context.Context, s *intentdServer, session, key string) error {
	token, err := b.acquireNew(ctx, s, session, key)
	if err != nil {
		return err
	}
	return b.complete(ctx, s, key, token)
}

// sessions opens n sessions with the given TTL and no heartbeats of
// their own: the workloads that hold no lease longer than one call need
// none within the TTL, and the heartbeat workload sends its own.
func (b *bench) sessions(ctx context.Context, s *intentdServer, n int, ttl time.Duration) ([]string, error) {
	ids := make([]string, n)
	for i := range ids {
		resp, err := s.rpc.OpenSession(ctx, &intentv1.OpenSessionRequest{Worker: fmt.Sprintf("bench-%d", i), Ttl: durationpb.New(ttl)})
		if err != nil {
			return nil, fmt.Errorf("open session: %w", err)
		}
		ids[i] = resp.GetSessionId()
	}
	return ids, nil
}

// closeSessions ends sessions opened by sessions, best effort.
func (b *bench) closeSessions(s *intentdServer, ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range ids {
		_, _ = s.rpc.CloseSession(ctx, &intentv1.CloseSessionRequest{SessionId: id})
	}
}

// cycleTTL is the sessions' TTL in the cycle, replay and contention
// workloads: longer than any of them runs, so no heartbeat is needed.
const cycleTTL = 300 * time.Second

// runCycle compares intentd's cycle with two raw CAS transactions at each
// level of concurrency.
func (b *bench) runCycle(ctx context.Context, in *intentdServer, raw *etcdServer) error {
	ids, err := b.sessions(ctx, in, slices.Max(b.cfg.levels), cycleTTL)
	if err != nil {
		return err
	}
	defer b.closeSessions(in, ids)
	intentdOp := func(ctx context.Context, w int) (time.Duration, error) {
		return 0, b.cycle(ctx, in, ids[w], b.key("c"))
	}
	rawOp := func(ctx context.Context, w int) (time.Duration, error) {
		return 0, b.rawCycle(ctx, raw.etcd, "raw/"+b.key("c"))
	}
	peers := []peer{{"intentd", in.proc, in.etcd, intentdOp}, {"raw etcd", raw.proc, raw.etcd, rawOp}}
	rows := [][]string{{"cycle", "intentd /s", "raw etcd /s", "intentd ÷ raw", "intentd p50 / p99 ms", "raw p50 / p99 ms", "intentd CPU µs/cycle", "raw CPU µs/cycle", "intentd revisions/cycle"}}
	for _, c := range b.cfg.levels {
		rs, err := b.interleave(ctx, "cycle", peers, c)
		if err != nil {
			return err
		}
		ir, rr := rs[0], rs[1]
		r := pairRatio(ir, rr)
		rows = append(rows, []string{
			fmt.Sprintf("C=%d", c),
			over(ir, round.rate).format(0), over(rr, round.rate).format(0), r.format(2),
			latencies(ir), latencies(rr),
			over(ir, round.cpuPerOp).format(0), over(rr, round.cpuPerOp).format(0),
			over(ir, round.revsPerOp).format(2),
		})
		if c == b.cfg.levels[0] {
			// The lowest level, where no two transitions could share an
			// etcd transaction: what one intent writes on its own.
			b.res["writes_per_intent"] = over(ir, round.revsPerOp).med
		}
		if c == 1 {
			b.res["cycle_ratio_c1"] = r.med
		}
		b.res["cycle_ratio"] = r.med // the last level is the highest
	}
	fmt.Fprintf(b.out, "cycle: fresh intent, Acquire with register (EXECUTE) + Complete, vs two raw CAS transactions (create-if-absent, update-if-revision), %d B payloads; %d rounds of %s each, interleaved; median (min–max)\n", b.cfg.payload, b.cfg.rounds, b.cfg.duration)
	table(b.out, rows)
	return nil
}

// rawCycle is the raw peer's cycle: create the record if absent, then
// update it if it is still the version created, as intentd's Acquire and
// Complete do.
func (b *bench) rawCycle(ctx context.Context, cli *clientv3.Client, key string) error {
	created, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(b.rawValue))).Commit()
	if err != nil {
		return err
	}
	if !created.Succeeded {
		return fmt.Errorf("raw create %s: exists", key)
	}
	updated, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", created.Header.Revision)).
		Then(clientv3.OpPut(key, string(b.rawValue))).Commit()
	if err != nil {
		return err
	}
	if !updated.Succeeded {
		return fmt.Errorf("raw update %s: changed", key)
	}
	return nil
}

func latencies(rs []round) string {
	return num(over(rs, pctMs(0.5)).med, 2) + " / " + num(over(rs, pctMs(0.99)).med, 2)
}

// runReplay compares intentd's answer for a COMPLETED intent with a raw
// linearizable Get of the same record and with a gRPC health check.
func (b *bench) runReplay(ctx context.Context, in *intentdServer, raw *etcdServer, echo *grpcChild) error {
	n := slices.Max(b.cfg.replayLevels)
	ids, err := b.sessions(ctx, in, n, cycleTTL)
	if err != nil {
		return err
	}
	defer b.closeSessions(in, ids)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = b.key("p")
		if err := b.cycle(ctx, in, ids[i], keys[i]); err != nil {
			return err
		}
	}
	rawKeys, recordSize, err := b.copyRecords(ctx, in, raw, keys)
	if err != nil {
		return err
	}
	var calls atomic.Int64
	intentdOp := func(ctx context.Context, w int) (time.Duration, error) {
		i := calls.Add(1)
		_, err := b.replayOnce(ctx, in.rpc.Acquire, keys[int(i)%n], ids[w], fmt.Sprintf("p-%s-%d", b.run, i))
		return 0, err
	}
	getOp := func(ctx context.Context, w int) (time.Duration, error) {
		key := rawKeys[int(calls.Add(1))%n]
		resp, err := raw.etcd.Get(ctx, key)
		if err == nil && len(resp.Kvs) != 1 {
			err = fmt.Errorf("get %s: %d keys", key, len(resp.Kvs))
		}
		return 0, err
	}
	hc := healthpb.NewHealthClient(echo.conn)
	echoOp := func(ctx context.Context, w int) (time.Duration, error) {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return 0, err
	}
	peers := []peer{{"intentd replay", in.proc, nil, intentdOp}, {"raw get", raw.proc, nil, getOp}, {"echo", echo.proc, nil, echoOp}}
	rows := [][]string{{"replay", "intentd /s", "raw get /s", "echo /s", "intentd ÷ get", "intentd ÷ echo", "intentd p50 / p99 ms", "get p50 / p99 ms", "intentd CPU µs/call", "get CPU µs/call", "echo CPU µs/call"}}
	for _, c := range b.cfg.replayLevels {
		rs, err := b.interleave(ctx, "replay", peers, c)
		if err != nil {
			return err
		}
		vsGet, vsEcho := pairRatio(rs[0], rs[1]), pairRatio(rs[0], rs[2])
		rows = append(rows, []string{
			fmt.Sprintf("C=%d", c),
			over(rs[0], round.rate).format(0), over(rs[1], round.rate).format(0), over(rs[2], round.rate).format(0),
			vsGet.format(2), vsEcho.format(2),
			latencies(rs[0]), latencies(rs[1]),
			over(rs[0], round.cpuPerOp).format(0), over(rs[1], round.cpuPerOp).format(0), over(rs[2], round.cpuPerOp).format(0),
		})
		b.res["replay_ratio"], b.res["replay_vs_echo"] = vsGet.med, vsEcho.med
	}
	fmt.Fprintf(b.out, "replay: Acquire (with register) of one of %d COMPLETED intents, vs a raw linearizable Get of the same record (%d B) and a gRPC health check on loopback; %d rounds of %s, interleaved\n", n, recordSize, b.cfg.rounds, b.cfg.duration)
	table(b.out, rows)
	return nil
}

// copyRecords copies the etcd record of each intent key into the raw
// etcd and returns the raw keys. A record is found without knowing the
// store's layout: the largest value among the keys that end in the
// intent's key (its index keys end so too, smaller).
func (b *bench) copyRecords(ctx context.Context, in *intentdServer, raw *etcdServer, keys []string) (rawKeys []string, size int, err error) {
	if in.etcd == nil {
		return nil, 0, fmt.Errorf("replay needs intentd's etcd (--intentd-etcd) to copy its records")
	}
	all, err := in.etcd.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, 0, err
	}
	want := map[string]int{}
	for i, k := range keys {
		want["/"+k] = i
	}
	best := make([][]byte, len(keys))
	for _, kv := range all.Kvs {
		j := bytes.LastIndexByte(kv.Key, '/')
		i, ok := want[string(kv.Key[max(j, 0):])]
		if !ok {
			continue
		}
		v, err := in.etcd.Get(ctx, string(kv.Key))
		if err != nil {
			return nil, 0, err
		}
		if len(v.Kvs) == 1 && len(v.Kvs[0].Value) > len(best[i]) {
			best[i] = v.Kvs[0].Value
		}
	}
	rawKeys = make([]string, len(keys))
	for i, v := range best {
		if v == nil {
			return nil, 0, fmt.Errorf("no etcd record found for intent %s", keys[i])
		}
		rawKeys[i] = "rec/" + keys[i]
		if _, err := raw.etcd.Put(ctx, rawKeys[i], string(v)); err != nil {
			return nil, 0, err
		}
	}
	return rawKeys, len(best[0]), nil
}

// runContention runs many workers on few intents: each worker acquires
// its slot's current intent; the one that gets EXECUTE completes it and
// moves the slot on, the others see IN_PROGRESS (and retry) or COMPLETED
// (and move on). Every intent must be executed exactly once.
func (b *bench) runContention(ctx context.Context, in *intentdServer) error {
	workers, slots := b.cfg.contentionWorkers, b.cfg.contentionIntents
	ids, err := b.sessions(ctx, in, workers, cycleTTL)
	if err != nil {
		return err
	}
	defer b.closeSessions(in, ids)
	gen := make([]atomic.Int64, slots)
	var executed sync.Map // key → *atomic.Int64
	var completed, busy, replayed atomic.Int64
	f := func(ctx context.Context, w int) (time.Duration, error) {
		s := w % slots
		g := gen[s].Load()
		key := fmt.Sprintf("k-%s-%d-%d", b.run, s, g)
		resp, err := in.rpc.Acquire(ctx, b.acquireRequest(key, ids[w], fmt.Sprintf("q-%s-%d", b.run, b.seq.Add(1))))
		if err != nil {
			return 0, fmt.Errorf("acquire %s: %w", key, err)
		}
		switch resp.GetOutcome() {
		case intentv1.Outcome_OUTCOME_EXECUTE:
			n, _ := executed.LoadOrStore(key, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			if err := b.complete(ctx, in, key, resp.GetLease().GetToken()); err != nil {
				return 0, err
			}
			completed.Add(1)
			gen[s].CompareAndSwap(g, g+1)
		case intentv1.Outcome_OUTCOME_COMPLETED:
			replayed.Add(1)
			gen[s].CompareAndSwap(g, g+1)
		case intentv1.Outcome_OUTCOME_IN_PROGRESS:
			busy.Add(1)
		default:
			return 0, fmt.Errorf("acquire %s: outcome %v", key, resp.GetOutcome())
		}
		return 0, nil
	}
	var rounds []round
	var done []float64
	for r := range b.cfg.rounds {
		b.progress("contention round %d/%d", r+1, b.cfg.rounds)
		c0, cpu0 := completed.Load(), in.proc.cpu()
		rd, err := load(ctx, workers, b.cfg.duration, f)
		if err != nil {
			return fmt.Errorf("contention: %w", err)
		}
		rd.cpu = in.proc.cpuSince(cpu0)
		rounds = append(rounds, rd)
		done = append(done, float64(completed.Load()-c0)/rd.elapsed.Seconds())
	}
	twice := 0
	executed.Range(func(_, v any) bool {
		if v.(*atomic.Int64).Load() > 1 {
			twice++
		}
		return true
	})
	if twice > 0 {
		return fmt.Errorf("contention: %d intents got EXECUTE more than once", twice)
	}
	fmt.Fprintf(b.out, "contention: %d workers on %d intents at a time; %d rounds of %s\n", workers, slots, b.cfg.rounds, b.cfg.duration)
	table(b.out, [][]string{
		{"contention", "intents completed /s", "Acquire calls /s", "p50 / p99 ms", "intentd CPU µs/call", "EXECUTE", "IN_PROGRESS", "COMPLETED (replayed)", "executed twice"},
		{fmt.Sprintf("%d on %d", workers, slots), spreadOf(done).format(0), over(rounds, round.rate).format(0), latencies(rounds),
			over(rounds, round.cpuPerOp).format(0), num(float64(completed.Load()), 0), num(float64(busy.Load()), 0), num(float64(replayed.Load()), 0), "0"},
	})
	return nil
}

// runHeartbeat holds many intents with few workers, each heartbeating its
// session every TTL/3 and naming the leases it holds, as the client
// library does, and counts the etcd writes that keeping them alive
// causes.
func (b *bench) runHeartbeat(ctx context.Context, in *intentdServer) error {
	workers, intents, ttl := b.cfg.hbWorkers, b.cfg.hbIntents, b.cfg.hbTTL
	every := ttl / 3
	ids, err := b.sessions(ctx, in, workers, ttl)
	if err != nil {
		return err
	}
	defer b.closeSessions(in, ids)
	held := make([][]*intentv1.HeldLease, workers)
	var wg sync.WaitGroup
	var first firstError
	b.progress("heartbeat: acquiring %d intents with %d workers", intents, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < intents; i += workers {
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				key := b.key("h")
				token, err := b.acquireNew(cctx, in, ids[w], key)
				cancel()
				if err != nil {
					first.set(err)
					return
				}
				held[w] = append(held[w], &intentv1.HeldLease{Key: key, Token: token})
			}
		})
	}
	wg.Wait()
	if err := first.get(); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	// intentd's CPU when no call arrives (etcd's ticks, the janitor, the
	// garbage collector finishing the acquisitions' work), so that the
	// figure per heartbeat is what the heartbeats cost, not the background
	// spread over a few calls a second.
	idle := in.proc.idleCPU(ctx, idleWindow)
	rev0, raft0 := etcdStatus(ctx, in.etcd)
	cpu0 := in.proc.cpu()
	start := time.Now()
	end := start.Add(b.cfg.hbDuration)
	var beats atomic.Int64
	b.progress("heartbeat: %d workers heartbeating every %s for %s", workers, every, b.cfg.hbDuration)
	if start := b.whileHeartbeat; start != nil {
		b.whileHeartbeat = nil // once
		start()
	}
	for w := range workers {
		wg.Go(func() { // returns at the end of the measurement or on an error
			stop := time.NewTimer(time.Until(end))
			defer stop.Stop()
			// Workers start spread over one interval, as real ones do.
			select {
			case <-ctx.Done():
				return
			case <-stop.C:
				return
			case <-time.After(time.Duration(w) * every / time.Duration(workers)):
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				_, err := in.rpc.Heartbeat(cctx, &intentv1.HeartbeatRequest{SessionId: ids[w], Leases: held[w]})
				cancel()
				if err != nil {
					first.set(fmt.Errorf("heartbeat: %w", err))
					return
				}
				beats.Add(1)
				select {
				case <-ctx.Done():
					return
				case <-stop.C:
					return
				case <-tick.C:
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := first.get(); err != nil {
		return err
	}
	rev1, raft1 := etcdStatus(ctx, in.etcd)
	cpu := in.proc.cpuSince(cpu0)
	writes, entries := math.NaN(), math.NaN()
	if rev0 >= 0 && rev1 >= 0 {
		writes = float64(rev1-rev0) / elapsed.Seconds()
		entries = float64(raft1-raft0) / elapsed.Seconds()
	}
	b.res["heartbeat_writes_per_s"] = writes
	cpuPerBeat, idlePerS := math.NaN(), math.NaN()
	if cpu >= 0 && idle >= 0 && beats.Load() > 0 {
		idlePerS = idle.Seconds() / idleWindow.Seconds()
		above := cpu.Seconds() - idlePerS*elapsed.Seconds()
		cpuPerBeat = max(0, above) * 1e6 / float64(beats.Load())
	}
	fmt.Fprintf(b.out, "heartbeat: %d intents held by %d workers (sessions of TTL %s, a heartbeat every %s naming the worker's leases) for %s\n", intents, workers, ttl, every, elapsed.Round(time.Millisecond))
	table(b.out, [][]string{
		{"heartbeat", "heartbeats", "etcd revisions /s", "raft entries /s", "bound (workers ÷ interval) /s", "intentd CPU µs/heartbeat, above idle", "intentd idle CPU ms/s"},
		{fmt.Sprintf("%d on %d", intents, workers), num(float64(beats.Load()), 0), num(writes, 2), num(entries, 2),
			num(float64(workers)/every.Seconds(), 2), num(cpuPerBeat, 0), num(idlePerS*1e3, 1)},
	})
	// Finish what was held, so that no lapse is left to the janitor while
	// the next workload runs.
	for w := range workers {
		wg.Go(func() {
			for _, h := range held[w] {
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				err := b.complete(cctx, in, h.GetKey(), h.GetToken())
				cancel()
				if err != nil {
					first.set(fmt.Errorf("heartbeat: %w", err))
					return
				}
			}
		})
	}
	wg.Wait()
	return first.get()
}

// etcdStatus is etcd's revision (one per transaction that writes) and
// raft index (one per proposal, lease grants and revocations among them;
// lease renewals are not proposals); -1 when unknown.
func etcdStatus(ctx context.Context, cli *clientv3.Client) (rev, raft int64) {
	if cli == nil {
		return -1, -1
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := cli.Status(cctx, cli.Endpoints()[0])
	if err != nil {
		return -1, -1
	}
	return st.Header.Revision, int64(st.RaftIndex)
}

// firstError keeps the first error of several goroutines.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
