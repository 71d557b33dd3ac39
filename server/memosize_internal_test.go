package server

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
)

// intent.MemoBytes, what a store counts for a replayed version's memo, is
// the heap a kept replay answer occupies (the converted answer and its
// encoding), measured for params of a few shapes: an estimate far below it
// would let a store's cache outgrow its budget.
func TestMemoBytesIsWhatAKeptAnswerHolds(t *testing.T) {
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
			measured := float64(settledHeap()-before) / n
			runtime.KeepAlive(acqs)
			estimate := float64(intent.MemoBytes(len(tc.params), len(result)))
			t.Logf("%d bytes of params: %.0f bytes of heap per kept answer, estimated %.0f", len(tc.params), measured, estimate)
			if estimate < 0.85*measured || estimate > 1.5*measured {
				t.Errorf("intent.MemoBytes = %.0f, measured %.0f: want within -15%% to +50%% of it", estimate, measured)
			}
		})
	}
}

// settledHeap is the live heap once earlier tests' kept encodings are gone
// (their cleanups run after a collection).
func settledHeap() int64 {
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
