package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// BenchmarkReviewQueuePage measures one page of the review queue —
// List(states UNKNOWN, NEEDS_REVIEW), 20 intents — first with nothing else
// stored, then with 100,000 unrelated COMPLETED intents beside it, on the
// same embedded etcd. The page reads the state indexes from their start, so
// its cost must not grow with the unrelated intents:
//
//	µs/page      mean latency of one page
//	stored       intents stored besides the queue
//
// Run: go test -run '^$' -bench ReviewQueuePage -benchtime 200x ./etcdstore
func BenchmarkReviewQueuePage(b *testing.B) {
	srv := etcdtest.Start(b)
	cli := srv.Client(b)
	s, err := New(cli, DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	// The queue: 10 UNKNOWN and 10 NEEDS_REVIEW intents.
	var queue []*machine.Record
	for i := range 20 {
		st := intent.StateUnknown
		if i%2 == 1 {
			st = intent.StateNeedsReview
		}
		queue = append(queue, benchRecord(fmt.Sprintf("queue-%02d", i), st, now.Add(time.Duration(i)*time.Millisecond)))
	}
	seed(b, s, cli, queue)

	page := func(b *testing.B, stored int) {
		b.Run(fmt.Sprintf("stored=%d", stored), func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				t0 := time.Now()
				p, err := s.List(ctx, intent.ListQuery{Filter: intent.Filter{Tenant: "default", States: []intent.State{intent.StateUnknown, intent.StateNeedsReview}}, PageSize: 20})
				total += time.Since(t0)
				if err != nil || len(p.Intents) != 20 {
					b.Fatalf("List: %d intents, %v; want the 20 of the queue", len(p.Intents), err)
				}
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/page")
			b.ReportMetric(float64(stored), "stored")
		})
	}
	page(b, 0)

	const unrelated = 100_000
	batch := make([]*machine.Record, 0, 40)
	for i := range unrelated {
		// Registered before and after the queue, so both ends of the
		// index are crowded.
		at := now.Add(time.Duration(i-unrelated/2) * time.Microsecond)
		batch = append(batch, benchRecord(fmt.Sprintf("done-%06d", i), intent.StateCompleted, at))
		if len(batch) == cap(batch) {
			seed(b, s, cli, batch)
			batch = batch[:0]
		}
	}
	seed(b, s, cli, batch)
	page(b, unrelated)
}

func benchRecord(key string, st intent.State, created time.Time) *machine.Record {
	r := &machine.Record{
		Tenant: "default", Key: key, State: st,
		Params: []byte(`{"item":"desk lamp","quantity":1}`), Fingerprint: "f",
		History:   []intent.Event{{Time: created, Kind: intent.EventRegistered, Accepted: true}},
		CreatedAt: created, UpdatedAt: created, Retention: time.Hour,
	}
	if st.Final() {
		r.Result = &intent.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-" + key}}
		r.CompletedAt, r.RetainUntil = created, created.Add(r.Retention)
	}
	return r
}

// seed writes records with their index keys, several per transaction, as
// the store's own transitions would have left them.
func seed(b *testing.B, s *Store, cli *clientv3.Client, recs []*machine.Record) {
	b.Helper()
	var ops []clientv3.Op
	for _, r := range recs {
		val, err := encodeRecord(r)
		if err != nil {
			b.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(s.keys.intent(r.Tenant, r.Key), string(val)))
		ops = s.keys.appendIndexOps(ops, nil, r)
	}
	if len(ops) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		b.Fatal(err)
	}
}
