package server

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// What a memo keeps of a replay answer says what heap it holds (the store
// counts it, see etcdstore's cache.go): measured for params of a few
// shapes, the answers kept and their messages dropped, as between two
// replays of a version. A figure far below the heap would let a store's
// cache outgrow its budget.
func TestKeptAnswerSaysWhatItHolds(t *testing.T) {
	result := `{"r":"` + strings.Repeat("x", 292) + `"}`
	for _, tc := range []struct{ name, params string }{
		{"a few values", `{"item":"desk lamp","n":[1,2.5,null]}`},
		{"one 300-byte string", `{"note":"` + strings.Repeat("x", 289) + `"}`},
		{"an order with an address", `{"sku":"SKU-123456","qty":3,"price":19.99,"currency":"EUR","customer":"c-98765","express":true,"address":{"street":"Main Street 1","city":"Berlin","zip":"10115","country":"DE"}}`},
		{"one 3,000-byte string", `{"note":"` + strings.Repeat("x", 2989) + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 5000
			acqs := make([]*intent.Acquisition, n)
			for i := range acqs {
				a := completedAcquisition()
				a.Intent.Params, a.Intent.Result.Payload = []byte(tc.params), []byte(result)
				a.Memo = new(intent.Memo)
				acqs[i] = a
			}
			before := settledHeap()
			for _, a := range acqs {
				acquireResponse(a) // keeps the answer in a.Memo
			}
			// The Acquisitions hold their intents either way: what the
			// memos hold is the growth.
			measured := float64(settledHeap()-before) / n
			runtime.KeepAlive(acqs)
			said := float64(acqs[0].Memo.Load().(*kept).HeapBytes())
			t.Logf("%d bytes of params: %.0f bytes of heap per kept answer, it says %.0f", len(tc.params), measured, said)
			if said < 0.85*measured || said > 1.3*measured {
				t.Errorf("HeapBytes = %.0f, measured %.0f: want within -15%% to +30%% of it", said, measured)
			}
		})
	}
}

// settledHeap is the live heap once earlier tests' garbage is collected:
// it collects until the heap stops shrinking. Under load (CI runs packages
// in parallel, with the race detector) one collection may leave some of
// it, which made answers look much smaller than they are.
func settledHeap() int64 {
	var m runtime.MemStats
	prevHeap, steady := int64(-1), 0
	for range 200 { // at most about 5 s
		runtime.GC()
		time.Sleep(25 * time.Millisecond)
		runtime.ReadMemStats(&m)
		heap := int64(m.HeapAlloc)
		if prevHeap >= 0 && heap >= prevHeap-prevHeap/200 {
			if steady++; steady == 2 {
				break
			}
		} else {
			steady = 0
		}
		prevHeap = heap
	}
	return int64(m.HeapAlloc)
}

// New tells an etcdstore that the server keeps its answers in memos.
var _ answerKeeper = (*etcdstore.Store)(nil)
