package main

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// queueDepth is the review queue of both stores in the scale workload:
// the same in both, so that a page holds the same intents and only the
// number stored around them differs.
const queueDepth = 200

// pageSize is the review-queue page the scale workload reads (the API's
// largest).
const pageSize = 100

// scaleStores are the scale workload's two intentds, seeded, with their
// etcds when those run apart.
type scaleStores struct {
	small, large         *intentdServer
	etcds                [2]*etcdServer // nil: embedded in intentd
	seedSmall, seedLarge time.Duration
}

// close stops every server of the stores.
func (st *scaleStores) close() {
	for _, s := range []*intentdServer{st.small, st.large} {
		if s != nil {
			s.close()
		}
	}
	for _, e := range st.etcds {
		if e != nil {
			e.close()
		}
	}
}

// prepareScale starts the scale workload's two intentds, one to hold
// cfg.scaleSmall completed intents and one cfg.scaleLarge, and seeds them,
// each with the same review queue. It touches no other server, so it may
// run while the heartbeat workload, which keeps the main intentd all but
// idle, waits out its intervals.
func (b *bench) prepareScale(ctx context.Context) (_ *scaleStores, err error) {
	st := &scaleStores{}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	if b.cfg.scaleEtcdApart {
		for i, name := range []string{"etcd-small", "etcd-large"} {
			if st.etcds[i], err = startEtcd(ctx, b.dir, name); err != nil {
				return nil, err
			}
		}
	}
	if st.small, err = b.startIntentd(ctx, "intentd-small", st.etcds[0]); err != nil {
		return nil, err
	}
	if st.large, err = b.startIntentd(ctx, "intentd-large", st.etcds[1]); err != nil {
		return nil, err
	}
	if st.seedSmall, err = b.seed(ctx, st.small, b.cfg.scaleSmall); err != nil {
		return nil, fmt.Errorf("scale, seeding %d: %w", b.cfg.scaleSmall, err)
	}
	if st.seedLarge, err = b.seed(ctx, st.large, b.cfg.scaleLarge); err != nil {
		return nil, fmt.Errorf("scale, seeding %d: %w", b.cfg.scaleLarge, err)
	}
	return st, nil
}

// runScale compares the seeded stores in interleaved rounds: the p99 of
// Acquire (fresh intents, with register) and of reading the review queue's
// first page. Then it measures the bytes in use per retained intent of the
// small store after compaction and defragmentation, and prints both
// intentds' memory.
func (b *bench) runScale(ctx context.Context, st *scaleStores) error {
	small, large, stores := st.small, st.large, st.etcds
	seedSmall, seedLarge := st.seedSmall, st.seedLarge
	var err error
	servers := []*intentdServer{small, large}
	var ids [2][]string
	for i, s := range servers {
		if ids[i], err = b.sessions(ctx, s, b.cfg.scaleWorkers, cycleTTL); err != nil {
			return err
		}
	}
	var cycles [2]atomic.Int64
	acquire := func(i int) op {
		return func(ctx context.Context, w int) (time.Duration, error) {
			key := b.key("s")
			t := time.Now()
			token, err := b.acquireNew(ctx, servers[i], ids[i][w], key)
			lat := time.Since(t)
			if err != nil {
				return 0, err
			}
			cycles[i].Add(1)
			return lat, b.complete(ctx, servers[i], key, token)
		}
	}
	page := func(i int) op {
		return func(ctx context.Context, w int) (time.Duration, error) {
			resp, err := servers[i].rpc.List(ctx, &intentv1.ListRequest{
				States:   []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW},
				PageSize: pageSize,
			})
			if err == nil && len(resp.GetIntents()) != pageSize {
				err = fmt.Errorf("review queue page: %d intents, want %d", len(resp.GetIntents()), pageSize)
			}
			return 0, err
		}
	}
	acq, err := b.interleave(ctx, "scale Acquire", []peer{
		{fmt.Sprintf("%d stored", b.cfg.scaleSmall), small.proc, nil, acquire(0)},
		{fmt.Sprintf("%d stored", b.cfg.scaleLarge), large.proc, nil, acquire(1)},
	}, b.cfg.scaleWorkers)
	if err != nil {
		return err
	}
	pages, err := b.interleave(ctx, "scale review queue", []peer{
		{fmt.Sprintf("%d stored", b.cfg.scaleSmall), small.proc, nil, page(0)},
		{fmt.Sprintf("%d stored", b.cfg.scaleLarge), large.proc, nil, page(1)},
	}, 1)
	if err != nil {
		return err
	}
	p50, p99 := pctMs(0.5), pctMs(0.99)
	acqRatio, pageRatio := pairQuantileRatio(acq[1], acq[0], 0.99), pairQuantileRatio(pages[1], pages[0], 0.99)
	b.res["acquire_p99_1m_vs_1k"], b.res["queue_page_1m_vs_1k"] = acqRatio.med, pageRatio.med

	// Not the RESULT line's RSS: seeding's large transactions grew the
	// heap to hold them in etcd's raft log, and Go returns freed heap to
	// the system only slowly; the Go heap in use says what the stored
	// intents hold.
	largeMem, smallMem := large.proc.memory(), small.proc.memory()
	largeHeap, smallHeap := large.heap(), small.heap()
	var keys [2]int64
	for i, s := range servers {
		if keys[i], err = countKeys(ctx, s.etcd); err != nil {
			return fmt.Errorf("scale: %w", err)
		}
	}
	for _, s := range servers {
		if err := b.saveHeap(s); err != nil {
			return err
		}
	}
	// Bytes per intent from the small store: compacting and defragmenting
	// the large one would take longer than the rest of the workload, and
	// bbolt fills its pages alike at either size.
	intents := int64(b.cfg.scaleSmall) + queueDepth + cycles[0].Load()
	inUse, err := compactDefrag(ctx, small.etcd)
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	perIntent := float64(inUse) / float64(intents)
	b.res["bytes_per_intent"] = perIntent

	fmt.Fprintf(b.out, "scale: two intentds, one with %d and one with %d completed intents stored (seeded in %s and %s), each with a review queue of %d; Acquire of fresh intents at C=%d, review-queue page (%d) at C=1; %d rounds of %s, interleaved\n",
		b.cfg.scaleSmall, b.cfg.scaleLarge, seedSmall.Round(time.Millisecond), seedLarge.Round(time.Millisecond), queueDepth, b.cfg.scaleWorkers, pageSize, b.cfg.rounds, b.cfg.duration)
	rows := [][]string{{"scale", "Acquire p50 ms", "Acquire p99 ms", "queue page p50 ms", "queue page p99 ms"}}
	for i, n := range []int{b.cfg.scaleSmall, b.cfg.scaleLarge} {
		rows = append(rows, []string{fmt.Sprintf("%d stored", n), over(acq[i], p50).format(2), over(acq[i], p99).format(2), over(pages[i], p50).format(2), over(pages[i], p99).format(2)})
	}
	rows = append(rows, []string{"large ÷ small", "", acqRatio.format(2), "", pageRatio.format(2)})
	table(b.out, rows)
	mem := [][]string{
		{"store", "intents", "etcd keys", "db in use after compaction + defrag", "bytes per intent", "intentd RSS", "anonymous", "Go heap", "peak"},
		{fmt.Sprintf("small (%d seeded)", b.cfg.scaleSmall), num(float64(intents), 0), num(float64(keys[0]), 0), mib(inUse), num(perIntent, 0), mib(smallMem.rss), mib(smallMem.anon), mib(smallHeap), mib(smallMem.peak)},
		{fmt.Sprintf("large (%d seeded)", b.cfg.scaleLarge), num(float64(int64(b.cfg.scaleLarge)+queueDepth+cycles[1].Load()), 0), num(float64(keys[1]), 0), "", "", mib(largeMem.rss), mib(largeMem.anon), mib(largeHeap), mib(largeMem.peak)},
	}
	if b.cfg.scaleEtcdApart {
		mem[0][5] = "intentd RSS (its etcd apart)"
		for i, name := range []string{"small", "large"} {
			m := stores[i].proc.memory()
			mem = append(mem, []string{name + "'s etcd", "", "", "", "", mib(m.rss), mib(m.anon), "", mib(m.peak)})
		}
	}
	table(b.out, mem)
	return nil
}

// pairQuantileRatio is the median over rounds of a's q-quantile latency ÷
// b's in the same round.
func pairQuantileRatio(a, b []round, q float64) spread {
	xs := make([]float64, min(len(a), len(b)))
	for i := range xs {
		xs[i] = ratio(float64(a[i].pct(q)), float64(b[i].pct(q)))
	}
	return spreadOf(xs)
}

// seed stores n completed intents and the review queue in s, and returns
// how long it took. The queue and one completed intent, the template, go
// through the API; the other n-1 are copies of the template's etcd keys
// written straight into intentd's etcd in large transactions (a million
// intents through the API would take most of an hour on this kind of
// machine). A copy is the template with its intent key replaced by
// another of the same length, in the etcd keys and values alike, so it is
// byte for byte what intentd would have written for that key (save its
// revisions, and tokens shared with the template); seed checks that
// intentd answers a copy as the completed intent it is. In a final record
// stored compressed, the template's key (which its request ids hold) need
// not appear as such: a copy then keeps the template's request ids, in a
// value of the same size.
func (b *bench) seed(ctx context.Context, s *intentdServer, n int) (time.Duration, error) {
	start := time.Now()
	ids, err := b.sessions(ctx, s, 16, cycleTTL)
	if err != nil {
		return 0, err
	}
	defer b.closeSessions(s, ids)
	var next atomic.Int64
	var wg sync.WaitGroup
	var first firstError
	for w := range ids {
		wg.Go(func() {
			for next.Add(1) <= queueDepth && first.get() == nil {
				key := b.key("u")
				token, err := b.acquireNew(ctx, s, ids[w], key)
				if err == nil {
					_, err = s.rpc.MarkUnknown(ctx, &intentv1.MarkUnknownRequest{Key: key, Token: token, Reason: "seeded"})
				}
				if err != nil {
					first.set(err)
				}
			}
		})
	}
	wg.Wait()
	if err := first.get(); err != nil {
		return 0, err
	}
	name := func(i int) string { return fmt.Sprintf("seed-%s-%012d", b.run, i) }
	template := name(0)
	if err := b.cycle(ctx, s, ids[0], template); err != nil {
		return 0, err
	}
	b.progress("seeding %d intents", n)
	all, err := s.etcd.Get(ctx, "", clientv3.WithFromKey())
	if err != nil {
		return 0, err
	}
	var kvs [][2][]byte
	for _, kv := range all.Kvs {
		// Keys attached to a session's lease (held intents, sessions) are
		// not the template's: it is completed.
		if kv.Lease == 0 && (bytes.Contains(kv.Key, []byte(template)) || bytes.Contains(kv.Value, []byte(template))) {
			kvs = append(kvs, [2][]byte{kv.Key, kv.Value})
		}
	}
	if len(kvs) == 0 {
		return 0, fmt.Errorf("no etcd key of the template intent %s found", template)
	}
	perTxn := max(1, 128/len(kvs)) // etcd's default limit of operations per transaction
	var batch atomic.Int64
	for range 8 {
		wg.Go(func() {
			for first.get() == nil {
				from := 1 + int(batch.Add(1)-1)*perTxn
				if from >= n {
					return
				}
				var ops []clientv3.Op
				for i := from; i < min(from+perTxn, n); i++ {
					to := []byte(name(i))
					for _, kv := range kvs {
						ops = append(ops, clientv3.OpPut(
							string(bytes.ReplaceAll(kv[0], []byte(template), to)),
							string(bytes.ReplaceAll(kv[1], []byte(template), to))))
					}
				}
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				_, err := s.etcd.Txn(cctx).Then(ops...).Commit()
				cancel()
				if err != nil {
					first.set(err)
				}
			}
		})
	}
	wg.Wait()
	if err := first.get(); err != nil {
		return 0, fmt.Errorf("writing copies: %w", err)
	}
	// Push the seeding's large entries out of etcd's in-memory raft log:
	// intentd's embedded etcd keeps up to 200 applied entries (100 behind
	// a snapshot it takes every 100; etcd's default would keep 5,000), so
	// 300 tiny writes of one key of the benchmark's own, outside intentd's
	// prefix, leave it with entries the size that API writes make. A small
	// seeding leaves too little there to matter.
	if n > 10_000 {
		if err := flushRaftLog(ctx, s.etcd); err != nil {
			return 0, fmt.Errorf("flushing the raft log: %w", err)
		}
	}
	if n > 1 {
		copyKey := name(n / 2)
		resp, err := s.rpc.Acquire(ctx, b.acquireRequest(copyKey, ids[0], "v-"+copyKey))
		if err != nil {
			return 0, fmt.Errorf("acquire of the copy %s: %w", copyKey, err)
		}
		if resp.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED || resp.GetIntent().GetKey() != copyKey {
			return 0, fmt.Errorf("acquire of the copy %s: outcome %v, key %q: the store's records do not copy by key", copyKey, resp.GetOutcome(), resp.GetIntent().GetKey())
		}
	}
	return time.Since(start), nil
}

// flushRaftLog writes more than the raft entries intentd's embedded etcd
// keeps in memory, in tiny transactions.
func flushRaftLog(ctx context.Context, cli *clientv3.Client) error {
	const entries = 300
	var next atomic.Int64
	var first firstError
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for next.Add(1) <= entries && first.get() == nil {
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				_, err := cli.Put(cctx, "intentbench-flush", "x")
				cancel()
				if err != nil {
					first.set(err)
				}
			}
		})
	}
	wg.Wait()
	return first.get()
}

// compactDefrag compacts every revision but the last, defragments, and
// returns the bytes in use.
func compactDefrag(ctx context.Context, cli *clientv3.Client) (int64, error) {
	ep := cli.Endpoints()[0]
	st, err := cli.Status(ctx, ep)
	if err != nil {
		return 0, err
	}
	if _, err := cli.Compact(ctx, st.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return 0, fmt.Errorf("compact: %w", err)
	}
	if _, err := cli.Defragment(ctx, ep); err != nil {
		return 0, fmt.Errorf("defragment: %w", err)
	}
	if st, err = cli.Status(ctx, ep); err != nil {
		return 0, err
	}
	return st.DbSizeInUse, nil
}

func mib(b int64) string {
	if b <= 0 {
		return "n/a"
	}
	return num(float64(b)/(1<<20), 1) + " MiB"
}

// countKeys is how many keys an etcd holds (intentd's and any other, the
// benchmark's own flush key included): its in-memory index has an entry
// for each.
func countKeys(ctx context.Context, c *clientv3.Client) (int64, error) {
	resp, err := c.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("counting etcd keys: %w", err)
	}
	return resp.Count, nil
}
