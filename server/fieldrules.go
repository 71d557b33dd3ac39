package server

// A field's protovalidate rules as a Go check of acceptance (gorules.go
// says why and how it is used). Only the rules intent.proto uses are
// understood: a field whose rules hold anything else (another standard
// rule, a CEL expression of its own but "size(this) > 0", a predefined
// rule of another file, an unknown field) gets no Go check, and
// protovalidate alone checks it. A check may refuse more than its rules do
// (an invalid Duration, a string that is not UTF-8): such a value is then
// checked by protovalidate, whose answer stands. It must never accept a
// value its rules refuse; TestGoChecksAcceptWhatTheirRulesAccept compares
// every check with protovalidate on values about each rule's limits.

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// sharedRuleAccepts says, for each rule of rules.proto by its extension's
// name, whether a value passes its expression. Each alphabet is ASCII, so
// a value made of it has as many bytes as characters.
var sharedRuleAccepts = map[protoreflect.FullName]func(string) bool{
	"intent.v1.tenant": func(s string) bool {
		return s == "" || (len(s) <= 64 && startsWith(s, isLowerAlnum) && all(s[1:], isLowerAlnum, "_-"))
	},
	"intent.v1.key":        charset(256, "._:/=@+-"),
	"intent.v1.session_id": func(s string) bool { return s != "" && len(s) <= 32 && all(s, isHexDigit, "") },
	"intent.v1.action":     charset(128, "._:-"),
	"intent.v1.request_id": atMost(128),
	"intent.v1.reason":     atMost(1024),
	"intent.v1.actor":      atMost(128),
	"intent.v1.label_filter": func(s string) bool {
		if len(s) > 320 || !startsWith(s, isAlnum) {
			return false
		}
		name := 1
		for name < len(s) && name <= 63 && (isAlnum(s[name]) || in(s[name], "._:/-")) {
			name++
		}
		return name <= 63 && name < len(s) && s[name] == '='
	},
	"intent.v1.operation": charset(64, "._-"),
}

// charset accepts 1 to max ASCII letters, digits and the characters of
// extra.
func charset(max int, extra string) func(string) bool {
	return func(s string) bool { return s != "" && len(s) <= max && all(s, isAlnum, extra) }
}

// atMost accepts a value of at most max bytes.
func atMost(max int) func(string) bool {
	return func(s string) bool { return len(s) <= max }
}

func all(s string, class func(byte) bool, extra string) bool {
	for i := range len(s) {
		if !class(s[i]) && !in(s[i], extra) {
			return false
		}
	}
	return true
}

func startsWith(s string, class func(byte) bool) bool { return s != "" && class(s[0]) }

func in(c byte, set string) bool {
	for i := range len(set) {
		if set[i] == c {
			return true
		}
	}
	return false
}

func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }
func isAlnum(c byte) bool      { return isLowerAlnum(c) || 'A' <= c && c <= 'Z' }
func isHexDigit(c byte) bool   { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// checkedField is a field whose every rule is checked in Go.
type checkedField struct {
	fd protoreflect.FieldDescriptor
	// accepts says whether a value passes the field's rules but required
	// and ignore, which decide on an unset field (unsetFails).
	accepts      func(protoreflect.Value) bool
	required     bool
	ignoreIfZero bool
	// shared is the rule of rules.proto the field's rules are, if they
	// are one alone (besides required and ignore), with its check.
	shared        protoreflect.FullName
	sharedAccepts func(string) bool
	// bit is the field's among its message's checked fields (messagePlan).
	bit uint64
}

// unsetFails says whether the field's rules refuse it unset. As
// protovalidate sees it: an unset field with presence (a message, a member
// of a oneof) is checked for required alone, and so is an empty one that
// is ignored if empty; any other (its zero value, an empty list or map)
// is checked as any value.
func (f *checkedField) unsetFails() bool {
	switch {
	case f.required:
		return true
	case f.ignoreIfZero || f.fd.HasPresence():
		return false
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(f.fd.ContainingMessage().FullName())
	if err != nil {
		return true // no empty value to try: protovalidate decides
	}
	return !f.accepts(mt.Zero().Get(f.fd))
}

// sizeNonZero is the one CEL expression of a field's own that a Go check
// stands for.
const sizeNonZero = "size(this) > 0"

// checkedFieldOf returns the Go check of fd's rules, if fd has rules and
// they can all be checked in Go. It fails only for a rule of rules.proto
// that sharedRuleAccepts lacks: a build defect.
func checkedFieldOf(fd protoreflect.FieldDescriptor) (*checkedField, bool, error) {
	rules, _ := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
	if rules == nil {
		return nil, false, nil
	}
	f := &checkedField{fd: fd, required: rules.GetRequired()}
	switch rules.GetIgnore() {
	case validate.Ignore_IGNORE_UNSPECIFIED:
	case validate.Ignore_IGNORE_IF_ZERO_VALUE:
		f.ignoreIfZero = true
	default:
		return nil, false, nil
	}
	rest := proto.CloneOf(rules)
	rest.ClearRequired()
	rest.ClearIgnore()
	accepts, ok, err := valueCheck(fd, rest, !fd.IsList() && !fd.IsMap())
	if !ok || err != nil {
		return nil, false, err
	}
	f.accepts = accepts
	if fd.Kind() == protoreflect.StringKind && !fd.IsList() && !fd.IsMap() && rest.HasString() && len(rest.GetCel()) == 0 {
		f.shared, f.sharedAccepts = sharedRuleOf(rest.GetString())
	}
	return f, true, nil
}

// valueCheck is the check of the rules of a field fd (or of its list's
// items, its map's keys or values: single is then true, fd their
// descriptor), but required and ignore, which the caller has cleared.
func valueCheck(fd protoreflect.FieldDescriptor, rules *validate.FieldRules, single bool) (func(protoreflect.Value) bool, bool, error) {
	var checks []func(protoreflect.Value) bool
	ok := len(rules.ProtoReflect().GetUnknown()) == 0
	var err error
	rules.ProtoReflect().Range(func(d protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		var c func(protoreflect.Value) bool
		switch {
		case d.Name() == "cel":
			c, ok = sizeCheck(fd, v.List(), single)
		case d.ContainingOneof() != nil && d.ContainingOneof().Name() == "type":
			c, ok, err = typedCheck(fd, d.Name(), v.Message(), single)
		default:
			ok = false // cel_expression, and any rule to come
		}
		checks = append(checks, c)
		return ok && err == nil
	})
	if !ok || err != nil {
		return nil, false, err
	}
	return allOf(checks), true, nil
}

// allOf is the check that passes what every one of checks passes.
func allOf[T any](checks []func(T) bool) func(T) bool {
	return func(x T) bool {
		for _, c := range checks {
			if !c(x) {
				return false
			}
		}
		return true
	}
}

// bound is the check of the bound rule named name (lt, lte, gt, gte) at b,
// in the order less; ok is false for any other rule.
func bound[T any](name protoreflect.Name, b T, less func(x, y T) bool) (check func(T) bool, ok bool) {
	switch name {
	case "lt":
		return func(x T) bool { return less(x, b) }, true
	case "lte":
		return func(x T) bool { return !less(b, x) }, true
	case "gt":
		return func(x T) bool { return less(b, x) }, true
	case "gte":
		return func(x T) bool { return !less(x, b) }, true
	}
	return nil, false
}

// sizeCheck stands for the field's own CEL rules, if each is
// sizeNonZero on a value whose size CEL knows: a Struct (its fields), a
// list, a map, a string or bytes.
func sizeCheck(fd protoreflect.FieldDescriptor, cel protoreflect.List, single bool) (func(protoreflect.Value) bool, bool) {
	for i := range cel.Len() {
		if r, _ := cel.Get(i).Message().Interface().(*validate.Rule); r == nil || r.GetExpression() != sizeNonZero {
			return nil, false
		}
	}
	switch {
	case fd.IsList() && !single:
		return func(v protoreflect.Value) bool { return v.List().Len() > 0 }, true
	case fd.IsMap() && !single:
		return func(v protoreflect.Value) bool { return v.Map().Len() > 0 }, true
	case fd.Kind() == protoreflect.StringKind:
		return func(v protoreflect.Value) bool { return v.String() != "" }, true
	case fd.Kind() == protoreflect.BytesKind:
		return func(v protoreflect.Value) bool { return len(v.Bytes()) > 0 }, true
	case fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Struct":
		fields := fd.Message().Fields().ByName("fields")
		return func(v protoreflect.Value) bool { return v.Message().Get(fields).Map().Len() > 0 }, true
	}
	return nil, false
}

// typedCheck is the check of the rules of one type (string, int32,
// repeated …) named name, if they match the field and are all understood.
func typedCheck(fd protoreflect.FieldDescriptor, name protoreflect.Name, rules protoreflect.Message, single bool) (func(protoreflect.Value) bool, bool, error) {
	if len(rules.GetUnknown()) != 0 {
		return nil, false, nil
	}
	switch {
	case name == "repeated" && fd.IsList() && !single:
		return repeatedCheck(fd, rules.Interface().(*validate.RepeatedRules))
	case name == "map" && fd.IsMap() && !single:
		return mapCheck(fd, rules.Interface().(*validate.MapRules))
	case fd.IsList() && !single, fd.IsMap() && !single:
		return nil, false, nil
	}
	switch kind := fd.Kind(); {
	case name == "string" && kind == protoreflect.StringKind:
		c, ok, err := stringCheck(rules.Interface().(*validate.StringRules))
		if !ok || err != nil {
			return nil, false, err
		}
		return func(v protoreflect.Value) bool { return c(v.String()) }, true, nil
	case name == "bytes" && kind == protoreflect.BytesKind:
		return bytesCheck(rules)
	case name == "int32" && kind == protoreflect.Int32Kind, name == "int64" && kind == protoreflect.Int64Kind:
		return numberCheck(rules, func(v protoreflect.Value) int64 { return v.Int() }, func(v protoreflect.Value) int64 { return v.Int() })
	case name == "uint32" && kind == protoreflect.Uint32Kind, name == "uint64" && kind == protoreflect.Uint64Kind:
		return numberCheck(rules, func(v protoreflect.Value) uint64 { return v.Uint() }, func(v protoreflect.Value) uint64 { return v.Uint() })
	case name == "enum" && kind == protoreflect.EnumKind:
		return enumCheck(fd.Enum(), rules)
	case name == "duration" && fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Duration":
		return durationCheck(rules)
	}
	return nil, false, nil
}

// elementCheck is the check of the rules of a list's items, or of a map's
// keys or values (fd their descriptor): anything when there are none;
// none (ok false) when they say required or ignore, which no element
// check stands for.
func elementCheck(fd protoreflect.FieldDescriptor, rules *validate.FieldRules) (func(protoreflect.Value) bool, bool, error) {
	if rules == nil {
		return func(protoreflect.Value) bool { return true }, true, nil
	}
	if rules.HasRequired() || rules.HasIgnore() {
		return nil, false, nil
	}
	return valueCheck(fd, rules, true)
}

func repeatedCheck(fd protoreflect.FieldDescriptor, r *validate.RepeatedRules) (func(protoreflect.Value) bool, bool, error) {
	items, ok, err := elementCheck(fd, r.GetItems())
	if !ok || err != nil {
		return nil, false, err
	}
	rest := proto.CloneOf(r)
	rest.ClearMinItems()
	rest.ClearMaxItems()
	rest.ClearItems()
	if proto.Size(rest) != 0 {
		return nil, false, nil // unique, or a rule to come
	}
	minN, maxN, hasMax := r.GetMinItems(), r.GetMaxItems(), r.HasMaxItems()
	return func(v protoreflect.Value) bool {
		l := v.List()
		n := uint64(l.Len())
		if n < minN || hasMax && n > maxN {
			return false
		}
		for i := range l.Len() {
			if !items(l.Get(i)) {
				return false
			}
		}
		return true
	}, true, nil
}

func mapCheck(fd protoreflect.FieldDescriptor, r *validate.MapRules) (func(protoreflect.Value) bool, bool, error) {
	keys, ok, err := elementCheck(fd.MapKey(), r.GetKeys())
	if !ok || err != nil {
		return nil, false, err
	}
	values, ok, err := elementCheck(fd.MapValue(), r.GetValues())
	if !ok || err != nil {
		return nil, false, err
	}
	rest := proto.CloneOf(r)
	rest.ClearMinPairs()
	rest.ClearMaxPairs()
	rest.ClearKeys()
	rest.ClearValues()
	if proto.Size(rest) != 0 {
		return nil, false, nil
	}
	minN, maxN, hasMax := r.GetMinPairs(), r.GetMaxPairs(), r.HasMaxPairs()
	return func(v protoreflect.Value) bool {
		m := v.Map()
		n := uint64(m.Len())
		if n < minN || hasMax && n > maxN {
			return false
		}
		ok := true
		m.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			ok = keys(k.Value()) && values(v)
			return ok
		})
		return ok
	}, true, nil
}

// stringCheck is the check of string rules: lengths in characters and in
// bytes, a pattern, a prefix, or one rule of rules.proto. A string that is
// not UTF-8 is refused (protovalidate decides on it).
func stringCheck(r *validate.StringRules) (func(string) bool, bool, error) {
	var checks []func(string) bool
	ok := len(r.ProtoReflect().GetUnknown()) == 0
	var err error
	r.ProtoReflect().Range(func(d protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if d.IsExtension() {
			var c func(string) bool
			c, ok, err = sharedCheck(d, v)
			checks = append(checks, c)
			return ok && err == nil
		}
		switch d.Name() {
		case "min_len":
			n := int(v.Uint())
			checks = append(checks, func(s string) bool { return len(s) >= n && utf8.RuneCountInString(s) >= n })
		case "max_len":
			n := int(v.Uint())
			checks = append(checks, func(s string) bool { return len(s) <= n || utf8.RuneCountInString(s) <= n })
		case "min_bytes":
			n := int(v.Uint())
			checks = append(checks, func(s string) bool { return len(s) >= n })
		case "max_bytes":
			n := int(v.Uint())
			checks = append(checks, func(s string) bool { return len(s) <= n })
		case "prefix":
			p := v.String()
			checks = append(checks, func(s string) bool { return strings.HasPrefix(s, p) })
		case "pattern":
			re, rerr := regexp.Compile(v.String())
			if rerr != nil {
				ok = false // protovalidate refuses to compile it
				return false
			}
			checks = append(checks, re.MatchString)
		default:
			ok = false
		}
		return ok
	})
	if !ok || err != nil {
		return nil, false, err
	}
	return allOf(append([]func(string) bool{utf8.ValidString}, checks...)), true, nil
}

// sharedCheck is the check of a rule of rules.proto set on a field
// (extension d of StringRules, set to v).
func sharedCheck(d protoreflect.FieldDescriptor, v protoreflect.Value) (func(string) bool, bool, error) {
	ext, isExt := d.(protoreflect.ExtensionTypeDescriptor)
	if !isExt || d.Kind() != protoreflect.BoolKind || !v.Bool() {
		return nil, false, nil
	}
	accepts, ok := sharedRuleAccepts[ext.FullName()]
	if !ok {
		if ext.ParentFile().Path() == intentv1.File_intent_v1_rules_proto.Path() {
			return nil, false, fmt.Errorf("server: rule %s of rules.proto has no Go check in sharedRuleAccepts", ext.FullName())
		}
		return nil, false, nil
	}
	return accepts, true, nil
}

// sharedRuleOf is the rule of rules.proto that r is, if r is one alone,
// and its check.
func sharedRuleOf(r *validate.StringRules) (protoreflect.FullName, func(string) bool) {
	var name protoreflect.FullName
	count := 0
	r.ProtoReflect().Range(func(d protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		count++
		if d.IsExtension() {
			name = d.FullName()
		}
		return true
	})
	if count != 1 || name == "" {
		return "", nil
	}
	return name, sharedRuleAccepts[name]
}

func bytesCheck(r protoreflect.Message) (func(protoreflect.Value) bool, bool, error) {
	minN, maxN, hasMax := 0, 0, false
	ok := true
	r.Range(func(d protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case d.IsExtension():
			ok = false
		case d.Name() == "min_len":
			minN = int(v.Uint())
		case d.Name() == "max_len":
			maxN, hasMax = int(v.Uint()), true
		default:
			ok = false
		}
		return ok
	})
	if !ok {
		return nil, false, nil
	}
	return func(v protoreflect.Value) bool {
		n := len(v.Bytes())
		return n >= minN && (!hasMax || n <= maxN)
	}, true, nil
}

// numberCheck is the check of integer rules (bounds, in, not_in), the
// value read by of and a rule's numbers by num.
func numberCheck[N int64 | uint64](r protoreflect.Message, of, num func(protoreflect.Value) N) (func(protoreflect.Value) bool, bool, error) {
	var checks []func(N) bool
	ok := true
	r.Range(func(d protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		var c func(N) bool
		switch {
		case d.IsExtension():
			ok = false
		case d.IsList():
			var set []N
			for i := range v.List().Len() {
				set = append(set, num(v.List().Get(i)))
			}
			switch d.Name() {
			case "in":
				c = func(n N) bool { return contains(set, n) }
			case "not_in":
				c = func(n N) bool { return !contains(set, n) }
			default:
				ok = false
			}
		case d.Message() == nil:
			c, ok = bound(d.Name(), num(v), func(x, y N) bool { return x < y })
		default:
			ok = false
		}
		checks = append(checks, c)
		return ok
	})
	if !ok {
		return nil, false, nil
	}
	all := allOf(checks)
	return func(v protoreflect.Value) bool { return all(of(v)) }, true, nil
}

func contains[N comparable](set []N, n N) bool {
	for _, s := range set {
		if s == n {
			return true
		}
	}
	return false
}

func enumCheck(ed protoreflect.EnumDescriptor, r protoreflect.Message) (func(protoreflect.Value) bool, bool, error) {
	var checks []func(protoreflect.EnumNumber) bool
	ok := true
	r.Range(func(d protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if d.IsExtension() {
			ok = false
			return false
		}
		var set []protoreflect.EnumNumber
		if d.IsList() {
			for i := range v.List().Len() {
				set = append(set, protoreflect.EnumNumber(v.List().Get(i).Int()))
			}
		}
		switch d.Name() {
		case "defined_only":
			if v.Bool() {
				values := ed.Values()
				checks = append(checks, func(n protoreflect.EnumNumber) bool { return values.ByNumber(n) != nil })
			}
		case "in":
			checks = append(checks, func(n protoreflect.EnumNumber) bool { return contains(set, n) })
		case "not_in":
			checks = append(checks, func(n protoreflect.EnumNumber) bool { return !contains(set, n) })
		default:
			ok = false
		}
		return ok
	})
	if !ok {
		return nil, false, nil
	}
	all := allOf(checks)
	return func(v protoreflect.Value) bool { return all(v.Enum()) }, true, nil
}

// durationCheck is the check of Duration bounds. A Duration out of its
// valid range, or whose seconds and nanos differ in sign, is refused.
func durationCheck(r protoreflect.Message) (func(protoreflect.Value) bool, bool, error) {
	type dur struct{ s, n int64 }
	less := func(a, b dur) bool { return a.s < b.s || a.s == b.s && a.n < b.n }
	read := func(m protoreflect.Message) (dur, bool) {
		fields := m.Descriptor().Fields()
		d := dur{m.Get(fields.ByNumber(1)).Int(), m.Get(fields.ByNumber(2)).Int()}
		const maxSeconds = 315_576_000_000
		valid := d.s >= -maxSeconds && d.s <= maxSeconds && d.n > -1e9 && d.n < 1e9 &&
			!(d.s > 0 && d.n < 0) && !(d.s < 0 && d.n > 0)
		return d, valid
	}
	var checks []func(dur) bool
	ok := true
	r.Range(func(d protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if d.IsExtension() || d.Message() == nil || d.IsList() {
			ok = false
			return false
		}
		b, valid := read(v.Message())
		if !valid {
			ok = false
			return false
		}
		var c func(dur) bool
		c, ok = bound(d.Name(), b, less)
		checks = append(checks, c)
		return ok
	})
	if !ok {
		return nil, false, nil
	}
	all := allOf(checks)
	return func(v protoreflect.Value) bool {
		x, valid := read(v.Message())
		return valid && all(x)
	}, true, nil
}
