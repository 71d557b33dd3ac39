package intent

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

// The canonical outputs below were checked against ECMAScript
// (JSON.stringify in Node 20), which RFC 8785 takes as its reference.

// TestCanonicalFloat64 uses the number samples of RFC 8785, Appendix B:
// appendNumber writes every one as ECMAScript does, and Canonical writes
// those below 2^53 in magnitude and refuses the others.
func TestCanonicalFloat64(t *testing.T) {
	tests := []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"},
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	}
	for _, tt := range tests {
		f := math.Float64frombits(tt.bits)
		if got := appendNumber(nil, f); string(got) != tt.want {
			t.Errorf("appendNumber(%#016x) = %s, want %s", tt.bits, got, tt.want)
		}
		got, err := Canonical(f)
		switch {
		case math.Abs(f) >= 1<<53:
			if err == nil {
				t.Errorf("Canonical(%#016x) = %s, want an error: 2^53 or more", tt.bits, got)
			}
		case err != nil:
			t.Errorf("Canonical(%#016x) error: %v", tt.bits, err)
		case string(got) != tt.want:
			t.Errorf("Canonical(%#016x) = %s, want %s", tt.bits, got, tt.want)
		}
	}
}

func TestCanonicalGoNumbers(t *testing.T) {
	tests := []struct {
		in   any
		want string
	}{
		{int(40), "40"},
		{int8(-8), "-8"},
		{uint8(255), "255"},
		{int64(1<<53 - 1), "9007199254740991"},
		{int64(-(1<<53 - 1)), "-9007199254740991"},
		{uint64(1<<53 - 1), "9007199254740991"},
		{json.Number("40.00"), "40"},
		{json.Number("-0"), "0"},
	}
	for _, tt := range tests {
		got, err := Canonical(tt.in)
		if err != nil {
			t.Errorf("Canonical(%T %v) error: %v", tt.in, tt.in, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Canonical(%T %v) = %s, want %s", tt.in, tt.in, got, tt.want)
		}
	}
}

func TestCanonicalKeyOrder(t *testing.T) {
	tests := []struct {
		name string
		in   map[string]any
		want string
	}{
		{
			name: "ascii",
			in:   map[string]any{"b": 1.0, "a": 2.0, "B": 3.0, "aa": 4.0, "": 5.0},
			want: `{"":5,"B":3,"a":2,"aa":4,"b":1}`,
		},
		{
			// The sorting example of RFC 8785, section 3.2.3.
			name: "rfc8785",
			in: map[string]any{
				"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
				"1": "One", "\U0001F600": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis",
			},
			want: `{"\r":"Carriage Return","1":"One","` + "\u0080" + `":"Control","` + "\u00f6" + `":"Latin Small Letter O With Diaeresis",` +
				`"` + "\u20ac" + `":"Euro Sign","` + "\U0001F600" + `":"Emoji: Grinning Face","` + "\ufb33" + `":"Hebrew Letter Dalet With Dagesh"}`,
		},
		{
			// UTF-8 byte order would put U+E000 and U+FFFF before the
			// supplementary characters; UTF-16 order puts them after.
			name: "surrogates before private use",
			in:   map[string]any{"\uffff": 1.0, "\ue000": 2.0, "\U00010000": 3.0, "\U0010ffff": 4.0, "\ud7ff": 5.0},
			want: `{"` + "\ud7ff" + `":5,"` + "\U00010000" + `":3,"` + "\U0010ffff" + `":4,"` + "\ue000" + `":2,"` + "\uffff" + `":1}`,
		},
		{
			name: "nested",
			in:   map[string]any{"z": map[string]any{"y": []any{map[string]any{"b": nil, "a": true}}, "x": false}},
			want: `{"z":{"x":false,"y":[{"a":true,"b":null}]}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical(tt.in)
			if err != nil {
				t.Fatalf("Canonical error: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("Canonical = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestCompareUTF16 checks compareUTF16 against comparing the UTF-16
// encodings themselves.
func TestCompareUTF16(t *testing.T) {
	samples := []string{
		"", "a", "ab", "b", "B", "\r", "1", "\u0080", "ö", "€", "\ud7ff", "\ue000", "\ufb33", "\uffff",
		"\U00010000", "\U0001F600", "\U0010ffff", "a\U0001F600", "a\uffff", "\U0001F600a", "\U0001F601",
	}
	for _, a := range samples {
		for _, b := range samples {
			got := compareUTF16(a, b)
			want := slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
			if got != want {
				t.Errorf("compareUTF16(%+q, %+q) = %d, want %d", a, b, got, want)
			}
		}
	}
}

func TestCanonicalStrings(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", `""`},
		{"plain", `"plain"`},
		{`quote " backslash \`, `"quote \" backslash \\"`},
		{"\b\t\n\f\r", `"\b\t\n\f\r"`},
		{"\x00\x01\x0b\x0e\x1f", `"\u0000\u0001\u000b\u000e\u001f"`},
		{"\x1a\x1b", `"\u001a\u001b"`},
		{"a/b", `"a/b"`},
		{"\x7f", "\"\x7f\""},
		{"<a & b>", `"<a & b>"`},
		{"Möbel €5 😀", `"Möbel €5 😀"`},
		{"\u2028\u2029", "\"\u2028\u2029\""},
		{"\ufffd", "\"\ufffd\""},
	}
	for _, tt := range tests {
		got, err := Canonical(tt.in)
		if err != nil {
			t.Errorf("Canonical(%+q) error: %v", tt.in, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Canonical(%+q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestCanonicalStructValueMatchesJSON checks that params arriving as a
// google.protobuf.Struct (AsMap gives float64 numbers) and as JSON text with
// other spacing, key order and number spellings have one canonical form.
func TestCanonicalStructValueMatchesJSON(t *testing.T) {
	asMap := map[string]any{
		"item":     "desk lamp",
		"quantity": float64(1),
		"amount":   map[string]any{"minor": float64(8900), "currency": "EUR"},
		"limit":    float64(89.5),
		"merchant": "M-77",
		"address":  []any{"Hauptstraße 1", "50667 Köln"},
		"gift":     false,
		"note":     nil,
		"tags":     []any{},
	}
	const want = `{"address":["Hauptstraße 1","50667 Köln"],"amount":{"currency":"EUR","minor":8900},` +
		`"gift":false,"item":"desk lamp","limit":89.5,"merchant":"M-77","note":null,"quantity":1,"tags":[]}`
	texts := []string{
		want,
		`{
			"quantity": 1.0,
			"merchant": "M-77",
			"limit": 8.95e1,
			"item": "desk\u0020lamp",
			"amount": { "currency": "EUR", "minor": 8.9E3 },
			"address": [ "Hauptstra\u00dfe 1", "50667 K\u00f6ln" ],
			"note": null, "gift": false, "tags": [ ]
		}`,
		"\r\n{\"tags\":[],\"note\":null,\"gift\":false,\"address\":[\"Hauptstraße 1\",\"50667 Köln\"],\"amount\":{\"minor\":8900.000,\"currency\":\"EUR\"}," +
			"\"limit\":89.50,\"merchant\":\"M\\u002d77\",\"item\":\"desk lamp\",\"quantity\":10e-1}\t ",
	}
	got, err := Canonical(asMap)
	if err != nil {
		t.Fatalf("Canonical(asMap) error: %v", err)
	}
	if string(got) != want {
		t.Errorf("Canonical(asMap) = %s, want %s", got, want)
	}
	for _, text := range texts {
		got, err := CanonicalJSON([]byte(text))
		if err != nil {
			t.Errorf("CanonicalJSON(%s) error: %v", text, err)
			continue
		}
		if string(got) != want {
			t.Errorf("CanonicalJSON(%s) = %s, want %s", text, got, want)
		}
	}

	// encoding/json's decodings, with and without UseNumber, agree too.
	var plain any
	if err := json.Unmarshal([]byte(texts[1]), &plain); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(texts[1]))
	dec.UseNumber()
	var numbers any
	if err := dec.Decode(&numbers); err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{plain, numbers} {
		got, err := Canonical(v)
		if err != nil {
			t.Errorf("Canonical(decoded) error: %v", err)
			continue
		}
		if string(got) != want {
			t.Errorf("Canonical(decoded) = %s, want %s", got, want)
		}
	}
}

// invalidReason returns err's field and reason if it is an *InvalidError.
func invalidReason(t *testing.T, err error) (field, reason string) {
	t.Helper()
	var ie *InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("error %v (%T) is not an *InvalidError", err, err)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false, want true", err)
	}
	return ie.Field, ie.Reason
}

func TestCanonicalRejects(t *testing.T) {
	type custom struct{ A int }
	tests := []struct {
		name   string
		in     any
		field  string
		reason string
	}{
		{"NaN", math.NaN(), "params", "NaN is not a JSON number"},
		{"+Inf", math.Inf(1), "params", "+Inf is not a JSON number"},
		{"-Inf in array", []any{1.0, math.Inf(-1)}, "params[1]", "-Inf is not a JSON number"},
		{"NaN deep", map[string]any{"a": map[string]any{"b c": []any{math.NaN()}}}, `params.a["b c"][0]`, "NaN"},
		{"invalid UTF-8 string", map[string]any{"s": "\xff"}, "params.s", "not valid UTF-8"},
		{"invalid UTF-8 key", map[string]any{"\xff": 1.0}, "params", "not valid UTF-8"},
		{"float32", float32(1.5), "params", "float32 is not a JSON value"},
		{"struct", map[string]any{"x": custom{A: 1}}, "params.x", "intent.custom is not a JSON value"},
		{"string map", map[string]string{"a": "b"}, "params", "map[string]string is not a JSON value"},
		{"hex json.Number", json.Number("0x10"), "params", `"0x10" is not a JSON number`},
		{"empty json.Number", json.Number(""), "params", `"" is not a JSON number`},
		{"json.Number with space", json.Number("1 "), "params", `"1 " is not a JSON number`},
		{"json.Number NaN", json.Number("NaN"), "params", `"NaN" is not a JSON number`},
		{"json.Number out of range", json.Number("-1e309"), "params", "out of the range"},
		{"long odd key", map[string]any{strings.Repeat("k ", 40): math.NaN()}, `params["` + strings.Repeat("k ", 32) + `..."]`, "NaN"},
		{"too large", strings.Repeat("x", MaxParamsBytes-1), "params", "longer than the limit of 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical(tt.in)
			if err == nil {
				t.Fatalf("Canonical = %s, want an error", got)
			}
			field, reason := invalidReason(t, err)
			if field != tt.field {
				t.Errorf("field = %q, want %q", field, tt.field)
			}
			if !strings.Contains(reason, tt.reason) {
				t.Errorf("reason = %q, want it to contain %q", reason, tt.reason)
			}
		})
	}
}

// TestLargeIntegersAreRefusedNotMerged: numbers a double cannot hold apart
// from their neighbours (magnitude 2^53 or more, or, in a JSON text, a value
// canonicalization would change) are refused with the JSON path of the
// number, never rounded into the canonical form of another value.
func TestLargeIntegersAreRefusedNotMerged(t *testing.T) {
	values := []struct {
		name  string
		in    any
		field string
	}{
		{"2^53 as a double", map[string]any{"order_id": float64(1 << 53)}, "params.order_id"},
		{"2^53+1 as a double (arrives as 2^53)", map[string]any{"order_id": float64(1<<53 + 1)}, "params.order_id"},
		{"-2^53", map[string]any{"order_id": -float64(1 << 53)}, "params.order_id"},
		{"1e21", map[string]any{"n": 1e21}, "params.n"},
		{"1e300", map[string]any{"n": 1e300}, "params.n"},
		{"largest double", map[string]any{"n": math.MaxFloat64}, "params.n"},
		{"in an array", map[string]any{"items": []any{map[string]any{"sku": "a"}, map[string]any{"sku": "b"}, map[string]any{"sku": 1e17}}}, "params.items[2].sku"},
		{"int64", map[string]any{"order_id": int64(1<<53 + 1)}, "params.order_id"},
		{"uint64", []any{uint64(math.MaxUint64)}, "params[0]"},
		{"json.Number", map[string]any{"order_id": json.Number("9007199254740993")}, "params.order_id"},
	}
	for _, tt := range values {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical(tt.in)
			if err == nil {
				t.Fatalf("Canonical = %s, want an error", got)
			}
			field, reason := invalidReason(t, err)
			if field != tt.field {
				t.Errorf("field = %q, want %q", field, tt.field)
			}
			if !strings.Contains(reason, "as strings") {
				t.Errorf("reason = %q, want it to say to send such values as strings", reason)
			}
		})
	}

	texts := []struct{ in, field string }{
		{`{"order_id":9007199254740993}`, "params.order_id"},
		{`{"order_id":9007199254740992}`, "params.order_id"},
		{`{"order_id":-9007199254740992}`, "params.order_id"},
		{`{"order_id":123456789012345678}`, "params.order_id"},
		{`{"n":1e21}`, "params.n"},
		{`{"n":1.7976931348623157e308}`, "params.n"},
		{`{"items":[{"sku":1},{"sku":2},{"sku":12345678901234567890}]}`, "params.items[2].sku"},
		// Below 2^53, but not as written: canonicalization would change
		// the value, and another text would share its canonical form.
		{`{"n":9007199254740991.5}`, "params.n"},
		{`{"n":0.10000000000000000001}`, "params.n"},
		{`{"n":1e-400}`, "params.n"},
		{`{"n":2.5e-324}`, "params.n"},
	}
	for _, tt := range texts {
		got, err := CanonicalJSON([]byte(tt.in))
		if err == nil {
			t.Errorf("CanonicalJSON(%s) = %s, want an error", tt.in, got)
			continue
		}
		field, reason := invalidReason(t, err)
		if field != tt.field || !strings.Contains(reason, "as strings") {
			t.Errorf("CanonicalJSON(%s): field %q, reason %q; want field %q and a reason that says to send it as a string", tt.in, field, reason, tt.field)
		}
	}

	// The largest magnitude accepted, and the key it derives, distinct
	// from its neighbour's.
	a, _, errA := DeriveKey("ship", map[string]any{"order_id": float64(1<<53 - 1)})
	b, _, errB := DeriveKey("ship", map[string]any{"order_id": float64(1<<53 - 2)})
	if errA != nil || errB != nil || a == b {
		t.Errorf("DeriveKey of 2^53-1 and 2^53-2 = %s, %v and %s, %v; want two distinct keys", a, errA, b, errB)
	}
	for _, id := range []float64{1<<53 + 1, 1 << 53} {
		if key, _, err := DeriveKey("ship", map[string]any{"order_id": id}); err == nil {
			t.Errorf("DeriveKey(order_id %v) = %s, want an error", id, key)
		} else if field, _ := invalidReason(t, err); field != "identity.order_id" {
			t.Errorf("DeriveKey(order_id %v): field %q, want %q", id, field, "identity.order_id")
		}
	}
}

func TestExactNumber(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"40", 40, true},
		{"40.000", 40, true},
		{"4e1", 40, true},
		{"400E-1", 40, true},
		{"0.1", 0.1, true},
		{"-0", 0, true},
		{"0.000e-999999999999", 0, true},
		{"9007199254740991", 1<<53 - 1, true},
		{"-9007199254740991", -(1<<53 - 1), true},
		{"9007199254740992", 0, false},
		{"9007199254740993", 0, false},
		{"0.1000000000000000055511151231257827021181583404541015625", 0, false}, // 0.1's exact binary value: written back as 0.1
		{"1e-999999999999", 0, false},
		{"1e400", 0, false},
		{"01", 0, false},
		{"1.", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, err := ExactNumber(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ExactNumber(%q) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

// nested returns depth arrays, one inside the other, around 1.
func nested(depth int) any {
	var v any = 1.0
	for range depth {
		v = []any{v}
	}
	return v
}

func TestCanonicalDepthLimit(t *testing.T) {
	for _, tt := range []struct {
		depth int
		ok    bool
	}{
		{1, true},
		{MaxDepth, true},
		{MaxDepth + 1, false},
	} {
		text := strings.Repeat("[", tt.depth) + "1" + strings.Repeat("]", tt.depth)
		gotV, errV := Canonical(nested(tt.depth))
		gotJ, errJ := CanonicalJSON([]byte(text))
		if tt.ok {
			if errV != nil || errJ != nil {
				t.Errorf("depth %d: Canonical error %v, CanonicalJSON error %v, want none", tt.depth, errV, errJ)
				continue
			}
			if string(gotV) != text || string(gotJ) != text {
				t.Errorf("depth %d: Canonical = %s, CanonicalJSON = %s, want %s", tt.depth, gotV, gotJ, text)
			}
			continue
		}
		for _, err := range []error{errV, errJ} {
			if err == nil {
				t.Errorf("depth %d: got no error, want one", tt.depth)
				continue
			}
			if _, reason := invalidReason(t, err); !strings.Contains(reason, "nesting is deeper than 32 levels") {
				t.Errorf("depth %d: reason = %q, want it to name the depth limit", tt.depth, reason)
			}
		}
	}

	// A map that contains itself is caught by the same limit.
	loop := map[string]any{}
	loop["self"] = loop
	if _, err := Canonical(loop); err == nil {
		t.Errorf("Canonical(self-containing map) got no error, want one")
	}
}

func TestCanonicalSizeLimit(t *testing.T) {
	// A string of n bytes needing no escape has a canonical form of n+2.
	atLimit := strings.Repeat("x", MaxParamsBytes-2)
	got, err := Canonical(atLimit)
	if err != nil {
		t.Fatalf("Canonical(%d bytes) error: %v", len(atLimit), err)
	}
	if len(got) != MaxParamsBytes {
		t.Errorf("len(Canonical) = %d, want %d", len(got), MaxParamsBytes)
	}
	text := []byte(`  "` + atLimit + `"  `)
	if _, err := CanonicalJSON(text); err != nil {
		t.Errorf("CanonicalJSON(%d bytes) error: %v", len(text), err)
	}

	overLimit := atLimit + "x"
	if got, err := Canonical(overLimit); err == nil {
		t.Errorf("Canonical(%d bytes) = %d bytes, want an error", len(overLimit), len(got))
	}
	if got, err := CanonicalJSON([]byte(`"` + overLimit + `"`)); err == nil {
		t.Errorf("CanonicalJSON(%d bytes) = %d bytes, want an error", len(overLimit)+2, len(got))
	}
	// Escapes count as they are written in canonical form.
	escaped := strings.Repeat("\x01", MaxParamsBytes/6+1)
	if got, err := Canonical(escaped); err == nil {
		t.Errorf("Canonical(%d control characters) = %d bytes, want an error", len(escaped), len(got))
	}
}

func TestCanonicalNilContainers(t *testing.T) {
	tests := []struct {
		in   any
		want string
	}{
		{nil, "null"},
		{map[string]any(nil), "null"},
		{[]any(nil), "null"},
		{map[string]any{}, "{}"},
		{[]any{}, "[]"},
	}
	for _, tt := range tests {
		got, err := Canonical(tt.in)
		if err != nil {
			t.Errorf("Canonical(%#v) error: %v", tt.in, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Canonical(%#v) = %s, want %s", tt.in, got, tt.want)
		}
	}
}
