package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// The replay workload's realistic part: many distinct finished intents
// retried round-robin, as a fleet retries what it finished recently, and
// the same retries against an intentd whose cache holds almost none of
// them, so that every replay reads etcd (the miss path on its own).

// missCacheBytes is the --cache-bytes of the intentd that measures the
// miss path: intentd's smallest, which holds a few hundred final records
// of the benchmark's size, far fewer than --replay-keys.
const missCacheBytes = 1 << 20

// replaySetup is the key set of the many-keys replays: the intents on
// intentd, the copies of their records on the raw etcd, and the record's
// size.
type replaySetup struct {
	keys, rawKeys []string
	recordSize    int
}

// runReplayKeys compares intentd's replays of cfg.replayKeys distinct
// COMPLETED intents, retried round-robin, with raw linearizable Gets of
// their records, at each --replay-levels; then the same against an
// intentd started with the smallest cache (runReplayMiss).
func (b *bench) runReplayKeys(ctx context.Context, in *intentdServer, raw *etcdServer) error {
	n := b.cfg.replayKeys
	conc := slices.Max(b.cfg.replayLevels)
	ids, err := b.sessions(ctx, in, conc, cycleTTL)
	if err != nil {
		return err
	}
	defer b.closeSessions(in, ids)
	b.progress("replay, %d keys: completing %d intents", n, n)
	keys, err := b.completeMany(ctx, in, ids, "m", n)
	if err != nil {
		return fmt.Errorf("replay, %d keys: %w", n, err)
	}
	if in.etcd == nil {
		return fmt.Errorf("replay needs intentd's etcd (--intentd-etcd) to copy its records")
	}
	rawKeys, size, err := copyRecordsBulk(ctx, in.etcd, raw.etcd, keys, "rec-many/")
	if err != nil {
		return fmt.Errorf("replay, %d keys: copying the records: %w", n, err)
	}
	setup := replaySetup{keys: keys, rawKeys: rawKeys, recordSize: size}
	rows, err := b.replayRounds(ctx, "replay, "+strconv.Itoa(n)+" keys", in, ids, raw, nil, setup, b.cfg.replayLevels, "replay_ratio_10k")
	if err != nil {
		return err
	}
	u := in.cache()
	perEntry := math.NaN()
	if u.records > 0 {
		perEntry = u.recordBytes / u.records
	}
	m := in.proc.memory()
	fmt.Fprintf(b.out, "replay, many keys: Acquire (with register) of %d distinct COMPLETED intents retried round-robin, vs a raw linearizable Get of a copy of the same record (%d B), round-robin over as many keys; %d rounds of %s, interleaved; intentd's default --cache-bytes\n", n, size, b.cfg.rounds, b.cfg.duration)
	table(b.out, rows)
	fmt.Fprintf(b.out, "intentd's record cache after it: %s records, %s estimated, %s B per record; intentd RSS %s (anonymous %s), Go heap in use %s\n\n",
		num(u.records, 0), mib(int64(u.recordBytes)), num(perEntry, 0), mib(m.rss), mib(m.anon), mib(in.heap()))
	return b.runReplayMiss(ctx, raw, setup)
}

// runReplayMiss starts an intentd with the smallest cache, completes as
// many intents on it as runReplayKeys did, and compares their replays,
// round-robin, with the same raw Gets: every replay must read etcd. The
// same retries sent to a front (front.go) are measured beside them: the
// floor of any service that answers a replay out of etcd.
func (b *bench) runReplayMiss(ctx context.Context, raw *etcdServer, many replaySetup) error {
	n := len(many.keys)
	b.progress("replay, miss: starting an intentd with --cache-bytes %d", missCacheBytes)
	in, err := b.startIntentdBin(ctx, "intentd-miss", "", nil, "--cache-bytes", strconv.Itoa(missCacheBytes))
	if err != nil {
		return err
	}
	defer in.close()
	conc := slices.Max(b.cfg.replayLevels)
	ids, err := b.sessions(ctx, in, conc, cycleTTL)
	if err != nil {
		return err
	}
	defer b.closeSessions(in, ids)
	b.progress("replay, miss: completing %d intents", n)
	keys, err := b.completeMany(ctx, in, ids, "x", n)
	if err != nil {
		return fmt.Errorf("replay, miss: %w", err)
	}
	b.progress("replay, miss: starting the front, and storing intentd's answers in its etcd")
	front, err := startFront(ctx, b.dir)
	if err != nil {
		return err
	}
	defer front.close()
	answers, err := b.answers(ctx, in, ids, keys)
	if err != nil {
		return fmt.Errorf("replay, miss: %w", err)
	}
	if err := front.store(ctx, keys, answers); err != nil {
		return fmt.Errorf("replay, miss: storing the answers in the front's etcd: %w", err)
	}
	setup := replaySetup{keys: keys, rawKeys: many.rawKeys, recordSize: many.recordSize}
	rows, err := b.replayRounds(ctx, "replay, miss", in, ids, raw, front, setup, b.cfg.replayLevels, "replay_miss_ratio")
	if err != nil {
		return err
	}
	fmt.Fprintf(b.out, "replay, miss: the same retries of %d distinct COMPLETED intents against an intentd of its own started with --cache-bytes %d (its smallest: a few hundred such records), so that a replay reads etcd; vs the same raw Gets, and the same retries sent to a front that answers each with intentd's answer (%d B), stored whole in an etcd embedded in its process and read as intentd's miss reads, and does nothing else (the floor of any service that answers a replay from etcd; its CPU includes its etcd's, as intentd's does); %d rounds of %s, interleaved\n", n, missCacheBytes, len(answers[0]), b.cfg.rounds, b.cfg.duration)
	table(b.out, rows)
	return nil
}

// replayRounds runs intentd's round-robin replays of setup.keys against
// raw Gets of setup.rawKeys at each level, and, given a front, the same
// retries sent to it (only the miss path is measured against one); it
// returns the table's rows. figure, in the RESULT line, is intentd ÷ get
// at the highest level.
func (b *bench) replayRounds(ctx context.Context, what string, in *intentdServer, ids []string, raw *etcdServer, front *frontServer, setup replaySetup, levels []int, figure string) ([][]string, error) {
	n := len(setup.keys)
	var next, calls atomic.Int64
	intentdOp := func(ctx context.Context, w int) (time.Duration, error) {
		i := next.Add(1)
		if _, err := b.replayOnce(ctx, in.rpc.Acquire, setup.keys[int(i)%n], ids[w], fmt.Sprintf("p-%s-%d", b.run, i)); err != nil {
			return 0, err
		}
		calls.Add(1)
		return 0, nil
	}
	var rawNext atomic.Int64
	getOp := func(ctx context.Context, w int) (time.Duration, error) {
		key := setup.rawKeys[int(rawNext.Add(1))%len(setup.rawKeys)]
		resp, err := raw.etcd.Get(ctx, key)
		if err == nil && len(resp.Kvs) != 1 {
			err = fmt.Errorf("get %s: %d keys", key, len(resp.Kvs))
		}
		return 0, err
	}
	peers := []peer{{"intentd replay", in.proc, nil, intentdOp}, {"raw get", raw.proc, nil, getOp}}
	header := []string{what, "intentd /s", "raw get /s", "intentd ÷ get", "from memory", "intentd p50 / p99 ms", "get p50 / p99 ms", "intentd CPU µs/call", "get CPU µs/call"}
	if front != nil {
		var frontNext atomic.Int64
		frontOp := func(ctx context.Context, w int) (time.Duration, error) {
			i := frontNext.Add(1)
			if _, err := b.replayOnce(ctx, front.acquire, setup.keys[int(i)%n], ids[w], fmt.Sprintf("f-%s-%d", b.run, i)); err != nil {
				return 0, fmt.Errorf("front: %w", err)
			}
			return 0, nil
		}
		peers = append(peers, peer{"front replay", front.proc, nil, frontOp})
		header = append(header, "front /s", "front ÷ get", "intentd ÷ front", "front p50 / p99 ms", "front CPU µs/call")
	}
	rows := [][]string{header}
	for _, c := range levels {
		replays0, calls0 := in.metric("intentd_store_replays_from_memory_total"), calls.Load()
		rs, err := b.interleave(ctx, what, peers, c)
		if err != nil {
			return nil, err
		}
		// The share of intentd's replays (warm-up included) answered from
		// memory, by its own count.
		share := math.NaN()
		if in.metrics != "" {
			if d := calls.Load() - calls0; d > 0 {
				share = (in.metric("intentd_store_replays_from_memory_total") - replays0) / float64(d)
			}
		}
		r := pairRatio(rs[0], rs[1])
		row := []string{
			fmt.Sprintf("C=%d", c),
			over(rs[0], round.rate).format(0), over(rs[1], round.rate).format(0), r.format(2),
			percent(share), latencies(rs[0]), latencies(rs[1]),
			over(rs[0], round.cpuPerOp).format(0), over(rs[1], round.cpuPerOp).format(0),
		}
		b.res[figure] = r.med // the last level is the highest
		if front != nil {
			// The front's rounds run right after the raw Get's.
			floor, vsFront := pairRatio(rs[2], rs[1]), pairRatio(rs[0], rs[2])
			row = append(row, over(rs[2], round.rate).format(0), floor.format(2), vsFront.format(2),
				latencies(rs[2]), over(rs[2], round.cpuPerOp).format(0))
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// percent prints a share as a whole percentage.
func percent(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return num(100*x, 0) + " %"
}

// acquireFunc sends an Acquire: intentd's generated client, or the
// front's.
type acquireFunc func(context.Context, *intentv1.AcquireRequest, ...grpc.CallOption) (*intentv1.AcquireResponse, error)

// replayOnce sends key's Acquire again, as a retrying worker does, and
// returns the answer, which must be COMPLETED.
func (b *bench) replayOnce(ctx context.Context, acquire acquireFunc, key, session, requestID string) (*intentv1.AcquireResponse, error) {
	resp, err := acquire(ctx, b.acquireRequest(key, session, requestID))
	if err != nil {
		return nil, fmt.Errorf("acquire %s: %w", key, err)
	}
	if resp.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
		return nil, fmt.Errorf("acquire %s: outcome %v, want COMPLETED", key, resp.GetOutcome())
	}
	return resp, nil
}

// answers replays each of keys once on in, with len(ids) workers, and
// returns intentd's answers, encoded, in the keys' order: what the front
// answers.
func (b *bench) answers(ctx context.Context, in *intentdServer, ids []string, keys []string) ([][]byte, error) {
	out := make([][]byte, len(keys))
	err := eachIndex(ids, len(keys), func(session string, i int) error {
		cctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		resp, err := b.replayOnce(cctx, in.rpc.Acquire, keys[i], session, "s-"+keys[i])
		if err == nil {
			out[i], err = proto.Marshal(resp)
		}
		return err
	})
	return out, err
}

// completeMany completes n fresh intents (Acquire with register, then
// Complete) with len(ids) workers, one session each, and returns their
// keys, prefixed kind.
func (b *bench) completeMany(ctx context.Context, in *intentdServer, ids []string, kind string, n int) ([]string, error) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = b.key(kind)
	}
	err := eachIndex(ids, n, func(session string, i int) error {
		cctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		return b.cycle(cctx, in, session, keys[i])
	})
	return keys, err
}

// eachIndex calls do for each index below n from len(ids) workers, each
// with its session, until every index is done or one call fails; it
// returns the first failure.
func eachIndex(ids []string, n int, do func(session string, i int) error) error {
	var next atomic.Int64
	var first firstError
	var wg sync.WaitGroup
	for _, session := range ids {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n && first.get() == nil; i = int(next.Add(1)) - 1 {
				if err := do(session, i); err != nil {
					first.set(err)
				}
			}
		})
	}
	wg.Wait()
	return first.get()
}

// putBatched writes values[i] under keys[i] into cli, 128 puts to a
// transaction.
func putBatched(ctx context.Context, cli *clientv3.Client, keys []string, values [][]byte) error {
	const batch = 128
	for from := 0; from < len(keys); from += batch {
		to := min(from+batch, len(keys))
		ops := make([]clientv3.Op, 0, to-from)
		for i := from; i < to; i++ {
			ops = append(ops, clientv3.OpPut(keys[i], string(values[i])))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return err
		}
	}
	return nil
}

// copyRecordsBulk copies the etcd record of each intent key from src into
// dst under prefix and returns the keys written there, and the size of
// the first record. A record is found without knowing the store's
// layout, as copyRecords finds it, reading src's whole key space in pages.
func copyRecordsBulk(ctx context.Context, src, dst *clientv3.Client, keys []string, prefix string) (rawKeys []string, size int, err error) {
	want := make(map[string]int, len(keys))
	for i, k := range keys {
		want["/"+k] = i
	}
	best := make([][]byte, len(keys))
	const page = 500
	from := "\x00"
	for {
		resp, err := src.Get(ctx, from, clientv3.WithRange("\xff"), clientv3.WithLimit(page), clientv3.WithSerializable())
		if err != nil {
			return nil, 0, err
		}
		for _, kv := range resp.Kvs {
			j := bytes.LastIndexByte(kv.Key, '/')
			if i, ok := want[string(kv.Key[max(j, 0):])]; ok && len(kv.Value) > len(best[i]) {
				best[i] = kv.Value
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	rawKeys = make([]string, len(keys))
	for i, v := range best {
		if v == nil {
			return nil, 0, fmt.Errorf("no etcd record found for intent %s", keys[i])
		}
		rawKeys[i] = prefix + keys[i]
	}
	if err := putBatched(ctx, dst, rawKeys, best); err != nil {
		return nil, 0, err
	}
	return rawKeys, len(best[0]), nil
}
