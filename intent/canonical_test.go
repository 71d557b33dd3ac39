package intent

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

// The canonical outputs below were checked against ECMAScript
// (JSON.stringify in Node 20), which RFC 8785 takes as its reference.

func TestCanonicalJSONNumbers(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"40", "40"},
		{"40.0", "40"},
		{"40.00", "40"},
		{"4e1", "40"},
		{"4E+1", "40"},
		{"400e-1", "40"},
		{"0.4e2", "40"},
		{"100", "100"},
		{"1234.5e-2", "12.345"},
		{"-1.5", "-1.5"},
		{"0.1", "0.1"},
		{"0.30000000000000004", "0.30000000000000004"},
		{"-0", "0"},
		{"-0.0", "0"},
		{"0e10", "0"},
		{"9007199254740991", "9007199254740991"},
		{"-9007199254740991", "-9007199254740991"},
		{"9007199254740991.0", "9007199254740991"},
		{"90071992547409.91e2", "9007199254740991"},
		{"4503599627370495.5", "4503599627370495.5"},
		{"1e-5", "0.00001"},
		{"1e-6", "0.000001"},
		{"0.000001234", "0.000001234"},
		{"1e-7", "1e-7"},
		{"-1e-7", "-1e-7"},
		{"1.5e-7", "1.5e-7"},
		{"5e-324", "5e-324"},
		{"0e-400", "0"},
		{"-0e999999999999999999999", "0"},
	}
	for _, tt := range tests {
		got, err := CanonicalJSON([]byte(tt.in))
		if err != nil {
			t.Errorf("CanonicalJSON(%s) error: %v", tt.in, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("CanonicalJSON(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

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

func TestCanonicalJSONStrings(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{`"\u00e9"`, `"é"`},
		{`"\u00E9"`, `"é"`},
		{`"\/"`, `"/"`},
		{`"\u001F\u001f"`, `"\u001f\u001f"`},
		{`"\u0000"`, `"\u0000"`},
		{`"\u0008\u0009\u000a\u000c\u000d"`, `"\b\t\n\f\r"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\uD83D\uDE00"`, `"😀"`},
		{`"\u007f"`, "\"\x7f\""},
		{`"\u20ac"`, `"€"`},
		{`"\"\\"`, `"\"\\"`},
	}
	for _, tt := range tests {
		got, err := CanonicalJSON([]byte(tt.in))
		if err != nil {
			t.Errorf("CanonicalJSON(%s) error: %v", tt.in, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("CanonicalJSON(%s) = %s, want %s", tt.in, got, tt.want)
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

func TestCanonicalJSONRejects(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	tests := []struct {
		name, in string
		reason   string // a part of the error's reason
	}{
		{"duplicate key", `{"a":1,"a":1}`, `duplicate object key "a"`},
		{"duplicate key after unescaping", `{"a":1,"\u0061":2}`, `duplicate object key "a"`},
		{"nested duplicate key", `{"x":[{"k":1,"j":2,"k":3}]}`, `duplicate object key "k"`},
		{"trailing value", `{} {}`, "after the top-level value"},
		{"trailing number", `1 2`, "after the top-level value"},
		{"trailing bracket", `[1]]`, "after the top-level value"},
		{"trailing garbage", `{}x`, "after the top-level value"},
		{"leading zero", `01`, "after the top-level value"},
		{"empty", ``, "end of input"},
		{"only space", " \n\t", "end of input"},
		{"unclosed object", `{"a":1`, "end of input"},
		{"unclosed string", `"abc`, "end of input"},
		{"trailing comma in array", `[1,]`, "want a JSON value"},
		{"trailing comma in object", `{"a":1,}`, "want a string as object key"},
		{"missing colon", `{"a" 1}`, "want ':'"},
		{"unquoted key", `{a:1}`, "want a string as object key"},
		{"single quotes", `'a'`, "want a JSON value"},
		{"byte order mark", "\ufeff{}", "want a JSON value"},
		{"plus sign", `+1`, "want a JSON value"},
		{"bare point", `.5`, "want a JSON value"},
		{"point without digits", `1.`, "want a digit"},
		{"exponent without digits", `1e+`, "want a digit"},
		{"minus alone", `-`, "want a digit"},
		{"NaN", `NaN`, "want a JSON value"},
		{"Infinity", `-Infinity`, "want a digit"},
		{"short literal", `tru`, "invalid literal"},
		{"raw control character", "\"a\x01\"", "control character 0x01"},
		{"raw newline", "\"a\nb\"", "control character 0x0a"},
		{"unknown escape", `"\x41"`, "want an escape"},
		{"short unicode escape", `"\u12"`, "four hex digits"},
		{"bad unicode escape", `"\u12G4"`, "four hex digits"},
		{"lone high surrogate", `"\ud800"`, `unpaired surrogate \ud800`},
		{"lone low surrogate", `"\udc00"`, `unpaired surrogate \udc00`},
		{"high surrogate then letter", `"\ud83dx"`, `unpaired surrogate \ud83d`},
		{"high surrogate then BMP escape", `"\ud83d\u0041"`, `unpaired surrogate \ud83d`},
		{"two high surrogates", `"\ud83d\ud83d"`, `unpaired surrogate \ud83d`},
		{"invalid UTF-8", "\"\xff\"", "invalid UTF-8"},
		{"encoded surrogate", "\"\xed\xa0\x80\"", "invalid UTF-8"},
		{"invalid UTF-8 in key", "{\"\xc3\":1}", "invalid UTF-8"},
		{"too large a number", `1e400`, "out of the range"},
		{"too small a number", `[-1e400]`, "number -1e400 is out of the range"},
		{"too deep", deep, "nesting is deeper than 32 levels"},
		{"too long", `"` + strings.Repeat(" ", 4*MaxParamsBytes) + `"`, "JSON text is"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalJSON([]byte(tt.in))
			if err == nil {
				t.Fatalf("CanonicalJSON(%+q) = %s, want an error", tt.in, got)
			}
			want := "params"
			if tt.name == "too small a number" {
				want = "params[0]" // the number's path; the other texts are not JSON at all
			}
			field, reason := invalidReason(t, err)
			if field != want {
				t.Errorf("field = %q, want %q", field, want)
			}
			if !strings.Contains(reason, tt.reason) {
				t.Errorf("reason = %q, want it to contain %q", reason, tt.reason)
			}
		})
	}
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

func TestFingerprint(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	}
	for _, tt := range tests {
		if got := Fingerprint([]byte(tt.in)); got != tt.want {
			t.Errorf("Fingerprint(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestDeriveKeyVector pins one derivation so that clients in other languages
// can check theirs against it: SHA-256 of the UTF-8 canonical text, in
// lowercase hex. The canonical text shows number normalization (7.0 is 7),
// key sorting and raw non-ASCII UTF-8.
func TestDeriveKeyVector(t *testing.T) {
	const (
		action    = "create-order"
		canonical = `{"action":"create-order","identity":{"approval_seq":7,"cart":"C-1001","merchant":"möbel-haus"}}`
		key       = "fb51b6bc6b219d7083afc5cc16d54909f051cdd6b8210f31a5da81384163d340"
	)
	identities := []map[string]any{
		{"merchant": "möbel-haus", "cart": "C-1001", "approval_seq": 7.0},
		{"approval_seq": json.Number("7.00"), "cart": "C-1001", "merchant": "m\u00f6bel-haus"},
		{"cart": "C-1001", "merchant": "möbel-haus", "approval_seq": 7},
	}
	for _, identity := range identities {
		gotKey, gotCanonical, err := DeriveKey(action, identity)
		if err != nil {
			t.Fatalf("DeriveKey(%q, %v) error: %v", action, identity, err)
		}
		if string(gotCanonical) != canonical {
			t.Errorf("DeriveKey(%q, %v) canonical = %s, want %s", action, identity, gotCanonical, canonical)
		}
		if gotKey != key {
			t.Errorf("DeriveKey(%q, %v) key = %s, want %s", action, identity, gotKey, key)
		}
		if !derivedKeyForm.MatchString(gotKey) {
			t.Errorf("DeriveKey(%q, %v) key = %s, want 64 lowercase hex digits", action, identity, gotKey)
		}
	}
	if got := Fingerprint([]byte(canonical)); got != key {
		t.Errorf("Fingerprint(canonical) = %s, want %s", got, key)
	}
	// The canonical text is its own canonical form.
	if got, err := CanonicalJSON([]byte(canonical)); err != nil || string(got) != canonical {
		t.Errorf("CanonicalJSON(canonical) = %s, %v, want %s, nil", got, err, canonical)
	}
}

// TestDeriveKeepsTheIdentityHashed: the identity Derive returns is the
// identity's own canonical form, the very bytes inside the text hashed,
// whatever the action's length and the identity's keys (escaped, non-ASCII,
// sorting as UTF-16 does), and its key and text are DeriveKey's.
func TestDeriveKeepsTheIdentityHashed(t *testing.T) {
	for _, tt := range []struct {
		action   string
		identity map[string]any
	}{
		{"refund.issue", map[string]any{"order_id": "ORD-88412", "return_id": "RA-20931"}},
		{"a", map[string]any{"q\"uote": "x\ny", "\u00e9": 1.5, "\U0001F600": []any{true, nil}, "ﬀ": map[string]any{"z": "a", "b": 2}}},
		{strings.Repeat("x", MaxActionLen), map[string]any{"id": "\u202eRTL"}},
	} {
		d, err := Derive(tt.action, tt.identity)
		if err != nil {
			t.Fatalf("Derive(%q, %v): %v", tt.action, tt.identity, err)
		}
		key, canonical, err := DeriveKey(tt.action, tt.identity)
		if err != nil || key != d.Key || !bytes.Equal(canonical, d.Canonical) {
			t.Errorf("DeriveKey(%q) = %s, %s, %v; Derive gave %s, %s", tt.action, key, canonical, err, d.Key, d.Canonical)
		}
		own, err := Canonical(tt.identity)
		if err != nil || !bytes.Equal(d.Identity, own) {
			t.Errorf("Derive(%q).Identity = %s, want Canonical(identity) = %s (%v)", tt.action, d.Identity, own, err)
		}
		if want := `{"action":` + string(appendString(nil, tt.action)) + `,"identity":` + string(d.Identity) + `}`; string(d.Canonical) != want {
			t.Errorf("Derive(%q).Canonical = %s, want %s", tt.action, d.Canonical, want)
		}
	}
	if _, err := Derive("bad action", map[string]any{"a": 1}); err == nil {
		t.Error("Derive with a bad action succeeded")
	}
}

// TestFingerprintVector pins one fingerprint so that clients in other
// languages can check theirs (or the one DeriveKey returns for params)
// against it: SHA-256 of the UTF-8 canonical text of the params, in
// lowercase hex. The canonical text shows number normalization (2.0 is 2),
// key sorting, a decimal kept as a string and raw non-ASCII UTF-8.
func TestFingerprintVector(t *testing.T) {
	const (
		canonical   = `{"currency":"EUR","item":"desk lamp","max_amount":"89.00","merchant":"möbel-haus","quantity":2}`
		fingerprint = "78bd230c4df9a993812929c4b6487678e7ef00ce36d7f96e74407e5456afd8ed"
	)
	spellings := []any{
		map[string]any{"item": "desk lamp", "quantity": 2.0, "merchant": "möbel-haus", "max_amount": "89.00", "currency": "EUR"},
		map[string]any{"quantity": json.Number("2.00"), "currency": "EUR", "merchant": "m\u00f6bel-haus", "item": "desk lamp", "max_amount": "89.00"},
		map[string]any{"max_amount": "89.00", "merchant": "möbel-haus", "currency": "EUR", "quantity": 2, "item": "desk lamp"},
	}
	for _, params := range spellings {
		got, err := Canonical(params)
		if err != nil {
			t.Fatalf("Canonical(%v) error: %v", params, err)
		}
		if string(got) != canonical {
			t.Errorf("Canonical(%v) = %s, want %s", params, got, canonical)
		}
		if fp := Fingerprint(got); fp != fingerprint {
			t.Errorf("Fingerprint(Canonical(%v)) = %s, want %s", params, fp, fingerprint)
		}
	}
	text := ` { "quantity" : 2e0, "item" : "desk\u0020lamp", "max_amount" : "89.00", "currency" : "EUR", "merchant" : "möbel-haus" } `
	if got, err := CanonicalJSON([]byte(text)); err != nil || Fingerprint(got) != fingerprint {
		t.Errorf("CanonicalJSON(%s) = %s, %v; want the fingerprint %s", text, got, err, fingerprint)
	}
}

func TestDeriveKeyDistinguishes(t *testing.T) {
	base, _, err := DeriveKey("refund", map[string]any{"order": "O-1", "rma": "R-1"})
	if err != nil {
		t.Fatal(err)
	}
	others := []struct {
		action   string
		identity map[string]any
	}{
		{"refund", map[string]any{"order": "O-1", "rma": "R-2"}},
		{"refund", map[string]any{"order": "O-1"}},
		{"refund.partial", map[string]any{"order": "O-1", "rma": "R-1"}},
		{"refund", map[string]any{"order": "O-1", "rma": []any{"R-1"}}},
	}
	for _, o := range others {
		got, _, err := DeriveKey(o.action, o.identity)
		if err != nil {
			t.Errorf("DeriveKey(%q, %v) error: %v", o.action, o.identity, err)
			continue
		}
		if got == base {
			t.Errorf("DeriveKey(%q, %v) = %s, the same as for another action or identity", o.action, o.identity, got)
		}
	}
}

func TestDeriveKeyRejects(t *testing.T) {
	ok := map[string]any{"order": "O-1"}
	tests := []struct {
		name     string
		action   string
		identity map[string]any
		field    string
	}{
		{"empty action", "", ok, "action"},
		{"action too long", strings.Repeat("a", MaxActionLen+1), ok, "action"},
		{"action with space", "create order", ok, "action"},
		{"action with slash", "orders/create", ok, "action"},
		{"action non-ASCII", "bestellung-ä", ok, "action"},
		{"nil identity", "refund", nil, "identity"},
		{"empty identity", "refund", map[string]any{}, "identity"},
		{"NaN in identity", "refund", map[string]any{"n": math.NaN()}, "identity.n"},
		{"unsupported type in identity", "refund", map[string]any{"t": struct{}{}}, "identity.t"},
		{"identity too deep", "refund", map[string]any{"x": nested(MaxDepth - 1)}, "identity.x" + strings.Repeat("[0]", MaxDepth-2)},
		{"identity too large", "refund", map[string]any{"x": strings.Repeat("x", MaxParamsBytes)}, "identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, _, err := DeriveKey(tt.action, tt.identity)
			if err == nil {
				t.Fatalf("DeriveKey = %s, want an error", key)
			}
			if field, _ := invalidReason(t, err); field != tt.field {
				t.Errorf("field = %q, want %q", field, tt.field)
			}
		})
	}

	// At the limits.
	if _, _, err := DeriveKey(strings.Repeat("a", MaxActionLen), ok); err != nil {
		t.Errorf("DeriveKey(%d-byte action) error: %v", MaxActionLen, err)
	}
	if _, _, err := DeriveKey("a-Z_0.9:x", map[string]any{"x": nested(MaxDepth - 2)}); err != nil {
		t.Errorf("DeriveKey(identity at the depth limit) error: %v", err)
	}
}

func TestOperationKey(t *testing.T) {
	tests := []struct {
		key, operation, want string
	}{
		{"ord-1", "create-order", "ord-1:create-order"},
		{"fb51b6bc", "authorize-payment", "fb51b6bc:authorize-payment"},
		{"tenant/x:y", "refund", "tenant/x:y:refund"},
	}
	for _, tt := range tests {
		if got := OperationKey(tt.key, tt.operation); got != tt.want {
			t.Errorf("OperationKey(%q, %q) = %q, want %q", tt.key, tt.operation, got, tt.want)
		}
	}
}

// derivedKeyForm is the form of every derived key: a SHA-256 in lowercase
// hex (which the key rule of intent.proto accepts: see package server's
// TestKeyRule).
var derivedKeyForm = regexp.MustCompile(`^[0-9a-f]{64}$`)

func TestValidateTenant(t *testing.T) {
	tests := []struct {
		tenant string
		ok     bool
	}{
		{"a", true},
		{"0", true},
		{DefaultTenant, true},
		{"acme-eu_2", true},
		{"9lives", true},
		{"a-", true},
		{strings.Repeat("t", MaxTenantLen), true},
		{"", false},
		{strings.Repeat("t", MaxTenantLen+1), false},
		{"Acme", false},
		{"acmE", false},
		{"-acme", false},
		{"_acme", false},
		{"acme.eu", false},
		{"acme eu", false},
		{"acme/eu", false},
		{"acmé", false},
	}
	for _, tt := range tests {
		err := ValidateTenant(tt.tenant)
		if tt.ok {
			if err != nil {
				t.Errorf("ValidateTenant(%+q) = %v, want nil", tt.tenant, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("ValidateTenant(%+q) = nil, want an error", tt.tenant)
			continue
		}
		if field, _ := invalidReason(t, err); field != "tenant" {
			t.Errorf("ValidateTenant(%+q) field = %q, want %q", tt.tenant, field, "tenant")
		}
	}
}

// FuzzCanonicalJSON checks that CanonicalJSON's output is valid JSON, is its
// own canonical form, and means what the input meant; and that the parser
// refuses exactly the texts encoding/json refuses, plus those RFC 8785 rules
// out (duplicate keys, unpaired surrogates, invalid UTF-8) and those beyond
// our limits.
func FuzzCanonicalJSON(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		_, perr := parseJSON(in)
		var se *syntaxError
		switch valid := json.Valid(in); {
		case perr == nil && !valid:
			t.Fatalf("parseJSON(%+q) accepted a text encoding/json rejects", in)
		case errors.As(perr, &se) && valid:
			t.Fatalf("parseJSON(%+q) = %v, but encoding/json accepts the text", in, perr)
		}

		out, err := CanonicalJSON(in)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("CanonicalJSON(%+q) error %v is not ErrInvalid", in, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("CanonicalJSON(%+q) = %+q, not valid JSON", in, out)
		}
		again, err := CanonicalJSON(out)
		if err != nil {
			t.Fatalf("CanonicalJSON(%+q) error: %v; it is CanonicalJSON(%+q)", out, err, in)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("CanonicalJSON(%+q) = %+q, want it unchanged; it is CanonicalJSON(%+q)", out, again, in)
		}

		// Same meaning: both decode to equal values (numbers as doubles,
		// so -0 equals 0 and spellings of one double are equal).
		var vin, vout any
		if err := json.Unmarshal(in, &vin); err != nil {
			t.Fatalf("json.Unmarshal(%+q) error: %v", in, err)
		}
		if err := json.Unmarshal(out, &vout); err != nil {
			t.Fatalf("json.Unmarshal(%+q) error: %v", out, err)
		}
		if !reflect.DeepEqual(vin, vout) {
			t.Fatalf("CanonicalJSON(%+q) = %+q, which decodes to %#v, want %#v", in, out, vout, vin)
		}
	})
}
