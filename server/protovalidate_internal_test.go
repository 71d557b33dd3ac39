package server

import (
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Every string pattern of intent.proto has its words in patternWords: a
// pattern without them would show a person its raw regex again.
func TestEveryPatternHasWords(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	var patterns []string
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
	if len(patterns) < 10 {
		t.Errorf("found %d patterns in intent.proto, want the 30-odd it has: %q", len(patterns), patterns)
	}
}
