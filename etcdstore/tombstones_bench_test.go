package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// BenchmarkTombstonedLookup measures, in one process, a Register of a
// tombstoned key (INTENT_EXPIRED) with 100,000 tombstones stored packed
// (this version: the lookup reads the chunk that covers the key's hash)
// and with as many stored in the previous version's format (an etcd key
// each, which this version still reads), each on an embedded etcd of its
// own reached in-process, as intentd reaches its embedded etcd. Beside
// ns/op and B/op (what a lookup allocates: the chunk's copy out of etcd's
// database is most of the difference), it reports the median and the
// 99th percentile of the lookups' latencies.
//
// Run: go test -run '^$' -bench TombstonedLookup -benchtime 20000x ./etcdstore
func BenchmarkTombstonedLookup(b *testing.B) {
	const n = 100_000
	now := time.Now()
	name := func(i int) string { return fmt.Sprintf("order-%07d", i) }
	for _, format := range []string{"packed", "keys"} {
		b.Run(format, func(b *testing.B) {
			cli := v3client.New(etcdtest.Start(b).Etcd.Server)
			b.Cleanup(func() { _ = cli.Close() })
			s, err := New(cli, DefaultConfig())
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if format == "packed" {
				set, today := tombstones.NewSet(), tombstones.Today(now)
				for i := range n {
					set.Add(tombstones.NewEntry(intent.DefaultTenant, name(i), intent.StateCompleted, now, now.Add(time.Hour)), today)
				}
				err = StoreTombstones(ctx, cli, s.keys.prefix, set)
			} else {
				err = storeKeyTombstones(ctx, cli, s.keys, n, name, now)
			}
			if err != nil {
				b.Fatal(err)
			}
			if err := s.LearnTombstones(ctx); err != nil {
				b.Fatal(err)
			}
			params := []byte(`{"item":"desk lamp"}`)
			took := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				_, _, err := s.Register(ctx, intent.Registration{Tenant: intent.DefaultTenant, Key: name(i * 7919 % n), Params: params})
				took = append(took, time.Since(t0))
				if !errors.Is(err, intent.ErrExpired) {
					b.Fatalf("Register of a tombstoned key: %v, want EXPIRED", err)
				}
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// storeKeyTombstones stores tombstones of name(0) … name(n-1) in the
// previous version's format: an etcd key each.
func storeKeyTombstones(ctx context.Context, cli *clientv3.Client, k keys, n int, name func(int) string, now time.Time) error {
	var ops []clientv3.Op
	for i := range n {
		v, err := encodeTombstone(&machine.Tombstone{Key: name(i), State: intent.StateCompleted, CompletedAt: now, RemovedAt: now, Until: now.Add(time.Hour)})
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(k.tombstone(intent.DefaultTenant, name(i)), string(v)))
		if len(ops) == 128 || i == n-1 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				return err
			}
			ops = ops[:0]
		}
	}
	return nil
}
