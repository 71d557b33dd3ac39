// The RFC 8785 (JCS) encoder: Canonical writes a decoded JSON value in the
// canonical form that fingerprints and derived keys hash (key order, string
// escapes, number spelling, the 2^53 rule), naming the JSON path of what it
// refuses.

package intent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// paramsField is the request field Canonical and CanonicalJSON name in their
// errors: approved terms are what they canonicalize most.
const paramsField = "params"

// Canonical returns the canonical JSON encoding of v, the form intentd hashes
// into fingerprints and derived keys. Two values that mean the same JSON have
// the same canonical form, whatever their key order, spacing or number
// spelling, so the bytes (and their SHA-256) can be compared across
// processes and languages.
//
// v is a value as encoding/json decodes into an any (map[string]any, []any,
// string, float64, json.Number, bool, nil) or as structpb's AsMap and
// AsSlice return (the same shapes, with float64 numbers). For convenience Go
// integer types are accepted as numbers too. A nil map or slice encodes as
// null, as encoding/json does. An object or array held in another form (a
// protobuf Struct, as a request carries params) may come as an Object or
// an Array, walked where it is instead of converted first. Other types are
// an error.
//
// The canonical form is the JSON Canonicalization Scheme of RFC 8785 (JCS):
//
//   - no insignificant whitespace;
//   - object members sorted by key, comparing keys as sequences of UTF-16
//     code units (what JavaScript's default sort does), not as UTF-8 bytes;
//   - strings as ECMAScript's JSON.stringify writes them: '"' and '\' escaped
//     with a backslash, U+0008, U+0009, U+000A, U+000C and U+000D as \b, \t,
//     \n, \f and \r, the other characters below U+0020 as \u00xx with
//     lowercase hex, and everything else ('/', DEL, non-ASCII) as raw UTF-8.
//     Strings and keys must be valid UTF-8;
//   - numbers as IEEE 754 doubles written the way ECMAScript's
//     Number.prototype.toString writes them: the shortest digits that read
//     back as the same double, plain notation from 1e-6 up to below 1e21,
//     exponent notation ("1e+21", "1e-7") outside it. So 40, 40.0, 40.00
//     and 4e1 all become 40, and -0 becomes 0. NaN and infinities are not
//     JSON and are an error, as is a json.Number that does not parse as a
//     finite double.
//
// Every number is a double, and beyond 2^53 (9007199254740992) doubles
// cannot tell neighbouring integers apart: 9007199254740993 arrives as
// 9007199254740992, so two different orders would share one canonical form,
// one fingerprint, one derived key, and become one intent. Numbers of
// magnitude 2^53 or more are therefore refused, never rounded: the range
// accepted is the one I-JSON (RFC 7493, section 2.2) calls interoperable,
// -(2^53-1) to 2^53-1. Every double that large is an integer, so the rule
// covers 1e21 and 1e300 alike; fractions are only possible below it. (The
// canonical spelling of the numbers accepted is still RFC 8785's, so any JCS
// implementation computes the same fingerprint; they only never see a number
// it would write in exponent notation above 1e21.) Send identifiers, large
// amounts and exact decimals as strings; amounts in minor units (cents) fit.
//
// Nesting deeper than MaxDepth and canonical forms longer than MaxParamsBytes
// are refused. Errors are *InvalidError values whose field is "params"
// followed by the JSON path of the offending value, such as
// params.items[2].price or params["unit price"] (just "params" for the size
// limit), so that a client can find it in what it sent.
func Canonical(v any) ([]byte, error) {
	return canonicalize(v, paramsField, paramsField)
}

// canonicalize is Canonical with the names its errors use: root names the
// top-level value in a path (empty when the value's members are themselves
// request fields), field names the whole value, for the size limit.
func canonicalize(v any, root, field string) ([]byte, error) {
	e := &encoder{root: root}
	if err := e.value(v, 0); err != nil {
		var ie *InvalidError
		if errors.As(err, &ie) {
			return nil, err
		}
		return nil, Invalid(field, "%v", err)
	}
	if len(e.buf) > MaxParamsBytes {
		return nil, Invalid(field, "%v", errTooLarge)
	}
	return e.buf, nil
}

var errTooLarge = fmt.Errorf("canonical form is longer than the limit of %d bytes", MaxParamsBytes)

// encoder writes the canonical form of a decoded JSON value. path records
// where it is, under root, for error messages only.
type encoder struct {
	buf  []byte
	root string
	path []pathElem
}

// An Object is a JSON object held in another form than a map[string]any,
// which Canonical reads in place: converting a request's Struct of params
// into maps only to encode them was most of what canonicalizing them cost.
type Object interface {
	// Len is the number of members.
	Len() int
	// Keys appends the object's keys to dst, in any order.
	Keys(dst []string) []string
	// Member is the value of key, as Canonical takes values.
	Member(key string) any
}

// An Array is a JSON array held in another form than a []any, which
// Canonical reads in place.
type Array interface {
	Len() int
	// Elem is the i-th element, as Canonical takes values.
	Elem(i int) any
}

// pathElem is one step into a value: an object key, or an array index when
// key is unset.
type pathElem struct {
	key   string
	index int
	isKey bool
}

// maxPathKeyLen bounds how much of one object key a path repeats: the path
// travels back in an error, and a key may be as long as the params.
const maxPathKeyLen = 64

// errorf returns an *InvalidError naming the value the encoder is at by its
// path, such as params.items[2].price.
func (e *encoder) errorf(format string, args ...any) error {
	var b strings.Builder
	b.WriteString(e.root)
	for _, p := range e.path {
		step := "[" + strconv.Itoa(p.index) + "]"
		if p.isKey {
			step = PathKey(p.key)
		}
		if b.Len() == 0 {
			step = strings.TrimPrefix(step, ".")
		}
		b.WriteString(step)
	}
	return Invalid(b.String(), format, args...)
}

// PathKey spells the step into an object member named key, as the paths in
// intentd's errors do: ".key" for a key of ASCII letters, digits, '_' and
// '-' that does not start with a digit, else a quoted subscript ("[\"unit
// price\"]", printable and valid UTF-8 whatever key holds, cut short past
// 64 bytes).
func PathKey(key string) string {
	if isPathName(key) {
		return "." + key
	}
	if len(key) > maxPathKeyLen {
		key = key[:maxPathKeyLen] + "..."
	}
	return "[" + strconv.Quote(key) + "]"
}

// isPathName reports whether key can be written as .key in a path.
func isPathName(key string) bool {
	if key == "" || ('0' <= key[0] && key[0] <= '9') {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; !isASCIIAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// value appends the canonical form of v, found at nesting depth depth (0 for
// the top-level value).
func (e *encoder) value(v any, depth int) error {
	if len(e.buf) > MaxParamsBytes {
		// Stop early: the caller reports errTooLarge.
		return errTooLarge
	}
	switch v := v.(type) {
	case nil:
		e.buf = append(e.buf, "null"...)
	case bool:
		e.buf = strconv.AppendBool(e.buf, v)
	case string:
		return e.string(v)
	case float64:
		return e.number(v)
	case json.Number:
		return e.jsonNumber(v)
	case int:
		return e.integer(int64(v))
	case int8:
		return e.integer(int64(v))
	case int16:
		return e.integer(int64(v))
	case int32:
		return e.integer(int64(v))
	case int64:
		return e.integer(int64(v))
	case uint:
		return e.unsigned(uint64(v))
	case uint8:
		return e.unsigned(uint64(v))
	case uint16:
		return e.unsigned(uint64(v))
	case uint32:
		return e.unsigned(uint64(v))
	case uint64:
		return e.unsigned(uint64(v))
	case map[string]any:
		if v == nil {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		return e.object(mapObject(v), depth+1)
	case []any:
		if v == nil {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		return array(e, sliceArray(v), depth+1)
	case Object:
		return e.object(v, depth+1)
	case Array:
		return array(e, v, depth+1)
	default:
		return e.errorf("%T is not a JSON value (use map[string]any, []any, string, float64, json.Number, bool or nil)", v)
	}
	return nil
}

// mapObject and sliceArray are the Object and Array of encoding/json's
// shapes.
type (
	mapObject  map[string]any
	sliceArray []any
)

func (m mapObject) Keys(dst []string) []string {
	for k := range m {
		dst = append(dst, k)
	}
	return dst
}

func (m mapObject) Len() int              { return len(m) }
func (m mapObject) Member(key string) any { return m[key] }
func (a sliceArray) Len() int             { return len(a) }
func (a sliceArray) Elem(i int) any       { return a[i] }

func (e *encoder) object(m Object, depth int) error {
	if depth > MaxDepth {
		return e.errorf("nesting is deeper than %d levels", MaxDepth)
	}
	keys := m.Keys(make([]string, 0, m.Len()))
	for _, k := range keys {
		if !utf8.ValidString(k) {
			return e.errorf("object key %q is not valid UTF-8", k)
		}
	}
	slices.SortFunc(keys, compareUTF16)
	e.buf = append(e.buf, '{')
	for i, k := range keys {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		e.buf = appendString(e.buf, k)
		e.buf = append(e.buf, ':')
		e.path = append(e.path, pathElem{key: k, isKey: true})
		if err := e.value(m.Member(k), depth); err != nil {
			return err
		}
		e.path = e.path[:len(e.path)-1]
	}
	e.buf = append(e.buf, '}')
	return nil
}

// array is generic so that a []any reaches it unboxed.
func array[A Array](e *encoder, a A, depth int) error {
	if depth > MaxDepth {
		return e.errorf("nesting is deeper than %d levels", MaxDepth)
	}
	e.buf = append(e.buf, '[')
	for i := range a.Len() {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		e.path = append(e.path, pathElem{index: i})
		if err := e.value(a.Elem(i), depth); err != nil {
			return err
		}
		e.path = e.path[:len(e.path)-1]
	}
	e.buf = append(e.buf, ']')
	return nil
}

func (e *encoder) string(s string) error {
	if !utf8.ValidString(s) {
		return e.errorf("string %q is not valid UTF-8", s)
	}
	e.buf = appendString(e.buf, s)
	return nil
}

// maxExactInteger is 2^53: from here on a double cannot hold every
// integer, so a number of this magnitude or more may stand for another.
const maxExactInteger = 1 << 53

func (e *encoder) number(f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return e.errorf("%v is not a JSON number", f)
	}
	if math.Abs(f) >= maxExactInteger {
		return e.errorf("%s", errBeyondDouble(string(appendNumber(nil, f))))
	}
	e.buf = appendNumber(e.buf, f)
	return nil
}

// integer encodes a Go integer, refused from 2^53 on like any number (and
// named as given, not as the double it would round to).
func (e *encoder) integer(n int64) error {
	if n >= maxExactInteger || n <= -maxExactInteger {
		return e.errorf("%s", errBeyondDouble(strconv.FormatInt(n, 10)))
	}
	return e.number(float64(n))
}

func (e *encoder) unsigned(n uint64) error {
	if n >= maxExactInteger {
		return e.errorf("%s", errBeyondDouble(strconv.FormatUint(n, 10)))
	}
	return e.number(float64(n))
}

func (e *encoder) jsonNumber(n json.Number) error {
	f, err := ExactNumber(string(n))
	if err != nil {
		return e.errorf("%v", err)
	}
	return e.number(f)
}

func errBeyondDouble(n string) error {
	return fmt.Errorf("number %s has a magnitude of 2^53 (9007199254740992) or more, where a double cannot tell neighbouring integers apart and two different values could become one intent: send identifiers and large amounts as strings", n)
}

// ExactNumber parses s, a JSON number (RFC 8259), and returns the double
// Canonical writes for it. It refuses, rather than rounds, a number that
// canonicalization would change: one whose value is not that of the double
// written back (9007199254740993 becomes 9007199254740992, 1e-400 becomes
// 0, 0.10000000000000000001 becomes 0.1), and, like Canonical, one of
// magnitude 2^53 or more. So two texts ExactNumber accepts have the same
// canonical form only if they spell the same number. Spellings are free:
// 40, 40.0, 4e1 and 400e-1 are all 40; 0.1 is accepted because 0.1 is what
// its double is written back as.
func ExactNumber(s string) (float64, error) {
	if l, ok := numberLen(s); !ok || l != len(s) {
		return 0, fmt.Errorf("%q is not a JSON number", s)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		// The syntax was checked above, so this is a range error: the
		// magnitude is beyond the largest double.
		return 0, fmt.Errorf("number %s is out of the range of a double", s)
	}
	if math.Abs(f) >= maxExactInteger {
		return 0, errBeyondDouble(s)
	}
	if back := strconv.FormatFloat(f, 'e', -1, 64); !sameDecimal(s, back) {
		return 0, fmt.Errorf("number %s would be canonicalized to %s, another value, which other texts share: a double cannot hold it as written; send identifiers and exact decimals as strings", s, string(appendNumber(nil, f)))
	}
	return f, nil
}

// sameDecimal reports whether a and b, numbers in JSON syntax (b may have
// a '+' exponent sign, as strconv writes it), have the same decimal value.
func sameDecimal(a, b string) bool {
	na, da, ea, oka := decimal(a)
	nb, db, eb, okb := decimal(b)
	if !oka || !okb {
		return false
	}
	if da == "" || db == "" { // zero, whatever its sign
		return da == db
	}
	return na == nb && da == db && ea == eb
}

// decimal splits a number into its sign, its significant digits (no leading
// or trailing zeros; empty for zero) and the exponent e such that the value
// is 0.digits × 10^e. ok is false when the exponent does not fit an int,
// which for a nonzero value no double can match anyway.
func decimal(s string) (neg bool, digits string, exp int, ok bool) {
	if neg = strings.HasPrefix(s, "-"); neg {
		s = s[1:]
	}
	mant, expText, hasExp := strings.Cut(strings.ToLower(s), "e")
	if hasExp {
		var err error
		if exp, err = strconv.Atoi(expText); err != nil {
			return neg, "", 0, strings.Trim(strings.ReplaceAll(mant, ".", ""), "0") == ""
		}
	}
	whole, frac, _ := strings.Cut(mant, ".")
	exp += len(whole)
	digits = whole + frac
	trimmed := strings.TrimLeft(digits, "0")
	exp -= len(digits) - len(trimmed)
	digits = strings.TrimRight(trimmed, "0")
	if digits == "" {
		exp = 0
	}
	return neg, digits, exp, true
}

// compareUTF16 orders strings as RFC 8785 sorts object keys: as sequences of
// UTF-16 code units. It differs from Go's byte order only between characters
// at or above U+E000 inside the BMP, which sort after supplementary
// characters (whose first unit is a surrogate, 0xD800 to 0xDBFF). Both
// strings must be valid UTF-8.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			return cmp.Compare(utf16Rank(ra), utf16Rank(rb))
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// utf16Rank maps a code point to a number that orders code points as their
// UTF-16 encodings order: BMP characters below the surrogates keep their
// value, supplementary characters follow in code point order as their
// surrogate pairs do, and BMP characters from U+E000 come last.
func utf16Rank(r rune) rune {
	switch {
	case r < 0xD800:
		return r
	case r >= 0x10000:
		return 0xD800 + (r - 0x10000) // up to 0x10D7FF
	default:
		return r + 0x100000 // U+E000..U+FFFF after every supplementary
	}
}

const hexDigits = "0123456789abcdef"

// appendString appends s, valid UTF-8, as a JSON string the way
// ECMAScript's JSON.stringify writes it.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0 // s[start:i] is pending, needing no escape
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendNumber appends the finite double f as ECMAScript's
// Number.prototype.toString writes it (ECMA-262, Number::toString, radix
// 10).
func appendNumber(dst []byte, f float64) []byte {
	if f == 0 {
		return append(dst, '0') // both zeros
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	// strconv's shortest 'e' form gives the digits ECMAScript asks for: the
	// fewest that read back as f, the closest to f if several do.
	var tmp [32]byte
	sci := strconv.AppendFloat(tmp[:0], f, 'e', -1, 64) // d[.ddd]e±dd
	mant, exp, _ := bytes.Cut(sci, []byte("e"))
	x, _ := strconv.Atoi(string(exp))
	digits := make([]byte, 0, len(mant))
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	// In ECMA-262's terms f = 0.digits × 10^n, with k digits.
	k, n := len(digits), x+1
	switch {
	case k <= n && n <= 21:
		// An integer below 1e21: the digits, then zeros.
		dst = append(dst, digits...)
		for range n - k {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		// A decimal point inside the digits.
		dst = append(dst, digits[:n]...)
		dst = append(dst, '.')
		dst = append(dst, digits[n:]...)
	case -6 < n && n <= 0:
		// Down to 1e-6: leading zeros after the point.
		dst = append(dst, '0', '.')
		for range -n {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default:
		// Exponent notation, the sign always written.
		dst = append(dst, digits[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if n-1 >= 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, int64(n-1), 10)
	}
	return dst
}
