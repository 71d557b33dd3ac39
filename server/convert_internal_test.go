package server

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
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

// paramsToProto reads stored params as protojson reads them, and writes
// them as a deterministic Marshal of protojson's Struct writes it: for
// every kind of JSON value canonical params hold, keys that sort
// differently by UTF-16 code units (as canonical JSON orders them) and by
// bytes (as an encoding does), long strings, deep nesting, and random
// objects.
func TestParamsToProtoReadsAsProtojson(t *testing.T) {
	raws := []string{
		`{}`,
		`{"item":"desk lamp","quantity":1}`,
		`{"a":{"b":{"c":[1,2.5,-3e-7,123456.789,"x",true,false,null,{}]}},"empty":[],"n":null}`,
		`{"amount":9007199254740991,"tiny":5e-324,"neg":-0,"big":1e+15,"small":-1.5e-300}`,
		`{"text":"\u00e9\u20ac\ud83d\ude00 \"quoted\" \\ \n\t\u0001\/","k\u00e9y":"v"}`,
		`{"\ud83d\ude00":1,"\uffff":2,"":3," ":4}`,
		`{"note":"` + strings.Repeat("x", 3000) + `","list":[` + strings.Repeat(`{"a":[[]]},`, 200) + `0]}`,
		`{"deep":` + strings.Repeat(`{"d":`, 30) + `1` + strings.Repeat(`}`, 30) + `}`,
	}
	fixed := len(raws)
	rnd := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		raws = append(raws, string(randomJSONObject(rnd, 0)))
	}
	for i, raw := range raws {
		canonical, err := intent.CanonicalJSON([]byte(raw))
		if err != nil && i >= fixed {
			continue // a random object with a key twice
		}
		if err != nil {
			t.Fatalf("canonical %s: %v", raw, err)
		}
		want, wantWire, gotWire, err := paramsWires(t, canonical)
		if err != nil {
			t.Fatalf("protojson %s: %v", canonical, err)
		}
		if !bytes.Equal(gotWire, wantWire) {
			t.Errorf("paramsToProto(%.200s) encodes to\n%q\nwant\n%q", canonical, gotWire, wantWire)
		}
		got := &structpb.Struct{}
		if err := proto.Unmarshal(gotWire, got); err != nil || !proto.Equal(got, want) {
			t.Errorf("paramsToProto(%.200s) decodes to %v (%v), want %v", canonical, got, err, want)
		}
	}
	// As deep as canonical JSON goes, objects and lists.
	for n := 25; n <= 40; n++ {
		for _, open := range []string{`{"d":`, `[`} {
			close := map[string]string{`{"d":`: `}`, `[`: `]`}[open]
			raw := `{"deep":` + strings.Repeat(open, n) + `1` + strings.Repeat(close, n) + `}`
			if canonical, err := intent.CanonicalJSON([]byte(raw)); err == nil && paramsToProto(canonical) == nil {
				t.Errorf("paramsToProto of params %d deep = nil", n+1)
			}
		}
	}
	for _, corrupt := range []string{`{"broken":`, `[1]`, `{"a":1}x`, `{"a":01x}`, `{"a":"\ud800"}`, `{"a":1e999}`, `{"a":"` + "\x01" + `"}`} {
		if got := paramsToProto([]byte(corrupt)); got != nil {
			t.Errorf("paramsToProto of corrupt params %s = %v, want nil", corrupt, got)
		}
	}
}

// randomJSONObject is a JSON object of random members: strings with
// escapes and characters of other scripts, numbers of many magnitudes,
// literals, lists and objects.
func randomJSONObject(rnd *rand.Rand, depth int) []byte {
	words := []string{"a", "b", "é", "日本", `\u00e9`, `\n`, `\\`, `\"`, "x y", `\ud83d\ude00`, `\uffff`, "Z", ""}
	str := func() string {
		var sb strings.Builder
		for range rnd.IntN(4) {
			sb.WriteString(words[rnd.IntN(len(words))])
		}
		return `"` + sb.String() + `"`
	}
	var value func(d int) string
	value = func(d int) string {
		switch k := rnd.IntN(9); {
		case k == 0 && d < 4:
			return string(randomJSONObject(rnd, d+1))
		case k == 1 && d < 4:
			n := rnd.IntN(4)
			items := make([]string, n)
			for i := range items {
				items[i] = value(d + 1)
			}
			return "[" + strings.Join(items, ",") + "]"
		case k == 2:
			return str()
		case k == 3:
			return []string{"true", "false", "null"}[rnd.IntN(3)]
		default:
			return strconv.FormatFloat((rnd.Float64()-0.5)*math.Pow(10, float64(rnd.IntN(36)-20)), 'g', -1, 64)
		}
	}
	seen := map[string]bool{}
	var members []string
	for range rnd.IntN(6) {
		k := str()
		if seen[k] {
			continue
		}
		seen[k] = true
		members = append(members, k+":"+value(depth))
	}
	return []byte("{" + strings.Join(members, ",") + "}")
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
		if got := decoded.GetIntent().GetParams().GetFields()["item"].GetStringValue(); got != "desk lamp" || decoded.GetStatement().GetText() == "" {
			t.Errorf("replay %d decodes to %v, want the params and a statement", i, decoded)
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

// FuzzParamsToProto: for any JSON object text intent.CanonicalJSON accepts,
// paramsToProto writes what a deterministic Marshal of protojson's Struct
// writes.
//
//	go test -run '^$' -fuzz FuzzParamsToProto -fuzztime 60s ./server
func FuzzParamsToProto(f *testing.F) {
	for _, seed := range []string{`{}`, `{"a":[1,{"b":null}],"c":"\u00e9\ud83d\ude00","d":-1.5e-7,"e":true}`, `{"\ud83d\ude00":1,"\uffff":2}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		canonical, err := intent.CanonicalJSON(raw)
		if err != nil || len(canonical) == 0 || canonical[0] != '{' {
			return
		}
		_, wantWire, gotWire, err := paramsWires(t, canonical)
		if err != nil {
			return // beyond what protojson reads; never stored
		}
		if !bytes.Equal(gotWire, wantWire) {
			t.Errorf("paramsToProto(%s) encodes to\n%q\nwant\n%q", canonical, gotWire, wantWire)
		}
	})
}

// paramsWires reads canonical as protojson does and returns that Struct,
// its deterministic encoding, and the encoding of paramsToProto's Struct;
// err is protojson's, when it cannot read canonical.
func paramsWires(t *testing.T, canonical []byte) (want *structpb.Struct, wantWire, gotWire []byte, err error) {
	t.Helper()
	want = &structpb.Struct{}
	if err := protojson.Unmarshal(canonical, want); err != nil {
		return nil, nil, nil, err
	}
	wantWire, err = proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	gotWire, err = proto.Marshal(paramsToProto(canonical))
	if err != nil {
		t.Fatal(err)
	}
	return want, wantWire, gotWire, nil
}
