package server

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// Limits on request fields. They keep every etcd write well under etcd's
// 1.5 MiB request limit: a record holds params, a result and a bounded
// history. intent.proto states the same limits as protovalidate rules, which
// ValidationInterceptors checks before a handler runs; the handlers check
// them again so that they stay safe when called on their own.
const (
	MaxParamsVersionLen = 64
	MaxLabels           = 32
	MaxLabelKeyLen      = 63
	MaxLabelValueLen    = 256
	MaxSessionIDLen     = 32
	MaxRequestIDLen     = 128
	MaxWorkerLen        = 128
	MaxReasonLen        = 1024
	MaxPayloadBytes     = 256 << 10
	MaxExternalRefs     = 32
	MaxExternalRefLen   = 256
	MaxFailureCodeLen   = 128
	MaxChannelLen       = 32
	MaxHeldLeases       = 128
	MinSessionTTL       = 2 * time.Second
	MaxSessionTTL       = 5 * time.Minute
	DefaultSessionTTL   = 10 * time.Second
)

// tenant returns the request's tenant, "default" when empty.
func tenant(t string) (string, error) {
	if t == "" {
		return intent.DefaultTenant, nil
	}
	return t, intent.ValidateTenant(t)
}

// target validates the (tenant, key) a request addresses.
func target(t, key string) (string, error) {
	tn, err := tenant(t)
	if err != nil {
		return "", err
	}
	return tn, intent.ValidateKey(key)
}

func maxLen(field, v string, n int) error {
	if len(v) > n {
		return intent.Invalid(field, "%d bytes, more than the limit of %d", len(v), n)
	}
	if !utf8.ValidString(v) {
		return intent.Invalid(field, "not valid UTF-8")
	}
	return nil
}

func required(field, v string, n int) error {
	if v == "" {
		return intent.Invalid(field, "required")
	}
	return maxLen(field, v, n)
}

// channel validates a decision's channel: empty, or a short word of a-z,
// 0-9 and '-'.
func channel(v string) error {
	if err := maxLen("channel", v, MaxChannelLen); err != nil {
		return err
	}
	for _, c := range v {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return intent.Invalid("channel", "must hold only lowercase ASCII letters, digits and '-'")
		}
	}
	return nil
}

func validToken(t uint64) error {
	if t == 0 {
		return intent.Invalid("token", "required: the token of the lease Acquire returned")
	}
	return nil
}

// registration validates a RegisterRequest (under field prefix, for the one
// nested in AcquireRequest) and returns its domain form with canonical
// params.
func registration(prefix string, r *intentv1.RegisterRequest) (*intent.Registration, error) {
	tn, err := target(r.GetTenant(), r.GetKey())
	if err != nil {
		return nil, nested(prefix, err)
	}
	params, err := canonicalParams(prefix, r.GetParams())
	if err != nil {
		return nil, err
	}
	if err := maxLen(prefix+"params_version", r.GetParamsVersion(), MaxParamsVersionLen); err != nil {
		return nil, err
	}
	if err := labels(prefix+"labels", r.GetLabels()); err != nil {
		return nil, err
	}
	if p := r.GetParentKey(); p != "" {
		if err := intent.ValidateKey(p); err != nil {
			return nil, nested(prefix+"parent_", err)
		}
	}
	var retention time.Duration
	if r.GetRetention() != nil {
		if retention = r.GetRetention().AsDuration(); retention <= 0 {
			return nil, intent.Invalid(prefix+"retention", "%v must be positive", retention)
		}
	}
	return &intent.Registration{
		Tenant:        tn,
		Key:           r.GetKey(),
		Params:        params,
		ParamsVersion: r.GetParamsVersion(),
		Labels:        r.GetLabels(),
		ParentKey:     r.GetParentKey(),
		Retention:     retention,
		MaxAttempts:   int(r.GetMaxAttempts()),
		RequestID:     r.GetRequestId(),
	}, nil
}

// MaxChildren bounds the children one Complete registers: they share one
// etcd transaction with the completion.
const MaxChildren = 16

// MaxOutboxBytes bounds what the children of one Complete add to its etcd
// transaction, as outboxCost estimates it. etcd refuses a request above
// 1.5 MiB (its default --max-request-bytes). The completed record alone may
// reach about 1 MiB: params (64 KiB), the result twice (in the record and in
// its history entry, base64: 2 x 342 KiB for the largest payload, plus
// external refs), labels and a full history of small entries. The children's
// 256 KiB on top leave a margin of about 250 KiB. (The number of etcd
// operations, 128 per transaction, is the store's to check: it refuses a
// larger outbox before writing, naming "children" too.)
const MaxOutboxBytes = 256 << 10

// outboxCost estimates the bytes a child registration adds to the
// completion's transaction: its record (canonical params, params_version,
// its parent's key, a history entry, JSON framing: 2 KiB beyond the params
// and version) and its index entries, which repeat its key in several etcd
// keys (8 times, counting the parent's history) and each label, escaped, in
// a key of its own (4 times).
func outboxCost(reg *intent.Registration) int {
	n := 2<<10 + len(reg.Params) + len(reg.ParamsVersion) + 8*len(reg.Key)
	for name, value := range reg.Labels {
		n += 4 * (len(name) + len(value))
	}
	return n
}

// children validates the child registrations of a Complete (the outbox).
func children(tn string, reqs []*intentv1.RegisterRequest) ([]intent.Registration, error) {
	if len(reqs) > MaxChildren {
		return nil, intent.Invalid("children", "%d children, more than the limit of %d", len(reqs), MaxChildren)
	}
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
// in the request: "key" becomes "register.key".
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
	if len(s.GetFields()) == 0 {
		return nil, intent.Invalid(prefix+"params", "required: the approved terms, a non-empty object")
	}
	b, err := intent.Canonical(s.AsMap())
	if err != nil {
		return nil, nested(prefix, err)
	}
	return b, nil
}

func labels(field string, m map[string]string) error {
	if len(m) > MaxLabels {
		return intent.Invalid(field, "%d labels, more than the limit of %d", len(m), MaxLabels)
	}
	for k, v := range m {
		if k == "" {
			return intent.Invalid(field, "empty label key")
		}
		if err := maxLen(field+subscript(k), k, MaxLabelKeyLen); err != nil {
			return err
		}
		if err := maxLen(field+subscript(k), v, MaxLabelValueLen); err != nil {
			return err
		}
	}
	return nil
}

func result(r *intentv1.Result) (*intent.Result, error) {
	if r == nil {
		return nil, intent.Invalid("result", "required: what the side effect produced")
	}
	if len(r.GetPayload()) > MaxPayloadBytes {
		return nil, intent.Invalid("result.payload", "%d bytes, more than the limit of %d", len(r.GetPayload()), MaxPayloadBytes)
	}
	if len(r.GetExternalRefs()) > MaxExternalRefs {
		return nil, intent.Invalid("result.external_refs", "%d entries, more than the limit of %d", len(r.GetExternalRefs()), MaxExternalRefs)
	}
	for k, v := range r.GetExternalRefs() {
		if err := required("result.external_refs", k, MaxExternalRefLen); err != nil {
			return nil, err
		}
		if err := maxLen("result.external_refs"+subscript(k), v, MaxExternalRefLen); err != nil {
			return nil, err
		}
	}
	return &intent.Result{Payload: r.GetPayload(), ExternalRefs: r.GetExternalRefs()}, nil
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

func sessionTTL(field string, ttl time.Duration, set bool) (time.Duration, error) {
	if !set {
		return DefaultSessionTTL, nil
	}
	if ttl < MinSessionTTL || ttl > MaxSessionTTL {
		return 0, intent.Invalid(field, "%v is outside [%v, %v]", ttl, MinSessionTTL, MaxSessionTTL)
	}
	return ttl, nil
}
