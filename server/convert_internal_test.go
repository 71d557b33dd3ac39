package server

import (
	"bytes"
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
// from the same Acquisition, however it is encoded: by the server's codec,
// by grpc-go's own (a server built without RequestCodec), or
// deterministically. The stand-in every replay returns carries the
// outcome the interceptors read, decodes on the client's side to the
// fresh conversion, and a memo keeps the first conversion only.
func TestKeptReplayAnswerIsTheConvertedOne(t *testing.T) {
	fresh := completedAcquisition()
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(acquireResponse(fresh))
	if err != nil {
		t.Fatal(err)
	}
	server := requestCodec{encoding.GetCodecV2(grpcproto.Name)}
	encoders := map[string]func(*intentv1.AcquireResponse) ([]byte, error){
		"server's codec": func(r *intentv1.AcquireResponse) ([]byte, error) {
			b, err := server.Marshal(r)
			if err != nil {
				return nil, err
			}
			defer b.Free()
			return b.Materialize(), nil
		},
		"grpc-go's codec": func(r *intentv1.AcquireResponse) ([]byte, error) {
			b, err := encoding.GetCodecV2(grpcproto.Name).Marshal(r)
			if err != nil {
				return nil, err
			}
			defer b.Free()
			return b.Materialize(), nil
		},
		"deterministic": func(r *intentv1.AcquireResponse) ([]byte, error) {
			return proto.MarshalOptions{Deterministic: true}.Marshal(r)
		},
	}

	a := completedAcquisition()
	a.Memo = new(intent.Memo)
	var memo any
	for i := range 3 {
		r := acquireResponse(a)
		if i == 0 {
			memo = a.Memo.Load()
		} else if got := a.Memo.Load(); got != memo {
			t.Errorf("replay %d converted the version again: memo holds %p, want the first %p", i, got, memo)
		}
		if got, want := r.GetOutcome(), intentv1.Outcome_OUTCOME_COMPLETED; got != want {
			t.Errorf("replay %d: outcome %v, want %v", i, got, want)
		}
		for name, encode := range encoders {
			got, err := encode(r)
			if err != nil {
				t.Fatalf("replay %d, %s: %v", i, name, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("replay %d, %s: sent\n%q\nwant the fresh conversion's\n%q", i, name, got, want)
			}
		}
		decoded := new(intentv1.AcquireResponse)
		if err := proto.Unmarshal(want, decoded); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(decoded, acquireResponse(fresh)) {
			t.Errorf("replay %d decodes to %v, want %v", i, decoded, acquireResponse(fresh))
		}
	}
	for i := range 3 {
		got, err := encoders["server's codec"](acquireResponse(fresh))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("answer kept in no memo, %d: sent %q, want the kept answer's %q", i, got, want)
		}
	}
}
