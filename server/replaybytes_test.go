package server_test

import (
	"bytes"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// recorder is grpc-go's proto codec on the client's side, keeping the
// bytes of the last message it decoded: what the server sent.
type recorder struct {
	encoding.CodecV2
	last []byte
}

func (r *recorder) Unmarshal(data mem.BufferSlice, v any) error {
	r.last = data.Materialize()
	return r.CodecV2.Unmarshal(data, v)
}

// A replay answered from memory and one that had to read etcd (another
// intentd on the same etcd, whose cache never held the intent) send the
// same bytes: params of many fields, labels and external references (maps,
// which a plain encoding orders at random) included.
func TestReplayFromEtcdSendsTheBytesOfAReplayFromMemory(t *testing.T) {
	e := etcdtest.Start(t)
	f := newFx(t, serve(t, e))
	const key = "replayed-bytes"
	params := map[string]any{"sku": "LMP-42", "quantity": 2.0, "merchant": "M-17", "max_amount": "89.00", "currency": "EUR",
		"ship_to": map[string]any{"name": "Ada", "street": "12 St James's Square", "city": "London", "postcode": "SW1Y 4JH"}, "gift": true, "note": nil}
	reg := &intentv1.RegisterRequest{Key: key, Params: mustStruct(t, params), Labels: map[string]string{"team": "a", "customer": "c-42", "channel": "agent"}}
	if _, err := f.c.Register(f.ctx, reg); err != nil {
		t.Fatal(err)
	}
	_, token := f.lease(key, "w", intentv1.Outcome_OUTCOME_EXECUTE)
	f.complete(key, token, &intentv1.Result{Payload: []byte(`{"order":"SO-42"}`),
		ExternalRefs: map[string]string{"supplier_order_id": "SO-42", "invoice": "INV-7", "parcel": "P-1", "refund": "R-0"}})

	rec := &recorder{CodecV2: encoding.GetCodecV2(grpcproto.Name)}
	replay := func(c intentv1.IntentServiceClient, session, req string) []byte {
		t.Helper()
		resp, err := c.Acquire(f.ctx, &intentv1.AcquireRequest{Key: key, SessionId: session, RequestId: req, Register: reg}, grpc.ForceCodecV2(rec))
		if err != nil || resp.GetOutcome() != intentv1.Outcome_OUTCOME_COMPLETED {
			t.Fatalf("replay %s: %v, %v; want COMPLETED", req, resp.GetOutcome(), err)
		}
		return bytes.Clone(rec.last)
	}
	mine := f.session("replayer")
	want := replay(f.c, mine, "memory-1")
	for i, got := range [][]byte{replay(f.c, mine, "memory-2"), replay(f.c, mine, "memory-3")} {
		if !bytes.Equal(got, want) {
			t.Errorf("replay from memory %d sent other bytes than the first:\n%q\nwant\n%q", i+2, got, want)
		}
	}

	cfg := etcdstore.DefaultConfig()
	cfg.CacheBytes = 1 << 20
	store, other := serveStore(t, e, cfg)
	theirs := newFx(t, other).session("other-replayer")
	read := replay(other, theirs, "etcd-1")
	if n := store.Stats().Replays; n != 0 {
		t.Fatalf("the other intentd replayed %d from memory, want its first replay read from etcd", n)
	}
	if !bytes.Equal(read, want) {
		t.Errorf("replay read from etcd sent\n%q\nwant the replay from memory's\n%q", read, want)
	}
	if again := replay(other, theirs, "etcd-2"); store.Stats().Replays != 1 || !bytes.Equal(again, want) {
		t.Errorf("the other intentd's second replay (from memory: %d) sent\n%q\nwant\n%q", store.Stats().Replays, again, want)
	}
}
