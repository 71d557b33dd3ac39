package server

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

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

// A replay's kept answer is, byte for byte, the answer converted afresh
// from the same Acquisition, and a memo keeps the first conversion only.
func TestKeptReplayAnswerIsTheConvertedOne(t *testing.T) {
	done := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	a := &intent.Acquisition{Outcome: intent.OutcomeCompleted, Memo: new(intent.Memo), Intent: &intent.Intent{
		Tenant: "default", Key: "k", State: intent.StateCompleted, Params: []byte(`{"item":"desk lamp","n":[1,2.5,null]}`),
		Fingerprint: "f", Labels: map[string]string{"team": "a"}, CreatedAt: done.Add(-time.Minute), UpdatedAt: done,
		CompletedAt: done, Revision: 7, Retention: time.Hour, RetainUntil: done.Add(time.Hour), Attempts: 1,
		Result: &intent.Result{Payload: []byte("ok"), ExternalRefs: map[string]string{"supplier_order_id": "SO-1"}},
		Lease:  &intent.Lease{Token: 896, Mode: intent.ModeExecute, SessionID: "s", Worker: "w", AcquiredAt: done},
	}}
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
