package server

// The shared field rules of rules.proto (a tenant's, a key's, a session
// id's …) are predefined rules, which protovalidate evaluates as CEL: on a
// replay from memory its CEL programs were 12 % of intentd's CPU, more
// than the store's part of the call (docs/PERFORMANCE.md, "Replays beyond
// the cache"). Nearly every request passes them, so a request is first
// checked here against Go versions of those rules' acceptance alone: when
// every field that takes one passes, protovalidate checks the request with
// those fields left out (their rules already hold, so its answer is the
// one it would give with them); otherwise it checks the whole request, as
// if nothing were done here. So a refusal's field, words and order stay
// protovalidate's, taken from rules.proto, and only what a rule accepts is
// written twice: sharedRuleAccepts must accept no value its expression
// refuses (TestSharedRulesAcceptWhatTheirExpressionsAccept compares them).
//
// The same pass leaves out the inside of messages in which no rule
// applies (ruleFree: a registration's params, a Struct), which
// protovalidate would otherwise walk entry by entry to find nothing.

import (
	"fmt"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

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

// sharedRuleChecks is the plan of the Go checks for the request messages:
// for each message type a request can hold, its fields that take a shared
// rule and nothing else, and its message fields to look into.
type sharedRuleChecks struct {
	plans map[protoreflect.FullName]*messagePlan
	// skip holds the fields checked here, and those of the messages no
	// rule applies in (ruleFree), which protovalidate leaves out of a
	// request that passed the checks here (skipThem).
	skip     map[protoreflect.FieldDescriptor]bool
	skipThem []protovalidate.ValidationOption
}

type messagePlan struct {
	strings []sharedField
	nested  []protoreflect.FieldDescriptor // singular or repeated messages
}

// sharedField is a field checked here: a string without presence whose
// rules are one rule of rules.proto, and required or ignore if empty.
type sharedField struct {
	fd           protoreflect.FieldDescriptor
	rule         protoreflect.FullName // the rule's extension
	accepts      func(string) bool
	required     bool
	ignoreIfZero bool
}

// newSharedRuleChecks plans the checks for the messages descs and those
// they hold. A field whose rules are anything more than one shared rule
// (with required or ignore) is left to protovalidate, and so is every
// field of a message type a map holds (protovalidate visits map entries
// in no fixed order, and they are not looked into here).
func newSharedRuleChecks(descs []protoreflect.MessageDescriptor) (*sharedRuleChecks, error) {
	c := &sharedRuleChecks{plans: map[protoreflect.FullName]*messagePlan{}, skip: map[protoreflect.FieldDescriptor]bool{}}
	underMap := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	var plan func(md protoreflect.MessageDescriptor) error
	plan = func(md protoreflect.MessageDescriptor) error {
		if _, done := c.plans[md.FullName()]; done {
			return nil
		}
		p := &messagePlan{}
		c.plans[md.FullName()] = p
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.IsMap() {
				if m := fd.MapValue().Message(); m != nil {
					reachable(m, underMap)
				}
				continue
			}
			if m := fd.Message(); m != nil {
				p.nested = append(p.nested, fd)
				if err := plan(m); err != nil {
					return err
				}
				continue
			}
			f, ok, err := sharedFieldOf(fd)
			if err != nil {
				return err
			}
			if ok {
				p.strings = append(p.strings, f)
			}
		}
		return nil
	}
	for _, d := range descs {
		if err := plan(d); err != nil {
			return nil, err
		}
	}
	for name, p := range c.plans {
		if _, ok := underMap[name]; ok {
			p.strings = nil
		}
		for _, f := range p.strings {
			c.skip[f.fd] = true
		}
	}
	for _, md := range ruleFree(descs) {
		fields := md.Fields()
		for i := range fields.Len() {
			c.skip[fields.Get(i)] = true
		}
	}
	c.skipThem = []protovalidate.ValidationOption{protovalidate.WithFilter(protovalidate.FilterFunc(
		func(_ protoreflect.Message, d protoreflect.Descriptor) bool {
			fd, ok := d.(protoreflect.FieldDescriptor)
			return !ok || !c.skip[fd]
		}))}
	return c, nil
}

// ruleFree returns the message types reachable from descs in which no
// rule applies: none of their own (on the message, a field or a oneof),
// and none in any message they hold. protovalidate has nothing to check
// in such a message, yet walks it whole, entry by entry: a registration's
// params (a Struct, whose Values and ListValues hold no rules either)
// were a third of checking an Acquire with a registration of five params
// (BenchmarkRequestRules). A rule on the field that holds one (params'
// "required" and "size(this) > 0") is the holder's and is still checked:
// skipThem leaves out the rule-free message's own fields, never the field
// that holds it.
func ruleFree(descs []protoreflect.MessageDescriptor) []protoreflect.MessageDescriptor {
	all := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	for _, d := range descs {
		reachable(d, all)
	}
	ruled := map[protoreflect.FullName]bool{}
	for name, md := range all {
		ruled[name] = hasOwnRules(md)
	}
	// A message holding one with rules has rules: repeat until no holder
	// changes (messages may hold each other).
	for changed := true; changed; {
		changed = false
		for name, md := range all {
			if ruled[name] {
				continue
			}
			fields := md.Fields()
			for i := range fields.Len() {
				if m := fieldMessage(fields.Get(i)); m != nil && ruled[m.FullName()] {
					ruled[name], changed = true, true
					break
				}
			}
		}
	}
	var out []protoreflect.MessageDescriptor
	for name, md := range all {
		if !ruled[name] {
			out = append(out, md)
		}
	}
	return out
}

// reachable adds to seen md and every message type it holds, as a
// field, a list's element or a map's value, however deep.
func reachable(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]protoreflect.MessageDescriptor) {
	if _, ok := seen[md.FullName()]; ok {
		return
	}
	seen[md.FullName()] = md
	fields := md.Fields()
	for i := range fields.Len() {
		if m := fieldMessage(fields.Get(i)); m != nil {
			reachable(m, seen)
		}
	}
}

// hasOwnRules says whether md states a protovalidate rule of its own: on
// itself, on one of its fields or on one of its oneofs.
func hasOwnRules(md protoreflect.MessageDescriptor) bool {
	if proto.HasExtension(md.Options(), validate.E_Message) {
		return true
	}
	fields := md.Fields()
	for i := range fields.Len() {
		if proto.HasExtension(fields.Get(i).Options(), validate.E_Field) {
			return true
		}
	}
	oneofs := md.Oneofs()
	for i := range oneofs.Len() {
		if proto.HasExtension(oneofs.Get(i).Options(), validate.E_Oneof) {
			return true
		}
	}
	return false
}

// fieldMessage is the message type fd holds, as a field, a list's
// element or a map's value, if any.
func fieldMessage(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		return fd.MapValue().Message()
	}
	return fd.Message()
}

// sharedFieldOf says whether fd is checked here, and how.
func sharedFieldOf(fd protoreflect.FieldDescriptor) (sharedField, bool, error) {
	rules, _ := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
	if fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.HasPresence() || rules == nil || !rules.HasString() {
		return sharedField{}, false, nil
	}
	f := sharedField{fd: fd, required: rules.GetRequired()}
	switch rules.GetIgnore() {
	case validate.Ignore_IGNORE_UNSPECIFIED:
	case validate.Ignore_IGNORE_IF_ZERO_VALUE:
		f.ignoreIfZero = true
	default:
		return sharedField{}, false, nil
	}
	// Nothing but required, ignore and string rules holding exactly one
	// extension, set: no standard rule, no CEL of the field's own.
	rest := proto.CloneOf(rules)
	rest.ClearRequired()
	rest.ClearIgnore()
	rest.ClearString()
	if proto.Size(rest) != 0 {
		return sharedField{}, false, nil
	}
	str := rules.GetString()
	if len(str.ProtoReflect().GetUnknown()) != 0 {
		return sharedField{}, false, nil
	}
	var ext protoreflect.ExtensionTypeDescriptor
	count, set := 0, false
	str.ProtoReflect().Range(func(d protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		count++
		if d.IsExtension() && d.Kind() == protoreflect.BoolKind {
			ext, set = d.(protoreflect.ExtensionTypeDescriptor), v.Bool()
		}
		return true
	})
	if count != 1 || ext == nil || !set {
		return sharedField{}, false, nil
	}
	accepts, ok := sharedRuleAccepts[ext.FullName()]
	if !ok {
		if ext.ParentFile().Path() == intentv1.File_intent_v1_rules_proto.Path() {
			return sharedField{}, false, fmt.Errorf("server: rule %s of rules.proto has no Go check in sharedRuleAccepts", ext.FullName())
		}
		return sharedField{}, false, nil
	}
	f.rule, f.accepts = ext.FullName(), accepts
	return f, true, nil
}

// pass reports whether m passes the shared rules of the fields checked
// here, in it and in the messages it holds.
func (c *sharedRuleChecks) pass(m protoreflect.Message) bool {
	p := c.plans[m.Descriptor().FullName()]
	if p == nil {
		return false // not planned: let protovalidate check it all
	}
	for _, f := range p.strings {
		s := m.Get(f.fd).String()
		switch {
		case s == "" && f.required:
			return false
		case s == "" && f.ignoreIfZero:
		case !f.accepts(s):
			return false
		}
	}
	for _, fd := range p.nested {
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			for i := range l.Len() {
				if !c.pass(l.Get(i).Message()) {
					return false
				}
			}
		case m.Has(fd):
			if !c.pass(m.Get(fd).Message()) {
				return false
			}
		}
	}
	return true
}
