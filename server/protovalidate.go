package server

// Request validation from the proto: every request field of intent.proto
// carries its limits as protovalidate rules (buf.validate annotations), and
// those rules are the only place a field's limits are written; a rule many
// fields share (a tenant's, a key's) is written once, in rules.proto, as a
// predefined rule each of those fields names. Each handler
// checks its request against them first, with the one validator compiled
// here (Server.valid), so a handler is safe however it is called, and a
// malformed request never reaches the store. What no field's rule can say
// is checked by hand after them, in validate.go.
//
// protovalidate.Validator is used directly rather than through
// go-grpc-middleware's interceptors/protovalidate because that one answers
// with a fixed error (INVALID_ARGUMENT carrying a buf.validate.Violations
// detail and no ErrorInfo; INTERNAL with the raw error text when a rule
// does not compile) and offers no way to change it, while every intentd
// error carries an ErrorInfo in domain intentd.dev and never leaks text.
// Here a violation becomes the *intent.InvalidError the hand checks return,
// and toStatus turns it into the same status.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// compiledRules is the validator of every IntentService request, compiled
// once per process: an error means a rule in intent.proto does not compile,
// a build defect rather than a condition to retry.
var compiledRules = sync.OnceValues(newRequestValidator)

// valid checks req, the request a handler received, against its rules and
// returns nil or the status to answer with: INVALID_ARGUMENT, ErrorInfo
// reason INVALID_FIELD and the field's path ("register.key",
// "children[0].params", "labels[team]") in the ErrorInfo metadata and a
// BadRequest violation. Should a rule fail to evaluate, the call fails with
// INTERNAL and the cause goes to the server's log, never to the client.
func (s *Server) valid(req proto.Message) error {
	if err := s.rules.validate(req); err != nil {
		return s.fail(err)
	}
	return nil
}

// requestValidator checks request messages and maps what it finds to
// intentd's errors.
type requestValidator struct {
	v      protovalidate.Validator
	checks *goRuleChecks // the rules checked in Go first (gorules.go); nil: none
}

// newRequestValidator builds a validator for the IntentService requests and
// validates an empty one of each, so that a rule that does not compile is
// found now rather than on the first request of its kind.
func newRequestValidator() (*requestValidator, error) {
	descs := requestDescriptors()
	pv, err := protovalidate.New(protovalidate.WithMessageDescriptors(descs...), protovalidate.WithFailFast())
	if err != nil {
		return nil, fmt.Errorf("server: protovalidate: %w", err)
	}
	for _, d := range descs {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
		if err != nil {
			return nil, fmt.Errorf("server: protovalidate: %w", err)
		}
		var verr *protovalidate.ValidationError
		if err := pv.Validate(mt.New().Interface()); err != nil && !errors.As(err, &verr) {
			return nil, fmt.Errorf("server: protovalidate rules of %s: %w", d.FullName(), err)
		}
	}
	checks, err := newGoRuleChecks(descs)
	if err != nil {
		return nil, err
	}
	return &requestValidator{v: pv, checks: checks}, nil
}

// requestDescriptors are the request message types of the IntentService
// RPCs, in the order the service declares them.
func requestDescriptors() []protoreflect.MessageDescriptor {
	var descs []protoreflect.MessageDescriptor
	methods := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods()
	for i := range methods.Len() {
		descs = append(descs, methods.Get(i).Input())
	}
	return descs
}

// validate returns nil, an *intent.InvalidError naming the first field that
// breaks a rule, or an error that is neither (a rule that could not be
// compiled or evaluated).
func (r *requestValidator) validate(msg proto.Message) error {
	var err error
	if m := msg.ProtoReflect(); r.checks != nil && r.checks.pass(m) {
		if r.checks.complete(m) {
			return nil
		}
		err = r.v.Validate(msg, r.checks.skipThem...)
	} else {
		err = r.v.Validate(msg) // the refusal as protovalidate words and orders it
	}
	if err == nil {
		return nil
	}
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) || len(verr.Violations) == 0 || verr.Violations[0].Proto == nil {
		return fmt.Errorf("server: validate %s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	return violationError(verr.Violations[0])
}

// violationError turns a protovalidate violation into the error the
// handlers' own checks return for a malformed field.
func violationError(pv *protovalidate.Violation) *intent.InvalidError {
	v := pv.Proto
	field := fieldPath(v.GetField())
	if field == "" {
		field = "request" // a message-level rule: intent.proto has none today
	}
	reason := v.GetMessage()
	if v.GetRuleId() == "string.pattern" && pv.RuleValue.IsValid() {
		if words, ok := patternWords[pv.RuleValue.String()]; ok {
			reason = words
		}
	}
	if reason == "" {
		reason = "breaks rule " + v.GetRuleId()
	}
	if v.GetForKey() {
		reason = "map key: " + reason
	}
	return &intent.InvalidError{Field: field, Reason: reason}
}

// patternWords says in words what each string pattern of intent.proto
// allows, keyed by the pattern: protovalidate's own message quotes the raw
// regex, which a person should not have to read. A test checks that every
// pattern in intent.proto has its words here. (The rules many fields share,
// in rules.proto, say their words in their own messages.)
var patternWords = map[string]string{
	"^[A-Za-z0-9][A-Za-z0-9._:/-]*$": "a label name must hold only ASCII letters, digits and the characters . _ : / -, and start with a letter or digit",
	"^[0-9a-f]{64}$":                 "must be 64 lowercase hexadecimal digits (a SHA-256)",
	"^[a-z0-9-]+$":                   "must hold only lowercase ASCII letters, digits and '-'",
	"^[^\\p{Cc}]*$":                  "must hold no control characters: one line of text, without tabs",
	"^[A-Z]+$":                       "must hold only uppercase ASCII letters",
}

// fieldPath spells a protovalidate field path the way intentd names
// fields: names joined by dots, list indexes and map keys in brackets, as in
// "children[0].key" and "labels[team]".
func fieldPath(p *validate.FieldPath) string {
	var b strings.Builder
	for i, e := range p.GetElements() {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.GetFieldName())
		switch e.WhichSubscript() {
		case validate.FieldPathElement_Index_case:
			b.WriteString("[" + strconv.FormatUint(e.GetIndex(), 10) + "]")
		case validate.FieldPathElement_BoolKey_case:
			b.WriteString("[" + strconv.FormatBool(e.GetBoolKey()) + "]")
		case validate.FieldPathElement_IntKey_case:
			b.WriteString("[" + strconv.FormatInt(e.GetIntKey(), 10) + "]")
		case validate.FieldPathElement_UintKey_case:
			b.WriteString("[" + strconv.FormatUint(e.GetUintKey(), 10) + "]")
		case validate.FieldPathElement_StringKey_case:
			b.WriteString(subscript(e.GetStringKey()))
		}
	}
	return b.String()
}

// fieldRules returns the protovalidate rules of field in message (of
// package intent.v1), for the few hand checks that need a limit the rules
// state: they read it here rather than write it again.
func fieldRules(message, field string) *validate.FieldRules {
	md := intentv1.File_intent_v1_intent_proto.Messages().ByName(protoreflect.Name(message))
	fd := md.Fields().ByName(protoreflect.Name(field))
	rules, _ := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
	return rules
}

// maxLabelValueBytes is the longest label value, as RegisterRequest.labels
// states it; List's and Watch's label filter applies it to its value.
var maxLabelValueBytes = int(fieldRules("RegisterRequest", "labels").GetMap().GetValues().GetString().GetMaxBytes())
