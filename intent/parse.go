// The JSON parser: CanonicalJSON reads a JSON text into the values the
// encoder takes, numbers kept as their text, refusing what RFC 8785 rules
// out (duplicate keys, unpaired surrogates, invalid UTF-8).

package intent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONTextBytes bounds the JSON text CanonicalJSON reads. Insignificant
// whitespace and long number spellings may make a text longer than its
// canonical form, but not by this much in any honest request.
const maxJSONTextBytes = 4 * MaxParamsBytes

// CanonicalJSON parses the JSON text b and returns its canonical form, as
// Canonical describes it. Numbers are read as their decimal text
// (json.Number), so the text, not an intermediate float of some other
// parser, is what gets normalized, and with the text at hand a number is
// refused, as ExactNumber describes, when canonicalization would change its
// value: 9007199254740993, 0.10000000000000000001 or 1e-400, each of which a
// double holds only as a neighbour (that another text would share).
//
// The text must be one JSON value, optionally surrounded by whitespace, and
// in the I-JSON subset RFC 8785 requires: valid UTF-8, no unpaired surrogate
// escapes such as "\ud800", and no object with the same key twice (after
// unescaping, so "a" and "\u0061" are the same key). Each of these is an
// error rather than a silent choice, since a choice another parser could
// make differently would give another fingerprint for the same text. Texts
// longer than four times MaxParamsBytes are refused before parsing.
// Errors are *InvalidError values naming the field "params" (with the JSON
// path of the value, as for Canonical).
func CanonicalJSON(b []byte) ([]byte, error) {
	if len(b) > maxJSONTextBytes {
		return nil, Invalid(paramsField, "JSON text is %d bytes, more than the limit of %d", len(b), maxJSONTextBytes)
	}
	v, err := parseJSON(b)
	if err != nil {
		return nil, Invalid(paramsField, "%v", err)
	}
	return canonicalize(v, paramsField, paramsField)
}

// numberLen returns the length of the JSON number at the start of s (RFC
// 8259: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), and false if s does
// not start with one. What follows the number is the caller's concern.
func numberLen[T string | []byte](s T) (int, bool) {
	i := 0
	digitsFrom := func(i int) int {
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && '1' <= s[i] && s[i] <= '9':
		i = digitsFrom(i + 1)
	default:
		return i, false
	}
	if i < len(s) && s[i] == '.' {
		j := digitsFrom(i + 1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := digitsFrom(i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

// syntaxError is a text that is not JSON at all, as opposed to JSON that
// breaks a rule of RFC 8785 (a duplicate key, an unpaired surrogate, invalid
// UTF-8) or a limit of ours.
type syntaxError struct {
	offset int
	msg    string
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("JSON syntax error at offset %d: %s", e.offset, e.msg)
}

// parseJSON reads one JSON value into the shapes Canonical takes, with
// numbers as json.Number. It rejects what RFC 8785 rejects: duplicate keys,
// unpaired surrogates, invalid UTF-8. It also enforces MaxDepth, so its
// recursion stays shallow whatever the input.
func parseJSON(data []byte) (any, error) {
	p := &parser{data: data}
	p.skipSpace()
	v, err := p.value()
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos < len(p.data) {
		return nil, p.syntaxf("unexpected %s after the top-level value", describeByte(p.data[p.pos]))
	}
	return v, nil
}

type parser struct {
	data  []byte
	pos   int
	depth int
}

// peek returns the byte at pos, or -1 at the end of the input.
func (p *parser) peek() int {
	if p.pos >= len(p.data) {
		return -1
	}
	return int(p.data[p.pos])
}

func (p *parser) syntaxf(format string, args ...any) error {
	return &syntaxError{offset: p.pos, msg: fmt.Sprintf(format, args...)}
}

// unexpected reports the byte at pos, or the end of the input, as out of
// place where want was expected.
func (p *parser) unexpected(want string) error {
	if p.pos >= len(p.data) {
		return p.syntaxf("unexpected end of input, want %s", want)
	}
	return p.syntaxf("unexpected %s, want %s", describeByte(p.data[p.pos]), want)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value() (any, error) {
	switch c := p.peek(); {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		return p.string()
	case c == '-' || ('0' <= c && c <= '9'):
		n, ok := numberLen(p.data[p.pos:])
		if !ok {
			p.pos += n
			return nil, p.unexpected("a digit in the number")
		}
		v := json.Number(p.data[p.pos : p.pos+n])
		p.pos += n
		return v, nil
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	default:
		return nil, p.unexpected("a JSON value")
	}
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(word)) {
		return p.syntaxf("invalid literal, want %s", word)
	}
	p.pos += len(word)
	return nil
}

// enter steps one level deeper into objects and arrays.
func (p *parser) enter() error {
	p.depth++
	if p.depth > MaxDepth {
		return fmt.Errorf("nesting is deeper than %d levels at offset %d", MaxDepth, p.pos)
	}
	return nil
}

func (p *parser) object() (map[string]any, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	p.pos++ // '{'
	obj := map[string]any{}
	p.skipSpace()
	if p.peek() == '}' {
		p.pos++
		p.depth--
		return obj, nil
	}
	for {
		if p.peek() != '"' {
			return nil, p.unexpected("a string as object key")
		}
		keyAt := p.pos
		k, err := p.string()
		if err != nil {
			return nil, err
		}
		if _, dup := obj[k]; dup {
			return nil, fmt.Errorf("duplicate object key %q at offset %d", k, keyAt)
		}
		p.skipSpace()
		if p.peek() != ':' {
			return nil, p.unexpected("':' after object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		obj[k] = v
		p.skipSpace()
		switch p.peek() {
		case ',':
			p.pos++
			p.skipSpace()
		case '}':
			p.pos++
			p.depth--
			return obj, nil
		default:
			return nil, p.unexpected("',' or '}' after object member")
		}
	}
}

func (p *parser) array() ([]any, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	p.pos++ // '['
	arr := []any{}
	p.skipSpace()
	if p.peek() == ']' {
		p.pos++
		p.depth--
		return arr, nil
	}
	for {
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
		p.skipSpace()
		switch p.peek() {
		case ',':
			p.pos++
			p.skipSpace()
		case ']':
			p.pos++
			p.depth--
			return arr, nil
		default:
			return nil, p.unexpected("',' or ']' after array element")
		}
	}
}

// string reads a JSON string starting at its opening quote.
func (p *parser) string() (string, error) {
	p.pos++ // '"'
	var out []byte
	run := p.pos // p.data[run:p.pos] is pending, copied as is
	for {
		if p.pos >= len(p.data) {
			return "", p.unexpected("'\"' to end the string")
		}
		switch c := p.data[p.pos]; {
		case c == '"':
			out = append(out, p.data[run:p.pos]...)
			p.pos++
			return string(out), nil
		case c == '\\':
			out = append(out, p.data[run:p.pos]...)
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			out = utf8.AppendRune(out, r)
			run = p.pos
		case c < 0x20:
			return "", p.syntaxf("control character 0x%02x in string: escape it", c)
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size == 1 {
				return "", fmt.Errorf("invalid UTF-8 at offset %d", p.pos)
			}
			p.pos += size
		}
	}
}

// escape reads one escape sequence starting at its backslash. A surrogate
// pair, written as two \u escapes, is read as one.
func (p *parser) escape() (rune, error) {
	p.pos++ // '\\'
	c := p.peek()
	p.pos++
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		at := p.pos - 2
		r, err := p.hex4()
		if err != nil {
			return 0, err
		}
		switch {
		case 0xDC00 <= r && r <= 0xDFFF:
			return 0, fmt.Errorf("unpaired surrogate \\u%04x at offset %d", r, at)
		case 0xD800 <= r && r <= 0xDBFF:
			if !bytes.HasPrefix(p.data[p.pos:], []byte(`\u`)) {
				return 0, fmt.Errorf("unpaired surrogate \\u%04x at offset %d", r, at)
			}
			p.pos += 2
			r2, err := p.hex4()
			if err != nil {
				return 0, err
			}
			if r2 < 0xDC00 || r2 > 0xDFFF {
				return 0, fmt.Errorf("unpaired surrogate \\u%04x at offset %d", r, at)
			}
			return utf16.DecodeRune(r, r2), nil
		}
		return r, nil
	}
	p.pos--
	return 0, p.unexpected(`an escape (one of "\/bfnrtu) after '\'`)
}

// hex4 reads the four hex digits of a \u escape.
func (p *parser) hex4() (rune, error) {
	if len(p.data)-p.pos < 4 {
		return 0, p.syntaxf("want four hex digits after \\u")
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, p.syntaxf("want four hex digits after \\u")
		}
		r = r<<4 | rune(d)
	}
	p.pos += 4
	return r, nil
}
