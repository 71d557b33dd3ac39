package etcdstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
)

// BenchmarkHappyPath measures a whole happy-path intent — register and
// acquire in one transaction, then complete — against a bare etcd
// compare-and-swap on the same embedded etcd in the same run, at 1 and 16
// concurrent clients. It reports:
//
//	intent-µs   mean latency of one happy-path intent (2 etcd writes)
//	cas-µs      mean latency of one bare etcd CAS (1 etcd write)
//	ratio       intent-µs / cas-µs (2 writes: ~2 is the floor)
//	intents/s   throughput of happy-path intents at that concurrency
//	cas/s       throughput of bare CAS at that concurrency
//
// Run: go test -run '^$' -bench HappyPath -benchtime 2000x ./etcdstore
func BenchmarkHappyPath(b *testing.B) {
	srv := newCluster(b)
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			s := srv.store(b)
			sessions := make([]string, clients)
			for i := range sessions {
				sess, err := s.OpenSession(context.Background(), "default", fmt.Sprintf("bench-%d", i), time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				sessions[i] = sess.ID
			}
			params, _ := intent.Canonical(map[string]any{"item": "desk lamp", "quantity": 1, "merchant": "M"})
			result := &intent.Result{Payload: []byte(`{"order":"SO-1"}`), ExternalRefs: map[string]string{"supplier_order_id": "SO-1"}}
			run := fmt.Sprintf("%d-%d", clients, time.Now().UnixNano())
			b.ResetTimer()

			casTime, casRate := spread(b.N, clients, func(worker, i int) error {
				key := fmt.Sprintf("/bench/cas/%s/%d-%d", run, worker, i)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, err := srv.cli.Txn(ctx).
					If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, string(params))).
					Commit()
				return err
			})
			intentTime, intentRate := spread(b.N, clients, func(worker, i int) error {
				key := fmt.Sprintf("bench-%s-%d-%d", run, worker, i)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				reg := intent.Registration{Tenant: "default", Key: key, Params: params}
				a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sessions[worker], RequestID: "r", Register: &reg})
				if err != nil {
					return err
				}
				_, err = s.Report(ctx, intent.Report{Tenant: "default", Key: key, Token: a.Lease.Token, Kind: intent.ReportComplete, Result: result})
				return err
			})
			b.StopTimer()
			b.ReportMetric(float64(intentTime.Microseconds()), "intent-µs")
			b.ReportMetric(float64(casTime.Microseconds()), "cas-µs")
			b.ReportMetric(float64(intentTime)/float64(casTime), "ratio")
			b.ReportMetric(intentRate, "intents/s")
			b.ReportMetric(casRate, "cas/s")
		})
	}
}

// spread runs n operations over the given number of concurrent workers and
// returns the mean latency of one operation and the throughput.
func spread(n, workers int, op func(worker, i int) error) (time.Duration, float64) {
	var next atomic.Int64
	var total atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := op(w, i); err != nil {
					failed.Store(err)
					return
				}
				total.Add(int64(time.Since(t0)))
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		panic(err)
	}
	elapsed := time.Since(start)
	return time.Duration(total.Load() / int64(max(n, 1))), float64(n) / elapsed.Seconds()
}
