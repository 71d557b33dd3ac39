package server

import (
	"log/slog"
	"strings"

	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// The limits of intent.proto under the names the tests use, read from the
// compiled rules: the tests put requests at each limit and one past it
// without writing a limit again. A rule of rules.proto that many fields
// share states its limit inside its expression, so those are read by
// trying the compiled rules (longestAccepted).
var (
	MaxKeyLen           = longestAccepted("k", func(v string) proto.Message { return &intentv1.GetRequest{Key: v} })
	MaxTenantLen        = longestAccepted("t", func(v string) proto.Message { return &intentv1.GetRequest{Tenant: v, Key: "k"} })
	MaxActionLen        = longestAccepted("a", func(v string) proto.Message { return &intentv1.DeriveKeyRequest{Action: v} })
	MaxParamsVersionLen = maxBytes("RegisterRequest", "params_version")
	MaxLabels           = int(fieldRules("RegisterRequest", "labels").GetMap().GetMaxPairs())
	MaxLabelKeyLen      = int(fieldRules("RegisterRequest", "labels").GetMap().GetKeys().GetString().GetMaxBytes())
	MaxLabelValueLen    = maxLabelValueBytes
	MaxSessionIDLen     = longestAccepted("a", func(v string) proto.Message { return &intentv1.CloseSessionRequest{SessionId: v} })
	MaxRequestIDLen     = longestAccepted("r", func(v string) proto.Message {
		return &intentv1.AcquireRequest{Key: "k", SessionId: "a", RequestId: v}
	})
	MaxWorkerLen      = longestAccepted("w", func(v string) proto.Message { return &intentv1.OpenSessionRequest{Worker: v} })
	MaxReasonLen      = longestAccepted("r", func(v string) proto.Message { return &intentv1.MarkUnknownRequest{Key: "k", Token: 1, Reason: v} })
	MaxPayloadBytes   = int(fieldRules("Result", "payload").GetBytes().GetMaxLen())
	MaxExternalRefs   = int(fieldRules("Result", "external_refs").GetMap().GetMaxPairs())
	MaxExternalRefLen = int(fieldRules("Result", "external_refs").GetMap().GetValues().GetString().GetMaxBytes())
	MaxFailureCodeLen = maxBytes("Failure", "code")
	MaxChannelLen     = maxBytes("ResolveRequest", "channel")
	MaxHeldLeases     = int(fieldRules("HeartbeatRequest", "leases").GetRepeated().GetMaxItems())
	MaxChildren       = int(fieldRules("CompleteRequest", "children").GetRepeated().GetMaxItems())
	MinSessionTTL     = fieldRules("OpenSessionRequest", "ttl").GetDuration().GetGte().AsDuration()
	MaxSessionTTL     = fieldRules("OpenSessionRequest", "ttl").GetDuration().GetLte().AsDuration()
)

func maxBytes(message, field string) int {
	return int(fieldRules(message, field).GetString().GetMaxBytes())
}

// longestAccepted is the length of the longest value made of c repeated
// that the compiled rules accept in the request build makes of it, found
// by bisection below 1 MiB; 0 if they accept none (or the rules do not
// compile, which every test of the package reports).
func longestAccepted(c string, build func(v string) proto.Message) int {
	rules, err := compiledRules()
	if err != nil {
		return 0
	}
	accepted := func(n int) bool { return rules.validate(build(strings.Repeat(c, n))) == nil }
	lo, hi := 0, 1<<20 // accepted(lo) or lo == 0; !accepted(hi)
	if !accepted(1) {
		return 0
	}
	for hi-lo > 1 {
		if mid := (lo + hi) / 2; accepted(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// FieldRules exports fieldRules to the tests that compare the rules with
// the limits written where no request is at hand.
var FieldRules = fieldRules

// CheckRequest checks req as a handler does before anything else, and
// returns the status it would answer with, or nil.
func CheckRequest(req proto.Message) error {
	rules, err := compiledRules()
	if err != nil {
		return err
	}
	return (&Server{rules: rules, log: slog.New(slog.DiscardHandler)}).valid(req)
}
