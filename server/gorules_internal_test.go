package server

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/intent"
)

// sharedRuleValues are values around every shared rule's limits and
// alphabets: each printable ASCII character alone, first and inside,
// lengths about each limit in one-byte and two-byte characters, label
// filters about the name's limit, and a few of other scripts.
func sharedRuleValues() []string {
	vals := []string{"", "a", "A", "0", "a=", "=v", "a=b", "Ab-9_.:/=@+", "team=a=b", "é", "日本", "a b", "a\tb", "a\nb", "\u2603", "ab\x7f"}
	for c := byte(' '); c <= '~'; c++ {
		vals = append(vals, string(c), string(c)+"a", "a"+string(c)+"b", "a"+string(c)+"=v")
	}
	for _, limit := range []int{32, 64, 128, 256, 320, 1024} {
		for n := limit - 1; n <= limit+1; n++ {
			vals = append(vals, strings.Repeat("a", n), strings.Repeat("é", n), strings.Repeat("a", n-1)+"é", "a"+strings.Repeat("-", n-1))
		}
	}
	for n := 61; n <= 65; n++ {
		vals = append(vals, strings.Repeat("x", n)+"=v", strings.Repeat("x", n)+"=", strings.Repeat("x", n)+"="+strings.Repeat("v", 320-n))
	}
	return vals
}

// Each Go check accepts exactly what its rule's expression accepts: a value
// it accepts and the expression refuses would let a malformed request
// through; one it refuses and the expression accepts would send a valid
// request the slow way. Each field checked in Go, set alone to each value,
// against protovalidate reporting every violation.
func TestSharedRulesAcceptWhatTheirExpressionsAccept(t *testing.T) {
	rules, all := rulesAndProtovalidate(t)
	checked := map[protoreflect.FullName]bool{}
	for name, p := range rules.checks.plans {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range p.fields {
			rule := f.shared
			if rule == "" {
				continue // not one shared rule alone: TestGoChecksAcceptWhatTheirRulesAccept
			}
			checked[rule] = true
			for _, v := range sharedRuleValues() {
				if v == "" && (f.required || f.ignoreIfZero) {
					continue // not the rule's to judge
				}
				m := mt.New()
				m.Set(f.fd, protoreflect.ValueOfString(v))
				refused := false
				var verr *protovalidate.ValidationError
				if err := all.Validate(m.Interface()); errors.As(err, &verr) {
					for _, viol := range verr.Violations {
						if fieldPath(viol.Proto.GetField()) == string(f.fd.Name()) {
							refused = true
						}
					}
				} else if err != nil {
					t.Fatal(err)
				}
				if got := f.sharedAccepts(v); got == refused {
					t.Errorf("%s.%s (%s) = %q: Go check accepts %v, the expression %v", name, f.fd.Name(), rule, v, got, !refused)
				}
			}
		}
	}
	for name := range sharedRuleAccepts {
		if !checked[name] {
			t.Errorf("rule %s has a Go check but no request field is checked with it", name)
		}
	}
}

// Checking the shared rules in Go first changes no answer: random requests
// of every kind, their shared fields mostly valid and their other fields
// anything, get from the validator the error protovalidate alone gives
// (the same field and words, or none).
func TestSharedRuleChecksChangeNoAnswer(t *testing.T) {
	rules, err := compiledRules()
	if err != nil {
		t.Fatal(err)
	}
	alone := &requestValidator{v: rules.v}
	shared := map[protoreflect.FieldDescriptor]*checkedField{}
	for _, p := range rules.checks.plans {
		for _, f := range p.fields {
			if f.shared != "" {
				shared[f.fd] = f
			}
		}
	}
	g := requestMaker{rnd: rand.New(rand.NewPCG(1, 2)), shared: shared, values: sharedRuleValues()}
	var fastValid, fastRefused, slow int
	for _, mt := range requestMessageTypes(t) {
		for range 400 {
			m := mt.New()
			g.fill(m, 0)
			got, want := rules.validate(m.Interface()), alone.validate(m.Interface())
			if !sameRefusal(got, want) {
				t.Errorf("%s %v:\n got %v\nwant %v", mt.Descriptor().Name(), m, got, want)
			}
			switch {
			case !rules.checks.pass(m):
				slow++
			case got == nil:
				fastValid++
			default:
				fastRefused++ // by a rule without a Go check
			}
		}
	}
	t.Logf("passed the Go checks: %d valid, %d refused by a rule without one; failed them: %d", fastValid, fastRefused, slow)
	if fastValid < 200 || slow < 200 {
		t.Errorf("want at least 200 requests that pass the Go checks and 200 that fail them")
	}
}

// requestMessageTypes are the message types of requestDescriptors.
func requestMessageTypes(tb testing.TB) []protoreflect.MessageType {
	tb.Helper()
	var out []protoreflect.MessageType
	for _, d := range requestDescriptors() {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, mt)
	}
	return out
}

// rulesAndProtovalidate are the compiled request rules, and a
// protovalidate validator that reports every violation.
func rulesAndProtovalidate(t *testing.T) (*requestValidator, protovalidate.Validator) {
	t.Helper()
	rules, err := compiledRules()
	if err != nil {
		t.Fatal(err)
	}
	all, err := protovalidate.New()
	if err != nil {
		t.Fatal(err)
	}
	return rules, all
}

func sameRefusal(a, b error) bool {
	var ia, ib *intent.InvalidError
	if errors.As(a, &ia) && errors.As(b, &ib) {
		return *ia == *ib
	}
	return a == nil && b == nil
}

// requestMaker fills requests at random: a shared field with a value its
// rule accepts three times in four, anything else with values valid or not.
type requestMaker struct {
	rnd    *rand.Rand
	shared map[protoreflect.FieldDescriptor]*checkedField
	values []string
}

var otherStrings = []string{"", "x", "EUR", "refund.issue", strings.Repeat("0", 64), "junk \x01", strings.Repeat("x", 3000), "a=b"}

func (g requestMaker) fill(m protoreflect.Message, depth int) {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Struct":
		// Fields of every kind, nested: protovalidate finds nothing to
		// check in them, with or without the Go checks.
		s := m.Interface().(*structpb.Struct)
		s.Fields = map[string]*structpb.Value{}
		for i := range g.rnd.IntN(4) {
			s.Fields[g.pick(otherStrings)+strconv.Itoa(i)] = g.value(depth)
		}
		return
	case "google.protobuf.Value", "google.protobuf.ListValue":
		return // empty
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if g.rnd.IntN(3) == 0 {
			continue // left unset
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				m.Mutable(fd).Map().Set(protoreflect.ValueOfString(g.pick(otherStrings)).MapKey(), g.scalar(fd.MapValue()))
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range g.rnd.IntN(3) {
				if fd.Message() != nil {
					if depth < 3 {
						e := l.NewElement()
						g.fill(e.Message(), depth+1)
						l.Append(e)
					}
				} else {
					l.Append(g.scalar(fd))
				}
			}
		case fd.Message() != nil:
			if depth < 3 {
				g.fill(m.Mutable(fd).Message(), depth+1)
			}
		default:
			m.Set(fd, g.scalar(fd))
		}
	}
}

// value is a Struct's value of any kind, a list or an object below depth 3.
func (g requestMaker) value(depth int) *structpb.Value {
	switch n := g.rnd.IntN(6); {
	case n == 0:
		return structpb.NewNullValue()
	case n == 1:
		return structpb.NewBoolValue(true)
	case n == 2:
		return structpb.NewNumberValue(-0.5)
	case n == 3 || depth >= 3:
		return structpb.NewStringValue(g.pick(otherStrings))
	case n == 4:
		return structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{g.value(depth + 1), g.value(depth + 1)}})
	default:
		v := structpb.NewStructValue(&structpb.Struct{})
		g.fill(v.GetStructValue().ProtoReflect(), depth+1)
		return v
	}
}

func (g requestMaker) pick(vals []string) string { return vals[g.rnd.IntN(len(vals))] }

func (g requestMaker) scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if f, ok := g.shared[fd]; ok {
			for g.rnd.IntN(4) != 0 {
				if v := g.pick(g.values); f.sharedAccepts(v) {
					return protoreflect.ValueOfString(v)
				}
			}
			return protoreflect.ValueOfString(g.pick(g.values))
		}
		return protoreflect.ValueOfString(g.pick(otherStrings))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(g.pick(otherStrings)))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(g.rnd.IntN(2) == 0)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber([]int{0, 1, 2, 99}[g.rnd.IntN(4)]))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32([]int{-1, 0, 1, 50, 1 << 20}[g.rnd.IntN(5)]))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64([]int{-1, 0, 1, 50, 1 << 40}[g.rnd.IntN(5)]))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32([]int{0, 1, 50, 1 << 20}[g.rnd.IntN(4)]))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64([]int{0, 1, 50, 1 << 40}[g.rnd.IntN(4)]))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64([]float64{-1, 0, 0.5, 1e9}[g.rnd.IntN(4)])
	}
	return fd.Default()
}

// The messages whose fields protovalidate is told to leave out hold no
// rule anywhere: none of their own, and every message they hold is one of
// them. A registration's params (Struct, Value, ListValue) are among them,
// or checking a registration walks its params again.
func TestRuleFreeMessagesHoldNoRule(t *testing.T) {
	descs := requestDescriptors()
	free := map[protoreflect.FullName]bool{}
	for _, md := range ruleFree(descs) {
		free[md.FullName()] = true
	}
	for _, md := range ruleFree(descs) {
		if hasOwnRules(md) {
			t.Errorf("%s states a rule", md.FullName())
		}
		fields := md.Fields()
		for i := range fields.Len() {
			if m := fieldMessage(fields.Get(i)); m != nil && !free[m.FullName()] {
				t.Errorf("%s holds %s, which has rules", md.FullName(), m.FullName())
			}
		}
	}
	for _, want := range []protoreflect.FullName{"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"} {
		if !free[want] {
			t.Errorf("%s is not found free of rules", want)
		}
	}
	for _, d := range descs {
		if free[d.FullName()] && hasOwnRules(d) {
			t.Errorf("request %s has rules but is taken as free of them", d.FullName())
		}
	}
	t.Logf("free of rules: %d message types", len(free))
}

// FuzzGoChecksChangeNoAnswer decodes arbitrary bytes into a request of one
// of the RPCs (chosen by rpc): the validator, its Go checks first, must
// answer as protovalidate alone does (the same field and words, or none).
// The seeds are random requests of every kind.
func FuzzGoChecksChangeNoAnswer(f *testing.F) {
	rules, err := compiledRules()
	if err != nil {
		f.Fatal(err)
	}
	alone := &requestValidator{v: rules.v}
	types := requestMessageTypes(f)
	g := requestMaker{rnd: rand.New(rand.NewPCG(3, 4)), values: sharedRuleValues()}
	for i, mt := range types {
		for range 4 {
			m := mt.New()
			g.fill(m, 0)
			b, err := proto.Marshal(m.Interface())
			if err != nil {
				f.Fatal(err)
			}
			f.Add(uint8(i), b)
		}
	}
	f.Fuzz(func(t *testing.T, rpc uint8, data []byte) {
		mt := types[int(rpc)%len(types)]
		req := mt.New().Interface()
		if err := proto.Unmarshal(data, req); err != nil {
			return
		}
		if got, want := rules.validate(req), alone.validate(req); !sameRefusal(got, want) {
			t.Fatalf("%s %v:\n got %v\nwant %v", mt.Descriptor().FullName(), req, got, want)
		}
	})
}
