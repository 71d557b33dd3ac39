package server

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/intent"
)

// canonicalParams reads a Struct in place, and must give what
// canonicalizing its AsMap gives, to the byte and to the refusal: the
// fingerprints of stored intents were taken that way.
func TestCanonicalParamsReadTheStructAsAsMap(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	deep := structpb.NewStringValue("bottom")
	for range intent.MaxDepth + 1 {
		deep = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{deep}})
	}
	cases := []*structpb.Struct{
		nil,
		{},
		{Fields: map[string]*structpb.Value{"nil value": nil, "no kind": {}}},
		{Fields: map[string]*structpb.Value{
			"nan": structpb.NewNumberValue(math.NaN()), "inf": structpb.NewNumberValue(math.Inf(1)),
			"-inf": structpb.NewNumberValue(math.Inf(-1)), "zero": structpb.NewNumberValue(math.Copysign(0, -1)),
		}},
		{Fields: map[string]*structpb.Value{"big": structpb.NewNumberValue(1 << 53)}},
		{Fields: map[string]*structpb.Value{"typed nils": {Kind: (*structpb.Value_StringValue)(nil)}, "s": {Kind: (*structpb.Value_StructValue)(nil)},
			"l": {Kind: (*structpb.Value_ListValue)(nil)}, "n": {Kind: (*structpb.Value_NumberValue)(nil)}, "b": {Kind: (*structpb.Value_BoolValue)(nil)}}},
		{Fields: map[string]*structpb.Value{"empty struct": {Kind: &structpb.Value_StructValue{}}, "empty list": {Kind: &structpb.Value_ListValue{}}}},
		{Fields: map[string]*structpb.Value{"bad \xff key": structpb.NewBoolValue(true)}},
		{Fields: map[string]*structpb.Value{"v": structpb.NewStringValue("bad \xff value")}},
		{Fields: map[string]*structpb.Value{"deep": deep}},
		{Fields: map[string]*structpb.Value{"huge": structpb.NewStringValue(strings.Repeat("x", intent.MaxParamsBytes))}},
	}
	for range 2000 {
		cases = append(cases, randomStruct(rnd, 0))
	}
	for i, s := range cases {
		want, werr := intent.Canonical(s.AsMap())
		got, gerr := canonicalParams("", s)
		if string(got) != string(want) || !sameInvalid(gerr, werr) {
			t.Errorf("case %d: %v\n got %q, %v\nwant %q, %v", i, s, got, gerr, want, werr)
		}
	}
}

func sameInvalid(a, b error) bool {
	var ia, ib *intent.InvalidError
	if errors.As(a, &ia) && errors.As(b, &ib) {
		return *ia == *ib
	}
	return a == nil && b == nil
}

// randomStruct is an object of up to five members of every kind, nested.
func randomStruct(rnd *rand.Rand, depth int) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range rnd.IntN(6) {
		s.Fields[[]string{"a", "B", "é", "unit price", "0x", "ünï", "\u2028"}[rnd.IntN(7)]+strconv.Itoa(i)] = randomValue(rnd, depth+1)
	}
	return s
}

func randomValue(rnd *rand.Rand, depth int) *structpb.Value {
	switch n := rnd.IntN(8); {
	case n == 0:
		return structpb.NewNullValue()
	case n == 1:
		return structpb.NewBoolValue(rnd.IntN(2) == 0)
	case n == 2:
		return structpb.NewNumberValue([]float64{0, -1.5, 1e21, 1e-7, 123456789.125, 1<<53 - 1, -(1 << 53), 0.1}[rnd.IntN(8)])
	case n == 3 || depth > 4:
		return structpb.NewStringValue([]string{"", "x", "\"\\\n\t\x01", "日本", "\u2028</script>"}[rnd.IntN(5)])
	case n == 4:
		l := &structpb.ListValue{}
		for range rnd.IntN(4) {
			l.Values = append(l.Values, randomValue(rnd, depth+1))
		}
		return structpb.NewListValue(l)
	default:
		return structpb.NewStructValue(randomStruct(rnd, depth))
	}
}

// BenchmarkCanonicalParams: a registration's params made canonical, for
// its fingerprint (every Acquire with a registration, every Register).
func BenchmarkCanonicalParams(b *testing.B) {
	params, err := structpb.NewStruct(map[string]any{"item": "desk lamp", "quantity": 1, "merchant": "M", "max_amount": "89.00", "currency": "EUR",
		"ship_to": map[string]any{"city": "Lyon", "zip": "69002"}, "tags": []any{"office", "lighting"}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := canonicalParams("", params); err != nil {
			b.Fatal(err)
		}
	}
}
