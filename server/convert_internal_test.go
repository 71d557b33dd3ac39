package server

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// paramsToProto reads stored params as protojson reads them: the same
// Struct, value for value, for every kind of JSON value canonical params
// hold.
func TestParamsToProtoReadsAsProtojson(t *testing.T) {
	for _, raw := range []string{
		`{"item":"desk lamp","quantity":1}`,
		`{"a":{"b":{"c":[1,2.5,-3e-7,123456.789,"x",true,false,null,{}]}},"empty":[],"n":null}`,
		`{"amount":9007199254740991,"tiny":5e-324,"neg":-0}`,
		`{"text":"\u00e9\u20ac\ud83d\ude00 \"quoted\" \\ \n\t\u0001","k\u00e9y":"v"}`,
	} {
		canonical, err := intent.CanonicalJSON([]byte(raw))
		if err != nil {
			t.Fatalf("canonical %s: %v", raw, err)
		}
		want := &structpb.Struct{}
		if err := protojson.Unmarshal(canonical, want); err != nil {
			t.Fatalf("protojson %s: %v", canonical, err)
		}
		if got := paramsToProto(canonical); !proto.Equal(got, want) {
			t.Errorf("paramsToProto(%s) = %v, want %v (protojson's)", canonical, got, want)
		}
	}
	if got := paramsToProto([]byte(`{"broken":`)); got != nil {
		t.Errorf("paramsToProto of corrupt params = %v, want nil", got)
	}
}

// BenchmarkParamsToProto: every Acquire replay converts its params.
//
//	go test -run '^$' -bench ParamsToProto -benchmem ./server
func BenchmarkParamsToProto(b *testing.B) {
	raw := []byte(`{"address":{"city":"Berlin","street":"Hauptstrasse 1","zip":"10115"},"amount":89,"currency":"EUR","item":"desk lamp","quantity":1}`)
	for b.Loop() {
		if paramsToProto(raw) == nil {
			b.Fatal("nil")
		}
	}
}

// completedAcquisition is a replay of a COMPLETED intent, every field of
// its answer set.
func completedAcquisition() *intent.Acquisition {
	done := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	return &intent.Acquisition{Outcome: intent.OutcomeCompleted, Intent: &intent.Intent{
		Tenant: "default", Key: "k", State: intent.StateCompleted, Params: []byte(`{"item":"desk lamp","n":[1,2.5,null]}`),
		Fingerprint: "f", Labels: map[string]string{"team": "a"}, CreatedAt: done.Add(-time.Minute), UpdatedAt: done,
		CompletedAt: done, Revision: 7, Retention: time.Hour, RetainUntil: done.Add(time.Hour), Attempts: 1,
		Result: &intent.Result{Payload: []byte("ok"), ExternalRefs: map[string]string{"supplier_order_id": "SO-1"}},
		Lease:  &intent.Lease{Token: 896, Mode: intent.ModeExecute, SessionID: "s", Worker: "w", AcquiredAt: done},
	}}
}

// A replay's kept answer is, byte for byte, the answer converted afresh
// from the same Acquisition, and a memo keeps the first conversion only.
func TestKeptReplayAnswerIsTheConvertedOne(t *testing.T) {
	a := completedAcquisition()
	a.Memo = new(intent.Memo)
	fresh := *a
	fresh.Memo = nil
	wire := func(r proto.Message) string {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	want := wire(acquireResponse(&fresh))
	first := acquireResponse(a)
	if got := wire(first); got != want {
		t.Errorf("replay answer converted into a memo differs from the one converted afresh:\n%q\nwant\n%q", got, want)
	}
	if got := acquireResponse(a); got != first {
		t.Errorf("second replay of the version: %p, want the kept answer %p", got, first)
	}
	if got := wire(acquireResponse(a)); got != want {
		t.Errorf("kept replay answer differs from the one converted afresh:\n%q\nwant\n%q", got, want)
	}
}

// The codec sends a kept replay answer as the bytes of a fresh conversion
// (deterministic: maps in key order), whether the replay decoded it from
// the kept bytes or shares a message another replay uses, an answer kept
// in no memo (a replay that read etcd) as the same bytes, and forgets a
// message's bytes once the message is garbage: the memo holds the bytes
// alone.
func TestKeptReplayAnswerIsSentAsEncoded(t *testing.T) {
	fresh := completedAcquisition()
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(acquireResponse(fresh))
	if err != nil {
		t.Fatal(err)
	}
	codec := requestCodec{encoding.GetCodecV2(grpcproto.Name)}
	send := func(r *intentv1.AcquireResponse) []byte {
		b, err := codec.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		return b.Materialize()
	}
	settledHeap()
	entries := keptEntries()

	a := completedAcquisition()
	a.Memo = new(intent.Memo)
	first := acquireResponse(a)
	for i := range 3 {
		r := acquireResponse(a)
		if r != first {
			t.Errorf("replay %d: message %p, want the one in use %p", i, r, first)
		}
		if got := send(r); !bytes.Equal(got, want) {
			t.Errorf("replay %d sent %q, want the fresh conversion's %q", i, got, want)
		}
	}
	first = nil // no replay uses it any more
	settledHeap()
	decoded := acquireResponse(a)
	if _, ok := keptBytes(decoded); !ok {
		t.Error("an answer decoded from the kept bytes has no kept encoding")
	}
	if got := send(decoded); !bytes.Equal(got, want) {
		t.Errorf("an answer decoded from the kept bytes sent %q, want %q", got, want)
	}
	if _, ok := keptBytes(acquireResponse(fresh)); ok {
		t.Error("an answer kept in no memo has a kept encoding")
	}
	for i := range 3 {
		if got := send(acquireResponse(fresh)); !bytes.Equal(got, want) {
			t.Errorf("answer kept in no memo, %d: sent %q, want the kept answer's %q", i, got, want)
		}
	}

	decoded = nil
	a.Memo = nil // the store forgot the version
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		if keptEntries() <= entries {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d kept encodings outlived their messages by 10s (%d before)", keptEntries(), entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
