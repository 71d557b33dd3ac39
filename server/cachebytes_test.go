package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// What the store's cache counts per replayed intent once replays keep
// their answers (a compact entry: the record's head, and the converted
// answer in its memo) is the heap it takes, within the allocator's
// rounding, for params of a few shapes; for intentbench's (300 bytes of
// params and of result, random letters) its figure is in
// docs/PERFORMANCE.md ("Replays beyond the cache"). An estimate far below
// the heap would let the cache outgrow its budget.
func TestCacheBytesPerReplayedIntent(t *testing.T) {
	letters := func(seed uint64, k int) string {
		const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
		r := rand.New(rand.NewPCG(seed, 1024))
		b := make([]byte, k)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	result := []byte(`{"r":"` + letters(2, 300-len(`{"r":""}`)) + `"}`)
	for _, tc := range []struct {
		name   string
		params map[string]any
		most   float64 // bytes per replayed intent, at most
	}{
		{"intentbench's: 300 bytes of text", map[string]any{"note": letters(1, 300-len(`{"note":""}`))}, 2000},
		{"a few values", map[string]any{"item": "desk lamp", "n": []any{1, 2.5, nil}}, 2000},
		{"an order with an address", map[string]any{"sku": "SKU-123456", "qty": 3, "price": 19.99, "currency": "EUR", "customer": "c-98765", "express": true,
			"address": map[string]any{"street": "Main Street 1", "city": "Berlin", "zip": "10115", "country": "DE"}}, 2000},
		{"3,000 bytes of text", map[string]any{"note": strings.Repeat("x", 2989)}, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params, err := structpb.NewStruct(tc.params)
			if err != nil {
				t.Fatal(err)
			}
			e := etcdtest.Start(t)
			_, writer := serveStore(t, e, etcdstore.DefaultConfig())
			f := newFx(t, writer)
			// A thousand cycles and three thousand replays under the race
			// detector on a loaded machine outlast newFx's 30s.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			f.ctx = ctx
			const n = 1000
			// Sessions of the longest TTL: the test sends no heartbeat, and
			// a thousand cycles on a loaded machine outlast the default 10s.
			session := longSession(t, f, "w")
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("sized-%05d", i)
				reg := &intentv1.RegisterRequest{Key: keys[i], Params: params, RequestId: "r-" + keys[i]}
				resp, err := writer.Acquire(f.ctx, &intentv1.AcquireRequest{Key: keys[i], SessionId: session, RequestId: "a-" + keys[i], Register: reg})
				if err != nil {
					t.Fatal(err)
				}
				f.complete(keys[i], resp.GetLease().GetToken(), &intentv1.Result{Payload: result})
			}

			// Another intentd's store, whose cache never held them: what it
			// holds after replaying them is theirs alone.
			store, reader := serveStore(t, e, etcdstore.DefaultConfig())
			rf := newFx(t, reader)
			rf.ctx = ctx
			mine := longSession(t, rf, "replayer")
			replayAll := func() {
				for _, k := range keys {
					resp, err := reader.Acquire(ctx, &intentv1.AcquireRequest{Key: k, SessionId: mine, RequestId: "p-" + k,
						Register: &intentv1.RegisterRequest{Key: k, Params: params, RequestId: "r-" + k}})
					if err != nil || resp.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
						t.Fatalf("replay %s: %v, %v", k, resp.GetOutcome(), err)
					}
				}
			}
			before := heapAfterGC()
			// A read each, then from memory: the store learns that its
			// caller keeps answers, its entries turn compact, then count
			// what their memos say they hold.
			for range 4 {
				replayAll()
			}
			after := heapAfterGC()
			u := store.CacheUsage()
			if u.Records < n || store.Stats().Replays < 2*n {
				t.Fatalf("%d records cached, %d replays from memory; want all %d cached and replayed from memory twice", u.Records, store.Stats().Replays, n)
			}
			perEntry := float64(u.RecordBytes) / float64(u.Records)
			measured := float64(after-before) / n
			t.Logf("%d replayed intents: %.0f bytes each in the cache by its estimate, %.0f bytes of heap each measured", n, perEntry, measured)
			if perEntry < 0.85*measured || perEntry > 1.3*measured {
				t.Errorf("the cache counts %.0f bytes per replayed intent, the heap grew %.0f: want within -15%% to +30%% of it", perEntry, measured)
			}
			if perEntry > tc.most {
				t.Errorf("%.0f bytes of cache per replayed intent, want at most %.0f", perEntry, tc.most)
			}
		})
	}
}

func heapAfterGC() int64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// longSession opens a session of the longest TTL the API allows (5m).
func longSession(t *testing.T, f *fx, worker string) string {
	t.Helper()
	resp, err := f.c.OpenSession(f.ctx, &intentv1.OpenSessionRequest{Worker: worker, Ttl: durationpb.New(5 * time.Minute)})
	if err != nil {
		t.Fatalf("OpenSession(%q): %v", worker, err)
	}
	return resp.GetSessionId()
}
