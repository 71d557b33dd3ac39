package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/etcdstore/tombstones"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/daemon"
)

// The tombstones workload: what a late retry of a removed intent costs, and
// what tombstones cost intentd's memory, with --tombstones of them stored.
// For each intentd measured (this version's, and with --tombstone-baseline
// an earlier version's binary, in the same run) it starts intentd on a
// fresh data directory, makes one tombstone through the API (an intent
// with a 1s retention, completed, removed by the janitor), restarts
// intentd and reads its memory, stores the other tombstones, restarts it
// again and reads its memory again: the difference, per tombstone, is
// what they cost its RSS (and, compacted and defragmented before each
// restart, etcd's database). Then it compares, in interleaved rounds, the
// latency of Register and of Acquire of tombstoned keys (INTENT_EXPIRED,
// EXPIRED) and of Acquire with register of fresh keys.
//
// Tombstones are stored straight into etcd, as the janitor would have
// written them: a version that keeps one etcd key per tombstone (key and
// end-of-retention index entry) gets copies of the API-made tombstone's
// keys under other intent keys of the same length (as the scale
// workload's seeding copies records); a version that packs tombstones
// gets them through seedPacked. The baseline is an earlier version, the
// one measured this version's: a version that packs them in another way
// than this one cannot be the baseline.

// seedPacked stores tombstones name(0) … name(n-1), of tenant "default",
// into an etcd whose store packs tombstones (and holds name(0)'s), as its
// janitor would have packed them had it removed them one by one in that
// order: each ended as template did, and is kept the default tombstone
// retention from now.
func seedPacked(ctx context.Context, cli *clientv3.Client, n int, name func(int) string, template *intentv1.Intent) error {
	set := tombstones.NewSet()
	now := time.Now()
	until, today := now.Add(daemon.DefaultConfig().Store.TombstoneRetention), tombstones.Today(now)
	state, completed := intent.State(template.GetState()), template.GetCompletedAt().AsTime()
	for i := range n {
		set.Add(tombstones.NewEntry(intent.DefaultTenant, name(i), state, completed, until), today)
	}
	return etcdstore.StoreTombstones(ctx, cli, daemon.DefaultConfig().Store.Prefix, set)
}

// tombStore is one intentd of the tombstones workload.
type tombStore struct {
	label, name, bin string
	s                *intentdServer
	format           string // "keys" (an etcd key and an index key per tombstone) or "packed"
	// before and after are intentd's memory after a restart with one
	// tombstone stored and with all of them, after 200 lookups; idle0 and
	// idle1 before them; heap0 and heap1 its Go heap.
	before, after mem
	idle0, idle1  mem
	heap0, heap1  int64
	seeded        time.Duration
	// inUse0 and inUse1 are etcd's database in use, after compaction and
	// defragmentation, with one tombstone stored and with all of them.
	inUse0, inUse1 int64
}

// tombFlags are the flags a tombstones-workload intentd first runs with: a
// janitor that removes the 1s intent quickly. Restarted, it runs with its
// defaults (and its profiles served, for a GC before memory is read).
var tombFlags = []string{"--janitor-interval", "200ms"}

func (b *bench) runTombstones(ctx context.Context) error {
	n := b.cfg.tombstones
	name := func(i int) string { return fmt.Sprintf("tomb-%s-%012d", b.run, i) }
	stores := []*tombStore{{label: "this version", name: "tomb-this"}}
	if b.cfg.tombstoneBaseline != "" {
		stores = append(stores, &tombStore{label: "baseline " + b.cfg.tombstoneBaseline, name: "tomb-baseline", bin: b.cfg.tombstoneBaseline})
	}
	defer func() {
		for _, st := range stores {
			if st.s != nil {
				st.s.close()
			}
		}
	}()
	for _, st := range stores {
		if err := b.prepareTombstones(ctx, st, n, name); err != nil {
			return fmt.Errorf("tombstones, %s: %w", st.label, err)
		}
	}

	var peers [3][]peer
	for _, st := range stores {
		ids, err := b.sessions(ctx, st.s, b.cfg.tombstoneWorkers, cycleTTL)
		if err != nil {
			return err
		}
		s := st.s
		var seq atomic.Int64
		peers[0] = append(peers[0], peer{st.label, s.proc, nil, func(ctx context.Context, w int) (time.Duration, error) {
			key := name(rand.IntN(n))
			_, err := s.rpc.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: b.params})
			if r := reasonOf(err); r != "INTENT_EXPIRED" {
				return 0, fmt.Errorf("register %s: %v (reason %q), want INTENT_EXPIRED", key, err, r)
			}
			return 0, nil
		}})
		peers[1] = append(peers[1], peer{st.label, s.proc, nil, func(ctx context.Context, w int) (time.Duration, error) {
			key := name(rand.IntN(n))
			resp, err := s.rpc.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: ids[w], RequestId: fmt.Sprintf("late-%d", seq.Add(1))})
			if err != nil || resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXPIRED {
				return 0, fmt.Errorf("acquire %s: %v, outcome %v, want EXPIRED", key, err, resp.GetOutcome())
			}
			return 0, nil
		}})
		peers[2] = append(peers[2], peer{st.label, s.proc, nil, func(ctx context.Context, w int) (time.Duration, error) {
			_, err := b.acquireNew(ctx, s, ids[w], b.key("tf"))
			return 0, err
		}})
	}
	whats := []string{"Register of a tombstoned key", "Acquire of a tombstoned key", "Acquire with register, fresh key"}
	results := make([][][]round, len(whats))
	// Go's collections in each intentd during each call's rounds (and its
	// warm-up): how often its collector ran says whether its tail is the
	// collector's (its live heap sets how often).
	gcs := make([][]float64, len(whats))
	for i, what := range whats {
		for _, st := range stores {
			gcs[i] = append(gcs[i], st.s.metric("go_gc_duration_seconds_count"))
		}
		var err error
		if results[i], err = b.interleave(ctx, "tombstones, "+what, peers[i], b.cfg.tombstoneWorkers); err != nil {
			return err
		}
		for j, st := range stores {
			gcs[i][j] = st.s.metric("go_gc_duration_seconds_count") - gcs[i][j]
		}
	}
	fmt.Fprintf(b.out, "tombstones: %d stored in each intentd, C=%d, %d rounds of %s, interleaved\n", n, b.cfg.tombstoneWorkers, b.cfg.rounds, b.cfg.duration)
	p50, p99 := pctMs(0.5), pctMs(0.99)
	rows := [][]string{{"call", "intentd", "p50 ms", "p99 ms", "p99 ms, rounds pooled", "per s", "collections"}}
	for i, what := range whats {
		var all []round
		for j, st := range stores {
			all = append(all, pooled(results[i][j]))
			rows = append(rows, []string{what, st.label, over(results[i][j], p50).format(2), over(results[i][j], p99).format(2),
				num(p99(all[j]), 2), over(results[i][j], round.rate).format(0), num(gcs[i][j], 0)})
		}
		if len(stores) == 2 {
			rows = append(rows, []string{what, "p99 this ÷ baseline", "", pairQuantileRatio(results[i][0], results[i][1], 0.99).format(2),
				num(ratio(p99(all[0]), p99(all[1])), 2), "", ""})
		}
	}
	table(b.out, rows)
	per := func(a, b int64) string { return num(float64(b-a)/float64(n), 2) }
	// Idle is what a started intentd holds; after lookups adds their
	// garbage, which stays as the collector's headroom (up to intentd's
	// --gc-heap-floor, or twice the live heap, whichever is more).
	mem := [][]string{{"intentd", "format", "stored in", "VmRSS 1 → all", "VmRSS per tombstone", "RssAnon per, idle", "RssAnon per, after lookups", "RssFile per", "Go heap per", "etcd db in use per"}}
	for _, st := range stores {
		mem = append(mem, []string{st.label, st.format, st.seeded.Round(time.Millisecond).String(),
			mib(st.before.rss) + " → " + mib(st.after.rss), per(st.before.rss, st.after.rss), per(st.idle0.anon, st.idle1.anon), per(st.before.anon, st.after.anon),
			per(st.before.file, st.after.file), per(st.heap0, st.heap1), per(st.inUse0, st.inUse1)})
	}
	table(b.out, mem)
	return nil
}

// prepareTombstones starts st's intentd, makes its first tombstone through
// the API, stores the others, and reads its memory after a restart with
// one tombstone and with all of them.
func (b *bench) prepareTombstones(ctx context.Context, st *tombStore, n int, name func(int) string) error {
	var err error
	if st.s, err = b.startIntentdBin(ctx, st.name, st.bin, nil, tombFlags...); err != nil {
		return err
	}
	ids, err := b.sessions(ctx, st.s, 1, cycleTTL)
	if err != nil {
		return err
	}
	template := name(0)
	reg := &intentv1.RegisterRequest{Key: template, Params: b.params, Retention: durationpb.New(time.Second)}
	a, err := st.s.rpc.Acquire(ctx, &intentv1.AcquireRequest{Key: template, SessionId: ids[0], RequestId: "t", Register: reg})
	if err != nil {
		return err
	}
	if err := b.complete(ctx, st.s, template, a.GetLease().GetToken()); err != nil {
		return err
	}
	b.closeSessions(st.s, ids)
	var expired *intentv1.Intent
	if err := poll(ctx, st.s.child, "done removing the template intent", func(ctx context.Context) error {
		ids, err := b.sessions(ctx, st.s, 1, cycleTTL)
		if err != nil {
			return err
		}
		defer b.closeSessions(st.s, ids)
		resp, err := st.s.rpc.Acquire(ctx, &intentv1.AcquireRequest{Key: template, SessionId: ids[0], RequestId: "probe"})
		if err == nil && resp.GetOutcome() != intentv1.Outcome_OUTCOME_EXPIRED {
			err = fmt.Errorf("outcome %v", resp.GetOutcome())
		}
		expired = resp.GetIntent()
		return err
	}); err != nil {
		return err
	}
	if st.inUse0, err = compactDefrag(ctx, st.s.etcd); err != nil {
		return err
	}
	if st.idle0, st.before, st.heap0, err = b.restartForMemory(ctx, st, name(0)); err != nil {
		return err
	}
	b.progress("tombstones, %s: storing %d tombstones", st.label, n)
	t := time.Now()
	if err := b.seedTombstones(ctx, st, n, name, expired); err != nil {
		return err
	}
	st.seeded = time.Since(t)
	b.progress("tombstones, %s: compacting and defragmenting etcd", st.label)
	if st.inUse1, err = compactDefrag(ctx, st.s.etcd); err != nil {
		return err
	}
	// The copy in the middle answers as the tombstone it is.
	if _, err := st.s.rpc.Register(ctx, &intentv1.RegisterRequest{Key: name(n / 2), Params: b.params}); reasonOf(err) != "INTENT_EXPIRED" {
		return fmt.Errorf("register of the stored tombstone %s: %v, want INTENT_EXPIRED: the tombstones were not stored as the janitor stores them", name(n/2), err)
	}
	st.idle1, st.after, st.heap1, err = b.restartForMemory(ctx, st, name(n-1))
	return err
}

// restartForMemory restarts st's intentd on its data directory (its
// defaults, its profiles served) and reads its memory twice: idle once it
// answers (one Register of a tombstoned key) and has settled (what
// starting etcd on the database read and dropped is collected and, mostly,
// given back), and again after 200 more such Registers, which leave their
// garbage where the collector lets it stay; and its Go heap.
func (b *bench) restartForMemory(ctx context.Context, st *tombStore, tombstoned string) (idle, used mem, heap int64, err error) {
	st.s.close()
	pprof, err := freeport.Loopback()
	if err != nil {
		return mem{}, mem{}, 0, err
	}
	if st.s, err = b.startIntentdBin(ctx, st.name, st.bin, nil, "--pprof-listen", pprof); err != nil {
		return mem{}, mem{}, 0, err
	}
	registers := func(n int) error {
		for range n {
			if _, err := st.s.rpc.Register(ctx, &intentv1.RegisterRequest{Key: tombstoned, Params: b.params}); reasonOf(err) != "INTENT_EXPIRED" {
				return fmt.Errorf("register %s after a restart: %v, want INTENT_EXPIRED", tombstoned, err)
			}
		}
		return nil
	}
	settle := func() error {
		for range 3 {
			// A collection now (a heap profile after a GC), then time
			// for the scavenger to hand freed pages back.
			resp, err := (&http.Client{Timeout: time.Minute}).Get("http://" + pprof + "/debug/pprof/heap?gc=1")
			if err != nil {
				return fmt.Errorf("forcing a collection: %w", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Second):
			}
		}
		return nil
	}
	if err := registers(1); err != nil {
		return mem{}, mem{}, 0, err
	}
	if err := settle(); err != nil {
		return mem{}, mem{}, 0, err
	}
	idle = st.s.proc.memory()
	if err := registers(200); err != nil {
		return mem{}, mem{}, 0, err
	}
	if err := settle(); err != nil {
		return mem{}, mem{}, 0, err
	}
	return idle, st.s.proc.memory(), st.s.heap(), nil
}

// seedTombstones stores tombstones name(1) … name(n-1) beside the
// template, name(0), which the janitor made: copies of its etcd keys when
// the version keeps a key per tombstone, else through seedPacked.
func (b *bench) seedTombstones(ctx context.Context, st *tombStore, n int, name func(int) string, expired *intentv1.Intent) error {
	template := []byte(name(0))
	all, err := st.s.etcd.Get(ctx, "", clientv3.WithFromKey())
	if err != nil {
		return err
	}
	var kvs [][2][]byte
	for _, kv := range all.Kvs {
		if kv.Lease == 0 && (bytes.Contains(kv.Key, template) || bytes.Contains(kv.Value, template)) {
			kvs = append(kvs, [2][]byte{kv.Key, kv.Value})
		}
	}
	if len(kvs) == 0 {
		st.format = "packed"
		if err := seedPacked(ctx, st.s.etcd, n, name, expired); err != nil {
			return err
		}
	} else {
		st.format = "keys"
		if err := copyKeys(ctx, st.s.etcd, kvs, template, n, name); err != nil {
			return err
		}
	}
	if n > 10_000 {
		return flushRaftLog(ctx, st.s.etcd)
	}
	return nil
}

// copyKeys writes, for i from 1 to n-1, the keys and values kvs with
// template replaced by name(i), in large transactions.
func copyKeys(ctx context.Context, cli *clientv3.Client, kvs [][2][]byte, template []byte, n int, name func(int) string) error {
	perTxn := max(1, 128/len(kvs)) // etcd's default limit of operations per transaction
	var batch atomic.Int64
	var first firstError
	var wg sync.WaitGroup
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
						ops = append(ops, clientv3.OpPut(string(bytes.ReplaceAll(kv[0], template, to)), string(bytes.ReplaceAll(kv[1], template, to))))
					}
				}
				cctx, cancel := context.WithTimeout(ctx, opTimeout)
				_, err := cli.Txn(cctx).Then(ops...).Commit()
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

// reasonOf is the ErrorInfo reason of a status error, "" for none.
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
