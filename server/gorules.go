package server

// protovalidate evaluates a request's rules through reflection and CEL:
// on a replay from memory its CEL programs were 12 % of intentd's CPU,
// more than the store's part of the call, and once the shared rules were
// checked in Go, what was left of it was still a quarter of the call's own
// work (docs/PERFORMANCE.md, "Replays beyond the cache"). Nearly every
// request passes its rules, so a request is first checked here against Go
// versions of its fields' rules' acceptance alone (fieldrules.go), planned
// once from the rules in intent.proto and rules.proto:
//
//   - when a check fails, protovalidate checks the whole request, as if
//     nothing were done here, so a refusal's field, words and order stay
//     protovalidate's;
//   - when all pass and every rule of the request's message types has a Go
//     check (complete), the request is valid and protovalidate is not
//     called;
//   - when all pass but some rules have none, protovalidate checks the
//     request with the fields checked here left out (their rules already
//     hold, so its answer is the one it would give with them).
//
// So only what a rule accepts is written twice, and only for the rules
// intent.proto uses: a check must accept no value its rules refuse
// (TestGoChecksAcceptWhatTheirRulesAccept compares them).
//
// The same pass leaves out the inside of messages in which no rule
// applies (ruleFree: a registration's params, a Struct), which
// protovalidate would otherwise walk entry by entry to find nothing.

import (
	"fmt"
	"sync"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// goRuleChecks is the plan of the Go checks for the request messages: for
// each message type a request can hold, its fields whose rules are
// checked here, and its message fields to look into.
type goRuleChecks struct {
	plans map[protoreflect.FullName]*messagePlan
	// skip holds the fields checked here, and those of the messages no
	// rule applies in (ruleFree), which protovalidate leaves out of a
	// request that passed the checks here (skipThem).
	skip     map[protoreflect.FieldDescriptor]bool
	skipThem []protovalidate.ValidationOption
	walks    sync.Pool // of *ruleWalk
}

type messagePlan struct {
	fields []*checkedField
	steps  []checkStep // by field number, what pass does with a field
	// unsetFails has the bits (checkedField.bit) of the fields whose rules
	// refuse them unset: required ones, and those without presence, not
	// ignored if empty, whose rules refuse the empty value.
	unsetFails uint64
	nested     []protoreflect.FieldDescriptor // singular or repeated messages
	mapped     []protoreflect.FullName        // the message types its maps hold
	// complete says that every rule of the type, and of every type it
	// holds, is checked here.
	complete bool
}

// newGoRuleChecks plans the checks for the messages descs and those they
// hold. Every field of a message type a map holds is left to
// protovalidate (which visits map entries in no fixed order; they are not
// looked into here), and so is a message-level or oneof rule.
func newGoRuleChecks(descs []protoreflect.MessageDescriptor) (*goRuleChecks, error) {
	c := &goRuleChecks{plans: map[protoreflect.FullName]*messagePlan{}, skip: map[protoreflect.FieldDescriptor]bool{}}
	c.walks.New = newRuleWalk
	underMap := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	var plan func(md protoreflect.MessageDescriptor) error
	plan = func(md protoreflect.MessageDescriptor) error {
		if _, done := c.plans[md.FullName()]; done {
			return nil
		}
		p := &messagePlan{complete: !hasTypeRules(md)}
		c.plans[md.FullName()] = p
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			f, ok, err := checkedFieldOf(fd)
			if err != nil {
				return err
			}
			if ok {
				p.fields = append(p.fields, f)
			} else if proto.HasExtension(fd.Options(), validate.E_Field) {
				p.complete = false
			}
			switch {
			case fd.IsMap():
				if m := fd.MapValue().Message(); m != nil {
					reachable(m, underMap)
					p.mapped = append(p.mapped, m.FullName())
				}
			case fd.Message() != nil:
				p.nested = append(p.nested, fd)
				if err := plan(fd.Message()); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, d := range descs {
		if err := plan(d); err != nil {
			return nil, err
		}
	}
	free := map[protoreflect.FullName]bool{}
	for _, md := range ruleFree(descs) {
		free[md.FullName()] = true
		fields := md.Fields()
		for i := range fields.Len() {
			c.skip[fields.Get(i)] = true
		}
	}
	for name, p := range c.plans {
		if _, ok := underMap[name]; ok && !free[name] {
			p.fields, p.complete = nil, false
		}
		for _, f := range p.fields {
			c.skip[f.fd] = true
		}
		if err := p.index(free); err != nil {
			return nil, fmt.Errorf("server: Go checks of %s: %w", name, err)
		}
		for _, m := range p.mapped {
			p.complete = p.complete && free[m]
		}
	}
	// A type holding an incomplete one is incomplete: repeat until no
	// holder changes (types may hold each other).
	for changed := true; changed; {
		changed = false
		for _, p := range c.plans {
			if !p.complete {
				continue
			}
			for _, fd := range p.nested {
				if !c.plans[fd.Message().FullName()].complete {
					p.complete, changed = false, true
					break
				}
			}
		}
	}
	c.skipThem = []protovalidate.ValidationOption{protovalidate.WithFilter(protovalidate.FilterFunc(
		func(_ protoreflect.Message, d protoreflect.Descriptor) bool {
			fd, ok := d.(protoreflect.FieldDescriptor)
			return !ok || !c.skip[fd]
		}))}
	return c, nil
}

// pass reports whether m passes the rules of the fields checked here, in
// it and in the messages it holds. It visits the fields m holds (Range)
// rather than asking for each field in turn (Has, Get), which reflection
// makes several times dearer; a field m does not hold fails if its plan
// says so (unsetFails).
func (c *goRuleChecks) pass(m protoreflect.Message) bool {
	p := c.plans[m.Descriptor().FullName()]
	if p == nil {
		return false // not planned: let protovalidate check it all
	}
	w := c.walks.Get().(*ruleWalk)
	w.c, w.p, w.held, w.ok = c, p, 0, true
	m.Range(w.visit)
	ok := w.ok && w.held&p.unsetFails == p.unsetFails
	w.c, w.p = nil, nil
	c.walks.Put(w)
	return ok
}

// ruleWalk is one pass over a message's fields; pass takes it from
// goRuleChecks.walks, whose walks hold their visit already bound, so that
// a pass allocates nothing.
type ruleWalk struct {
	c     *goRuleChecks
	p     *messagePlan
	held  uint64 // the bits of the checked fields seen
	ok    bool
	visit func(protoreflect.FieldDescriptor, protoreflect.Value) bool
}

func newRuleWalk() any {
	w := &ruleWalk{}
	w.visit = w.field
	return w
}

// field checks one field the message holds, and the messages it holds.
func (w *ruleWalk) field(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
	n := int(fd.Number())
	if n >= len(w.p.steps) {
		return true
	}
	step := w.p.steps[n]
	if f := step.check; f != nil {
		if !f.accepts(v) {
			w.ok = false
			return false
		}
		w.held |= f.bit
	}
	switch {
	case !step.descend:
	case fd.IsList():
		l := v.List()
		for i := range l.Len() {
			if !w.c.pass(l.Get(i).Message()) {
				w.ok = false
				return false
			}
		}
	default:
		w.ok = w.c.pass(v.Message())
	}
	return w.ok
}

// checkStep is what pass does with a field a message holds: check it,
// look into the message(s) it holds, both or neither.
type checkStep struct {
	check   *checkedField
	descend bool
}

// index numbers the plan's fields for pass: its steps by field number,
// a bit for each checked field (at most 64 a message), and the bits of
// those whose rules refuse them unset. Messages of the types in free,
// which no rule applies in, are not looked into.
func (p *messagePlan) index(free map[protoreflect.FullName]bool) error {
	if len(p.fields) > 64 {
		return fmt.Errorf("%d fields with rules, more than pass counts", len(p.fields))
	}
	p.steps, p.unsetFails = nil, 0
	step := func(fd protoreflect.FieldDescriptor) *checkStep {
		n := int(fd.Number())
		for len(p.steps) <= n {
			p.steps = append(p.steps, checkStep{})
		}
		return &p.steps[n]
	}
	for _, fd := range p.nested {
		if fd.Number() > 1<<12 {
			return fmt.Errorf("field %s: number %d too high to index", fd.Name(), fd.Number())
		}
		step(fd).descend = !free[fd.Message().FullName()]
	}
	for i, f := range p.fields {
		if f.fd.Number() > 1<<12 {
			return fmt.Errorf("field %s: number %d too high to index", f.fd.Name(), f.fd.Number())
		}
		step(f.fd).check = f
		f.bit = 1 << i
		if f.unsetFails() {
			p.unsetFails |= f.bit
		}
	}
	return nil
}

// complete says whether every rule of m's type is checked here: a request
// that passes them is valid.
func (c *goRuleChecks) complete(m protoreflect.Message) bool {
	p := c.plans[m.Descriptor().FullName()]
	return p != nil && p.complete
}

// hasTypeRules says whether md states a rule on itself or on one of its
// oneofs, which no Go check stands for.
func hasTypeRules(md protoreflect.MessageDescriptor) bool {
	if proto.HasExtension(md.Options(), validate.E_Message) {
		return true
	}
	oneofs := md.Oneofs()
	for i := range oneofs.Len() {
		if proto.HasExtension(oneofs.Get(i).Options(), validate.E_Oneof) {
			return true
		}
	}
	return false
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
	if hasTypeRules(md) {
		return true
	}
	fields := md.Fields()
	for i := range fields.Len() {
		if proto.HasExtension(fields.Get(i).Options(), validate.E_Field) {
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
