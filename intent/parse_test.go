package intent

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
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
