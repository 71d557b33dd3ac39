package server

// Admission: the one place a request becomes what the store takes. A
// request reaches a handler decoded (decode.go: bytes that are not the
// message are refused naming the field) and, behind the guard (auth.go),
// authorized, rate-limited and scoped to the tenant the caller's
// credentials allow, which travels in the call's context (callTenant); the
// guard writes nothing into the request. The handler then checks the
// request against the protovalidate rules of intent.proto
// (protovalidate.go), the only statement of a field's limits, and hands it
// and its tenant to its function here, which makes the checks no single
// field's rule can (the canonical form of params, its size and depth:
// intent.Canonical; a registration's relation to the request around it;
// the pairing of a decision with its result or failure; the children of
// one outbox together) and returns the trusted domain value the store
// takes: a registration, an acquire request, a report, a decision, a
// query, each carrying its tenant, nested registrations included. The
// functions are pure: a request in, a value or an *intent.InvalidError
// out. The store checks only what depends on its own configuration (the
// longest retention it keeps, the size of an etcd transaction).

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// DefaultSessionTTL is the TTL of a session whose OpenSession names none.
const DefaultSessionTTL = 10 * time.Second

// registration returns the domain form of a RegisterRequest in tenant tn
// (under field prefix, for one nested in AcquireRequest or
// CompleteRequest, whose caller checks a nested tenant against tn) with
// canonical params, and its key derived when it gives an identity instead.
func registration(tn, prefix string, r *intentv1.RegisterRequest) (*intent.Registration, error) {
	params, err := canonicalParams(prefix, r.GetParams())
	if err != nil {
		return nil, err
	}
	key, identity, err := registeredKey(prefix, r)
	if err != nil {
		return nil, err
	}
	return &intent.Registration{
		Tenant:        tn,
		Key:           key,
		Params:        params,
		ParamsVersion: r.GetParamsVersion(),
		Labels:        r.GetLabels(),
		ParentKey:     r.GetParentKey(),
		Retention:     r.GetRetention().AsDuration(),
		MaxAttempts:   int(r.GetMaxAttempts()),
		Action:        r.GetAction(),
		Identity:      identity,
		Summary:       r.GetSummary(),
		RequestID:     r.GetRequestId(),
	}, nil
}

// registeredKey is the key a registration names, and the canonical form
// of its identity, if it gives one. The rules have checked each field
// alone (a key's alphabet, an action's, a non-empty identity); what they
// cannot say is how key, action and identity go together:
//
//   - no identity: the key is required, as it always was (and refused in
//     the words protovalidate's "required" rule used, which older clients
//     may match);
//   - an identity needs the action it was derived with, and follows
//     DeriveKey's rules (intent.Derive: its canonical size, no number of
//     magnitude 2^53 or more), errors naming "identity" and its JSON path;
//   - with an identity an empty key is derived, exactly as DeriveKey
//     derives it, and a given key must be that derivation: a key that
//     says one thing while the identity a reviewer is shown says another
//     would mislead the reviewer.
func registeredKey(prefix string, r *intentv1.RegisterRequest) (key string, identity json.RawMessage, err error) {
	if r.GetIdentity() == nil {
		if r.GetKey() == "" {
			return "", nil, intent.Invalid(prefix+"key", "value is required")
		}
		return r.GetKey(), nil, nil
	}
	if r.GetAction() == "" {
		return "", nil, intent.Invalid(prefix+"action", "required with identity: the action the key is derived from")
	}
	d, err := intent.Derive(r.GetAction(), r.GetIdentity().AsMap())
	if err != nil {
		return "", nil, nested(prefix, err)
	}
	if k := r.GetKey(); k != "" && k != d.Key {
		return "", nil, intent.Invalid(prefix+"key", "must equal the key derived from action and identity, %s (or be empty, to be derived)", d.Key)
	}
	return d.Key, d.Identity, nil
}

// acquireRequest returns the domain form of an AcquireRequest in tenant
// tn, with its registration, if any, in tn too: a registration inside
// Acquire names the request's tenant (or none) and its key.
func acquireRequest(tn string, req *intentv1.AcquireRequest) (*intent.AcquireRequest, error) {
	ar := &intent.AcquireRequest{
		Tenant:              tn,
		Key:                 req.GetKey(),
		SessionID:           req.GetSessionId(),
		RequestID:           req.GetRequestId(),
		ExpectedFingerprint: req.GetExpectedFingerprint(),
	}
	if r := req.GetRegister(); r != nil {
		var err error
		if ar.Register, err = registration(tn, "register.", r); err != nil {
			return nil, err
		}
		if r.GetKey() == "" && ar.Register.Key != ar.Key {
			// Derived from register.identity, which the caller sees as
			// the intent's: the request's key is the one that is wrong.
			return nil, intent.Invalid("key", "must equal the key derived from register.action and register.identity, %s", ar.Register.Key)
		}
		if t := r.GetTenant(); (t != "" && t != tn) || ar.Register.Key != ar.Key {
			return nil, intent.Invalid("register", "tenant and key must equal the request's")
		}
	}
	return ar, nil
}

// sessionTTL is the TTL an OpenSessionRequest asks for, DefaultSessionTTL
// when it names none. (The rules have bounded one that is given.)
func sessionTTL(req *intentv1.OpenSessionRequest) time.Duration {
	if req.GetTtl() == nil {
		return DefaultSessionTTL
	}
	return req.GetTtl().AsDuration()
}

// heldLeases returns the leases a HeartbeatRequest names, for the store to
// check.
func heldLeases(req *intentv1.HeartbeatRequest) []intent.HeldLease {
	held := make([]intent.HeldLease, 0, len(req.GetLeases()))
	for _, l := range req.GetLeases() {
		held = append(held, intent.HeldLease{Key: l.GetKey(), Token: fencing.Token(l.GetToken())})
	}
	return held
}

// report is the domain form of the fields every fenced report shares.
func report(tn, key string, token uint64, kind intent.ReportKind) *intent.Report {
	return &intent.Report{Tenant: tn, Key: key, Token: fencing.Token(token), Kind: kind}
}

// unknownReport returns the domain form of a MarkUnknownRequest in tenant tn.
func unknownReport(tn string, req *intentv1.MarkUnknownRequest) *intent.Report {
	r := report(tn, req.GetKey(), req.GetToken(), intent.ReportMarkUnknown)
	r.Reason = req.GetReason()
	return r
}

// releaseReport returns the domain form of a ReleaseRequest in tenant tn.
func releaseReport(tn string, req *intentv1.ReleaseRequest) *intent.Report {
	r := report(tn, req.GetKey(), req.GetToken(), intent.ReportRelease)
	r.Reason = req.GetReason()
	return r
}

// failReport returns the domain form of a FailRequest in tenant tn.
func failReport(tn string, req *intentv1.FailRequest) *intent.Report {
	r := report(tn, req.GetKey(), req.GetToken(), intent.ReportFail)
	r.Failure = &intent.Failure{Code: req.GetFailure().GetCode(), Message: req.GetFailure().GetMessage()}
	return r
}

// escalation returns the domain form of an EscalateRequest in tenant tn.
func escalation(tn string, req *intentv1.EscalateRequest) intent.Escalation {
	return intent.Escalation{
		Tenant: tn, Key: req.GetKey(), Token: fencing.Token(req.GetToken()),
		Reason: req.GetReason(), Actor: req.GetActor(), Force: req.GetForce(),
	}
}

// decisions maps the API's verdicts to the states they lead to.
var decisions = map[intentv1.Decision]intent.State{
	intentv1.Decision_DECISION_COMPLETED: intent.StateCompleted,
	intentv1.Decision_DECISION_PENDING:   intent.StatePending,
	intentv1.Decision_DECISION_FAILED:    intent.StateFailed,
	intentv1.Decision_DECISION_CANCELLED: intent.StateCancelled,
}

// resolution returns the domain form of a ResolveRequest in tenant tn,
// after the check the rules leave to the server: a result with a
// COMPLETED decision only, a failure with a FAILED one only.
func resolution(tn string, req *intentv1.ResolveRequest) (*intent.Resolution, error) {
	state, ok := decisions[req.GetDecision()]
	if !ok {
		return nil, intent.Invalid("decision", "required: COMPLETED, PENDING, FAILED or CANCELLED")
	}
	d := &intent.Resolution{Tenant: tn, Key: req.GetKey(), Decision: state, Actor: req.GetActor(), Reason: req.GetReason(), Force: req.GetForce(), RequestID: req.GetRequestId(), Channel: req.GetChannel(),
		ExpectedToken: fencing.Token(req.GetExpectedToken())}
	switch state {
	case intent.StateCompleted:
		if req.GetResult() == nil {
			return nil, intent.Invalid("result", "required: what the side effect produced")
		}
		d.Result = result(req.GetResult())
	case intent.StateFailed:
		if req.GetFailure() == nil {
			return nil, intent.Invalid("failure.code", "required")
		}
		d.Failure = &intent.Failure{Code: req.GetFailure().GetCode(), Message: req.GetFailure().GetMessage()}
	}
	if state != intent.StateCompleted && req.GetResult() != nil {
		return nil, intent.Invalid("result", "only a COMPLETED decision carries a result")
	}
	if state != intent.StateFailed && req.GetFailure() != nil {
		return nil, intent.Invalid("failure", "only a FAILED decision carries a failure")
	}
	return d, nil
}

// cancellation returns the domain form of a CancelRequest in tenant tn.
func cancellation(tn string, req *intentv1.CancelRequest) intent.Cancellation {
	return intent.Cancellation{Tenant: tn, Key: req.GetKey(), Actor: req.GetActor(), Reason: req.GetReason()}
}

// listQuery returns the domain form of a ListRequest in tenant tn.
func listQuery(tn string, req *intentv1.ListRequest) (intent.ListQuery, error) {
	f, err := filter(tn, req.GetStates(), req.GetLabel(), req.GetParentKey())
	return intent.ListQuery{Filter: f, PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken()}, err
}

// watchQuery returns the domain form of a WatchRequest in tenant tn.
func watchQuery(tn string, req *intentv1.WatchRequest) (intent.WatchQuery, error) {
	f, err := filter(tn, req.GetStates(), req.GetLabel(), req.GetParentKey())
	return intent.WatchQuery{Filter: f, Key: req.GetKey(), StartRevision: req.GetStartRevision(), NotifyCreated: req.GetCreatedNotify()}, err
}

// filter returns the domain form of the filter fields List and Watch
// share in tenant tn, which the rules have checked but for the label's
// value.
func filter(tn string, states []intentv1.State, label, parent string) (intent.Filter, error) {
	f := intent.Filter{Tenant: tn, ParentKey: parent}
	for _, st := range states {
		f.States = append(f.States, intent.State(st))
	}
	if label != "" {
		name, value, _ := strings.Cut(label, "=")
		if err := labelFilter(name, value); err != nil {
			return f, err
		}
		f.Label = &intent.Label{Name: name, Value: value}
	}
	return f, nil
}

// MaxOutboxBytes bounds what the children of one Complete add to its etcd
// transaction, as outboxCost estimates it. etcd refuses a request above
// 1.5 MiB (its default --max-request-bytes). The completed record alone may
// reach about 1.1 MiB: params and identity (64 KiB each), the result twice
// (in the record and in its history entry, base64: 2 x 342 KiB for the
// largest payload, plus external refs), labels, action, summary and a full
// history of small entries. The children's 256 KiB on top leave a margin of
// about 180 KiB. (The number of etcd
// operations, 128 per transaction, is the store's to check: it refuses a
// larger outbox before writing, naming "children" too.)
const MaxOutboxBytes = 256 << 10

// outboxCost estimates the bytes a child registration adds to the
// completion's transaction: its record (canonical params, params_version,
// action, identity and summary, its parent's key, a history entry, JSON
// framing: 2 KiB beyond the params, version and description) and its index
// entries, which repeat its key in several etcd keys (8 times, counting the
// parent's history) and each label, escaped, in a key of its own (4
// times).
func outboxCost(reg *intent.Registration) int {
	n := 2<<10 + len(reg.Params) + len(reg.ParamsVersion) + len(reg.Action) + len(reg.Identity) + len(reg.Summary) + 8*len(reg.Key)
	for name, value := range reg.Labels {
		n += 4 * (len(name) + len(value))
	}
	return n
}

// completion returns the domain form of a CompleteRequest in tenant tn:
// the result, and the children it registers (the outbox).
func completion(tn string, req *intentv1.CompleteRequest) (*intent.Report, error) {
	r := report(tn, req.GetKey(), req.GetToken(), intent.ReportComplete)
	r.Result = result(req.GetResult())
	var err error
	if r.Children, err = children(tn, req.GetKey(), req.GetChildren()); err != nil {
		return nil, err
	}
	return r, nil
}

// children returns the child registrations of a Complete of intent parent
// in tenant tn (the outbox), each in tn with parent as its ParentKey: a
// child names its parent's tenant or none, and a key neither the parent's
// nor another child's.
func children(tn, parent string, reqs []*intentv1.RegisterRequest) ([]intent.Registration, error) {
	out := make([]intent.Registration, 0, len(reqs))
	cost := 0
	for i, r := range reqs {
		prefix := fmt.Sprintf("children[%d].", i)
		reg, err := registration(tn, prefix, r)
		if err != nil {
			return nil, err
		}
		if t := r.GetTenant(); t != "" && t != tn {
			return nil, intent.Invalid(prefix+"tenant", "a child belongs to its parent's tenant")
		}
		if reg.Key == parent || slices.ContainsFunc(out, func(o intent.Registration) bool { return o.Key == reg.Key }) {
			return nil, intent.Invalid(prefix+"key", "%q repeats the parent's or another child's key", reg.Key)
		}
		reg.ParentKey = parent
		cost += outboxCost(reg)
		out = append(out, *reg)
	}
	if cost > MaxOutboxBytes {
		return nil, intent.Invalid("children", "together they would add about %d bytes to the completion's etcd transaction, more than the limit of %d: register fewer or smaller children", cost, MaxOutboxBytes)
	}
	return out, nil
}

// nested renames the field of an *intent.InvalidError for a message nested
// in the request: "params" becomes "register.params".
func nested(prefix string, err error) error {
	var inv *intent.InvalidError
	if prefix == "" || !errors.As(err, &inv) {
		return err
	}
	return &intent.InvalidError{Field: prefix + inv.Field, Reason: inv.Reason}
}

// canonicalParams returns the canonical form of the params of a
// registration nested under prefix ("register.", "children[0]."). A value
// intent.Canonical refuses is named by its JSON path under the request
// field: "register.params.order_id".
func canonicalParams(prefix string, s *structpb.Struct) ([]byte, error) {
	b, err := intent.Canonical((*jsonObject)(s))
	if err != nil {
		return nil, nested(prefix, err)
	}
	return b, nil
}

// jsonObject and jsonArray are a Struct and a ListValue as
// intent.Canonical reads them in place: what AsMap and AsSlice would make
// of them, members and elements converted one by one as it reaches them
// (jsonValue). A nil one is empty, as AsMap and AsSlice have it.
type (
	jsonObject structpb.Struct
	jsonArray  structpb.ListValue
)

func (o *jsonObject) Len() int { return len((*structpb.Struct)(o).GetFields()) }

func (o *jsonObject) Keys(dst []string) []string {
	for k := range (*structpb.Struct)(o).GetFields() {
		dst = append(dst, k)
	}
	return dst
}

func (o *jsonObject) Member(key string) any {
	return jsonValue((*structpb.Struct)(o).GetFields()[key])
}

func (a *jsonArray) Len() int       { return len((*structpb.ListValue)(a).GetValues()) }
func (a *jsonArray) Elem(i int) any { return jsonValue((*structpb.ListValue)(a).GetValues()[i]) }

// jsonValue is v as Value.AsInterface makes it (a number that is not
// finite spelt as a string, as stored fingerprints were taken), except
// that an object or an array stays where it is, a *jsonObject or a
// *jsonArray.
func jsonValue(v *structpb.Value) any {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		if k != nil {
			return (*jsonObject)(k.StructValue)
		}
	case *structpb.Value_ListValue:
		if k != nil {
			return (*jsonArray)(k.ListValue)
		}
	}
	return v.AsInterface()
}

// labelFilter checks the value of List's and Watch's "name=value" label
// filter against the limit of a label's value, which the rule of the whole
// filter cannot single out. (The rule has checked the name and the "=".)
func labelFilter(name, value string) error {
	if n := maxLabelValueBytes; len(value) > n {
		return intent.Invalid("label"+subscript(name), "%d bytes, more than the limit of %d", len(value), n)
	}
	return nil
}

// result returns the domain form of a Result the rules have checked.
func result(r *intentv1.Result) *intent.Result {
	return &intent.Result{Payload: r.GetPayload(), ExternalRefs: r.GetExternalRefs()}
}

// maxSubscriptLen bounds the map key a field name repeats: a refused key may
// be as long as the request, and the error travels in gRPC trailers, three
// times over (message, ErrorInfo, BadRequest).
const maxSubscriptLen = 256

// subscript spells a map key as the subscript of a field name, "[team]",
// cut short past maxSubscriptLen bytes, longer than any key the limits
// allow.
func subscript(key string) string {
	if len(key) > maxSubscriptLen {
		cut := maxSubscriptLen
		for cut > 0 && !utf8.RuneStart(key[cut]) {
			cut--
		}
		key = key[:cut] + "..."
	}
	return "[" + key + "]"
}
