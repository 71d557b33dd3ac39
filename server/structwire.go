package server

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/intentd/intentd/intent"
)

// Stored params and identities are canonical JSON, and an answer carries
// them as a google.protobuf.Struct, whose only use in intentd is to be
// encoded. So they are written from the JSON text straight into the
// Struct's encoding (structFields), as a deterministic Marshal of the
// Struct protojson reads from that text would write it: map entries in
// key order, every number a double. Building the Struct's tree of values
// and encoding it was about 5 µs of a 300-byte object's replay from etcd,
// most of its conversion (docs/PERFORMANCE.md, "Replays beyond the
// cache").

// The field numbers of struct.proto.
const (
	structFieldsNum = 1 // Struct.fields, map<string, Value>
	entryKeyNum     = 1
	entryValueNum   = 2
	valueNullNum    = 1
	valueNumberNum  = 2
	valueStringNum  = 3
	valueBoolNum    = 4
	valueStructNum  = 5
	valueListNum    = 6
	listValuesNum   = 1 // ListValue.values
)

// structFields appends to b the encoding of the Struct read from the JSON
// object text raw (its fields, without a tag or length of its own). It
// reports false for a text that is not one JSON object, is nested deeper
// than canonical JSON may be, or has numbers a double cannot hold: what a
// store never holds short of corruption.
func structFields(b []byte, raw []byte) ([]byte, bool) {
	if b == nil {
		b = make([]byte, 0, len(raw)+len(raw)/2+16)
	}
	p := jsonText{s: raw}
	p.space()
	b, ok := p.object(b, 0)
	p.space()
	return b, ok && p.i == len(p.s)
}

// jsonText reads a JSON text from s, at i.
type jsonText struct {
	s []byte
	i int
}

func (p *jsonText) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

// object reads an object and appends its Struct fields: one map entry
// per member, in key order. A canonical text orders keys by UTF-16 code
// units and an encoding by bytes, which differ only for keys with
// characters past U+FFFF; an object whose keys are not in byte order is
// written again, sorted (sortedObject).
func (p *jsonText) object(b []byte, depth int) ([]byte, bool) {
	if depth > intent.MaxDepth {
		return b, false
	}
	start, written := p.i, len(b)
	var prev []byte
	unsorted := false
	ok := p.members(func(key []byte) bool {
		if prev != nil && bytes.Compare(key, prev) < 0 {
			unsorted = true
			return false
		}
		prev = key
		var ok bool
		b, ok = p.entry(b, key, depth)
		return ok
	})
	if unsorted {
		p.i = start
		return p.sortedObject(b[:written], depth)
	}
	return b, ok
}

// members reads an object, calling member with each key once the text is
// at the key's value, which member reads. It reports whether the object is
// well formed and every call of member succeeded.
func (p *jsonText) members(member func(key []byte) bool) bool {
	if !p.consume('{') {
		return false
	}
	p.space()
	if p.consume('}') {
		return true
	}
	for {
		p.space()
		key, ok := p.str()
		if !ok {
			return false
		}
		p.space()
		if !p.consume(':') {
			return false
		}
		p.space()
		if !member(key) {
			return false
		}
		p.space()
		if p.consume('}') {
			return true
		}
		if !p.consume(',') {
			return false
		}
	}
}

// entry appends a map entry of key and the value read next.
func (p *jsonText) entry(b, key []byte, depth int) ([]byte, bool) {
	b, at := beginNested(b, structFieldsNum)
	b = protowire.AppendTag(b, entryKeyNum, protowire.BytesType)
	b = protowire.AppendBytes(b, key)
	b, inner := beginNested(b, entryValueNum)
	b, ok := p.value(b, depth+1)
	return endNested(endNested(b, inner), at), ok
}

// member is an object member read but not yet written: its key, and where
// its value starts in the text.
type member struct {
	key   []byte
	value int
}

// sortedObject is object for an object whose keys are out of byte order:
// it reads the members first, then writes them sorted.
func (p *jsonText) sortedObject(b []byte, depth int) ([]byte, bool) {
	var list []member
	ok := p.members(func(key []byte) bool {
		list = append(list, member{key, p.i})
		mark := len(b)
		var ok bool
		b, ok = p.value(b, depth+1)
		b = b[:mark] // read past it: written below, in order
		return ok
	})
	if !ok {
		return b, false
	}
	end := p.i
	slices.SortFunc(list, func(x, y member) int { return bytes.Compare(x.key, y.key) })
	for _, m := range list {
		p.i = m.value
		if b, ok = p.entry(b, m.key, depth); !ok {
			return b, false
		}
	}
	p.i = end
	return b, true
}

// value reads one value and appends the fields of its Value.
func (p *jsonText) value(b []byte, depth int) ([]byte, bool) {
	if p.i >= len(p.s) {
		return b, false
	}
	var ok bool
	switch c := p.s[p.i]; {
	case c == '{':
		b, at := beginNested(b, valueStructNum)
		b, ok = p.object(b, depth)
		return endNested(b, at), ok
	case c == '[':
		b, at := beginNested(b, valueListNum)
		b, ok = p.list(b, depth)
		return endNested(b, at), ok
	case c == '"':
		s, ok := p.str()
		b = protowire.AppendTag(b, valueStringNum, protowire.BytesType)
		return protowire.AppendBytes(b, s), ok
	case p.literal("null"):
		b = protowire.AppendTag(b, valueNullNum, protowire.VarintType)
		return protowire.AppendVarint(b, 0), true
	case p.literal("true"):
		b = protowire.AppendTag(b, valueBoolNum, protowire.VarintType)
		return protowire.AppendVarint(b, protowire.EncodeBool(true)), true
	case p.literal("false"):
		b = protowire.AppendTag(b, valueBoolNum, protowire.VarintType)
		return protowire.AppendVarint(b, protowire.EncodeBool(false)), true
	default:
		start := p.i
		for p.i < len(p.s) && strings.IndexByte("+-.0123456789eE", p.s[p.i]) >= 0 {
			p.i++
		}
		if p.i == start {
			return b, false
		}
		f, err := strconv.ParseFloat(unsafe.String(&p.s[start], p.i-start), 64)
		if err != nil {
			return b, false
		}
		b = protowire.AppendTag(b, valueNumberNum, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(f)), true
	}
}

// list reads an array and appends its ListValue's values.
func (p *jsonText) list(b []byte, depth int) ([]byte, bool) {
	if depth > intent.MaxDepth || !p.consume('[') {
		return b, false
	}
	p.space()
	if p.consume(']') {
		return b, true
	}
	for {
		p.space()
		var at int
		var ok bool
		b, at = beginNested(b, listValuesNum)
		b, ok = p.value(b, depth+1)
		if b = endNested(b, at); !ok {
			return b, false
		}
		p.space()
		if p.consume(']') {
			return b, true
		}
		if !p.consume(',') {
			return b, false
		}
	}
}

func (p *jsonText) consume(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *jsonText) literal(word string) bool {
	if len(p.s)-p.i >= len(word) && string(p.s[p.i:p.i+len(word)]) == word {
		p.i += len(word)
		return true
	}
	return false
}

// str reads a string and returns it unescaped: the text itself when it
// holds no escape, as nearly every string of canonical JSON.
func (p *jsonText) str() ([]byte, bool) {
	if !p.consume('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.s) && p.s[p.i] != '"' && p.s[p.i] != '\\' && p.s[p.i] >= 0x20 {
		p.i++
	}
	if p.i < len(p.s) && p.s[p.i] == '"' {
		s := p.s[start:p.i:p.i]
		p.i++
		return s, utf8.Valid(s)
	}
	out := append([]byte(nil), p.s[start:p.i]...)
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return out, utf8.Valid(out)
		case c < 0x20:
			return nil, false
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.s) {
			return nil, false
		}
		esc := p.s[p.i+1]
		p.i += 2
		switch esc {
		case '"', '\\', '/':
			out = append(out, esc)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return nil, false
			}
			if utf16.IsSurrogate(r) {
				if !p.literal(`\u`) {
					return nil, false
				}
				r2, ok := p.hex4()
				if r = utf16.DecodeRune(r, r2); !ok || r == utf8.RuneError {
					return nil, false
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, false
		}
	}
	return nil, false
}

func (p *jsonText) hex4() (rune, bool) {
	if p.i+4 > len(p.s) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.s[p.i:p.i+4]), 16, 16)
	p.i += 4
	return rune(v), err == nil
}

// beginNested appends the tag of field num, holding a message whose length
// is not known yet, and one byte for the length: the common case. It
// returns where the length goes, for endNested.
func beginNested(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return append(b, 0), len(b)
}

// endNested writes the length of the message appended since beginNested
// returned at, moving the message along if its length takes more than the
// one byte kept for it.
func endNested(b []byte, at int) []byte {
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	size := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, size-1)...)
	copy(b[at+size:], b[at+1:at+1+n])
	protowire.AppendVarint(b[at:at], uint64(n))
	return b
}
