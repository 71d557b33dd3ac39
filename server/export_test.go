package server

import (
	"log/slog"

	"google.golang.org/protobuf/proto"
)

// The limits of intent.proto under the names the tests use, read from the
// compiled rules: the tests put requests at each limit and one past it
// without writing a limit again.
var (
	MaxKeyLen           = maxBytes("GetRequest", "key")
	MaxParamsVersionLen = maxBytes("RegisterRequest", "params_version")
	MaxLabels           = int(fieldRules("RegisterRequest", "labels").GetMap().GetMaxPairs())
	MaxLabelKeyLen      = int(fieldRules("RegisterRequest", "labels").GetMap().GetKeys().GetString().GetMaxBytes())
	MaxLabelValueLen    = maxLabelValueBytes
	MaxSessionIDLen     = maxBytes("CloseSessionRequest", "session_id")
	MaxRequestIDLen     = maxBytes("AcquireRequest", "request_id")
	MaxWorkerLen        = maxBytes("OpenSessionRequest", "worker")
	MaxReasonLen        = maxBytes("MarkUnknownRequest", "reason")
	MaxPayloadBytes     = int(fieldRules("Result", "payload").GetBytes().GetMaxLen())
	MaxExternalRefs     = int(fieldRules("Result", "external_refs").GetMap().GetMaxPairs())
	MaxExternalRefLen   = int(fieldRules("Result", "external_refs").GetMap().GetValues().GetString().GetMaxBytes())
	MaxFailureCodeLen   = maxBytes("Failure", "code")
	MaxChannelLen       = maxBytes("ResolveRequest", "channel")
	MaxHeldLeases       = int(fieldRules("HeartbeatRequest", "leases").GetRepeated().GetMaxItems())
	MaxChildren         = int(fieldRules("CompleteRequest", "children").GetRepeated().GetMaxItems())
	MinSessionTTL       = fieldRules("OpenSessionRequest", "ttl").GetDuration().GetGte().AsDuration()
	MaxSessionTTL       = fieldRules("OpenSessionRequest", "ttl").GetDuration().GetLte().AsDuration()
)

func maxBytes(message, field string) int {
	return int(fieldRules(message, field).GetString().GetMaxBytes())
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
