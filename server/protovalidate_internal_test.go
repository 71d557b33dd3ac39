package server

import (
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Every string pattern a request can break is said in words, so that no
// refusal shows a person a raw regex: each pattern of intent.proto has its
// words in patternWords. The rules of rules.proto, which many fields
// share, return their words themselves (TestErrorTextsSayItOnce reads each
// one's refusal); here each must be a rule some request field uses.
func TestEveryPatternHasWords(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	var patterns []string
	shared := map[protoreflect.FullName]bool{} // the rules of rules.proto the requests use
	var walk func(m protoreflect.MessageDescriptor)
	walk = func(m protoreflect.MessageDescriptor) {
		if seen[m.FullName()] {
			return
		}
		seen[m.FullName()] = true
		for i := range m.Fields().Len() {
			f := m.Fields().Get(i)
			rules, _ := proto.GetExtension(f.Options(), validate.E_Field).(*validate.FieldRules)
			for _, s := range []*validate.StringRules{rules.GetString(), rules.GetRepeated().GetItems().GetString(),
				rules.GetMap().GetKeys().GetString(), rules.GetMap().GetValues().GetString()} {
				if s.HasPattern() {
					patterns = append(patterns, string(f.FullName())+" "+s.GetPattern())
					if _, ok := patternWords[s.GetPattern()]; !ok {
						t.Errorf("%s: pattern %q has no words in patternWords", f.FullName(), s.GetPattern())
					}
				}
				s.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
					if fd.IsExtension() {
						shared[fd.FullName()] = true
					}
					return true
				})
			}
			if f.Message() != nil {
				walk(f.Message())
			}
			if f.IsMap() && f.MapValue().Message() != nil {
				walk(f.MapValue().Message())
			}
		}
	}
	methods := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods()
	for i := range methods.Len() {
		walk(methods.Get(i).Input())
	}
	if len(patterns) < 4 {
		t.Errorf("found %d patterns in intent.proto, want the 4 it has besides rules.proto's: %q", len(patterns), patterns)
	}
	exts := intentv1.File_intent_v1_rules_proto.Extensions()
	for i := range exts.Len() {
		x := exts.Get(i)
		if !shared[x.FullName()] {
			t.Errorf("rules.proto's %s is a rule no request field uses", x.FullName())
		}
		if rules, _ := proto.GetExtension(x.Options(), validate.E_Predefined).(*validate.PredefinedRules); len(rules.GetCel()) == 0 {
			t.Errorf("rules.proto's %s states no rule", x.FullName())
		}
	}
	if exts.Len() < 8 {
		t.Errorf("rules.proto has %d rules, want the 8 it has", exts.Len())
	}
}

// BenchmarkRequestRules: what checking a request against its compiled
// rules costs (Server.valid, before every handler), for the requests of a
// worker's cycle.
func BenchmarkRequestRules(b *testing.B) {
	params, err := structpb.NewStruct(map[string]any{"item": "desk lamp", "quantity": 1, "merchant": "M", "max_amount": "89.00", "currency": "EUR"})
	if err != nil {
		b.Fatal(err)
	}
	rules, err := compiledRules()
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		req  proto.Message
	}{
		{"AcquireRegister", &intentv1.AcquireRequest{Key: "purchase-lamp-000123", SessionId: "694d8f3a2c1b0e57", RequestId: "acq-purchase-lamp-000123",
			Register: &intentv1.RegisterRequest{Key: "purchase-lamp-000123", Params: params, Labels: map[string]string{"customer": "c-17"}}}},
		{"AcquireReplay", &intentv1.AcquireRequest{Key: "purchase-lamp-000123", SessionId: "694d8f3a2c1b0e57", RequestId: "acq-purchase-lamp-000123"}},
		{"Complete", &intentv1.CompleteRequest{Key: "purchase-lamp-000123", Token: 12345678, Result: &intentv1.Result{ExternalRefs: map[string]string{"order_id": "SO-1"}}}},
		{"Get", &intentv1.GetRequest{Tenant: "acme", Key: "purchase-lamp-000123"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := rules.validate(bc.req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
