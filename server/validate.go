package server

// What the protovalidate rules of intent.proto cannot say, checked by hand
// after them (see protovalidate.go), and the turning of valid requests into
// their domain form. The rules are the only statement of a field's limits;
// the checks here are about what no single field's rule can see: the
// canonical form of params (its size and depth: intent.Canonical), a
// registration's relation to the request around it, the pairing of a
// decision with its result or failure, and the size of a whole outbox.

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// DefaultSessionTTL is the TTL of a session whose OpenSession names none.
const DefaultSessionTTL = 10 * time.Second

// tenantOr returns the request's tenant, "default" when empty. (The rules
// have checked a tenant that is given.)
func tenantOr(t string) string {
	if t == "" {
		return intent.DefaultTenant
	}
	return t
}

// registration returns the domain form of a RegisterRequest (under field
// prefix, for one nested in AcquireRequest or CompleteRequest) with
// canonical params, and its key derived when it gives an identity instead.
func registration(prefix string, r *intentv1.RegisterRequest) (*intent.Registration, error) {
	params, err := canonicalParams(prefix, r.GetParams())
	if err != nil {
		return nil, err
	}
	key, identity, err := registeredKey(prefix, r)
	if err != nil {
		return nil, err
	}
	return &intent.Registration{
		Tenant:        tenantOr(r.GetTenant()),
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

// children returns the child registrations of a Complete (the outbox) in
// tenant tn: a child names its parent's tenant or none.
func children(tn string, reqs []*intentv1.RegisterRequest) ([]intent.Registration, error) {
	out := make([]intent.Registration, 0, len(reqs))
	cost := 0
	for i, r := range reqs {
		prefix := fmt.Sprintf("children[%d].", i)
		if r.GetTenant() == "" {
			r = proto.CloneOf(r)
			r.Tenant = tn
		}
		reg, err := registration(prefix, r)
		if err != nil {
			return nil, err
		}
		if reg.Tenant != tn {
			return nil, intent.Invalid(prefix+"tenant", "a child belongs to its parent's tenant")
		}
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
	b, err := intent.Canonical(s.AsMap())
	if err != nil {
		return nil, nested(prefix, err)
	}
	return b, nil
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
