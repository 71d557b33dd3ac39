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
// acquire in one transaction, then complete — against the same work done
// by hand on the same embedded etcd in the same run (a create-if-absent
// then an update-if-revision: two bare compare-and-swaps), at 1, 16, 64
// and 256 concurrent clients. It reports:
//
//	intent-µs   mean latency of one happy-path intent (2 store calls)
//	raw-µs      mean latency of one raw cycle (2 bare etcd CAS)
//	intents/s   throughput of happy-path intents at that concurrency
//	raw/s       throughput of raw cycles at that concurrency
//	ratio       intents/s ÷ raw/s (1: the store costs what its writes do)
//
// Run: go test -run '^$' -bench HappyPath -benchtime 2000x ./etcdstore
func BenchmarkHappyPath(b *testing.B) {
	srv := newCluster(b)
	for _, clients := range []int{1, 16, 64, 256} {
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

			rawTime, rawRate := spread(b.N, clients, func(worker, i int) error {
				key := fmt.Sprintf("/bench/cas/%s/%d-%d", run, worker, i)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				created, err := srv.cli.Txn(ctx).
					If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, string(params))).
					Commit()
				if err != nil {
					return err
				}
				_, err = srv.cli.Txn(ctx).
					If(clientv3.Compare(clientv3.ModRevision(key), "=", created.Header.Revision)).
					Then(clientv3.OpPut(key, string(params)+" ")).
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
			b.ReportMetric(float64(rawTime.Microseconds()), "raw-µs")
			b.ReportMetric(intentRate, "intents/s")
			b.ReportMetric(rawRate, "raw/s")
			b.ReportMetric(intentRate/rawRate, "ratio")
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

// BenchmarkHeartbeat measures one heartbeat naming 20 held leases, the
// common case of a worker with several intents in flight: the keep-alive
// and the one read that checks the leases.
//
// Run: go test -run '^$' -bench Heartbeat -benchmem ./etcdstore
func BenchmarkHeartbeat(b *testing.B) {
	srv := newCluster(b)
	s := srv.store(b)
	bg := context.Background()
	sess, err := s.OpenSession(bg, "default", "bench", time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	params, _ := intent.Canonical(map[string]any{"item": "desk lamp", "quantity": 1, "merchant": "M"})
	var held []intent.HeldLease
	for i := range 20 {
		reg := intent.Registration{Tenant: "default", Key: fmt.Sprintf("bench-hb-%d", i), Params: params}
		a, err := s.Acquire(bg, intent.AcquireRequest{Tenant: "default", Key: reg.Key, SessionID: sess.ID, RequestID: "r", Register: &reg})
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, intent.HeldLease{Key: reg.Key, Token: a.Lease.Token})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Heartbeat(bg, "default", sess.ID, held); err != nil {
			b.Fatal(err)
		}
	}
}
