// Package vocab spells the proto's vocabulary enums as the strings on the
// wire, and back: ErrorReason as the reason of a google.rpc.ErrorInfo,
// ActionTaken and StatementStatus as the action_taken and status fields,
// which stay strings so that the JSON and the words agents read are as they
// were. buf's STANDARD lint wants every enum value prefixed with its enum's
// name (ERROR_REASON_STALE_TOKEN), while the wire has the bare name
// ("STALE_TOKEN", as googleapis' own reasons are; "lease_issued" in lower
// case): the prefixes are added and removed here and nowhere else.
package vocab

import (
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

const reasonPrefix = "ERROR_REASON_"

// Reason is r's reason on the wire: its name without the prefix.
func Reason(r intentv1.ErrorReason) string {
	return strings.TrimPrefix(r.String(), reasonPrefix)
}

// ParseReason is the ErrorReason a wire reason names; false for a reason
// the proto does not declare (and for the empty reason).
func ParseReason(reason string) (intentv1.ErrorReason, bool) {
	v, ok := intentv1.ErrorReason_value[reasonPrefix+reason]
	if !ok || v == int32(intentv1.ErrorReason_ERROR_REASON_UNSPECIFIED) {
		return intentv1.ErrorReason_ERROR_REASON_UNSPECIFIED, false
	}
	return intentv1.ErrorReason(v), true
}

// Reasons is every reason intentd sends, in the proto's order (UNSPECIFIED
// left out).
func Reasons() []intentv1.ErrorReason {
	return defined[intentv1.ErrorReason](intentv1.ErrorReason_ERROR_REASON_UNSPECIFIED.Descriptor())
}

// Action is a's word in an action_taken field: "lease_issued".
func Action(a intentv1.ActionTaken) string {
	return strings.ToLower(strings.TrimPrefix(a.String(), "ACTION_TAKEN_"))
}

// Actions is every ActionTaken intentd sends (UNSPECIFIED left out).
func Actions() []intentv1.ActionTaken {
	return defined[intentv1.ActionTaken](intentv1.ActionTaken_ACTION_TAKEN_UNSPECIFIED.Descriptor())
}

// Status is s's word in Statement.status: "already_completed".
func Status(s intentv1.StatementStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "STATEMENT_STATUS_"))
}

// Statuses is every StatementStatus intentd sends (UNSPECIFIED left out).
func Statuses() []intentv1.StatementStatus {
	return defined[intentv1.StatementStatus](intentv1.StatementStatus_STATEMENT_STATUS_UNSPECIFIED.Descriptor())
}

// defined is every value of an enum but its zero, in the proto's order.
func defined[E ~int32](d protoreflect.EnumDescriptor) []E {
	values := d.Values()
	all := make([]E, 0, values.Len())
	for i := range values.Len() {
		if n := values.Get(i).Number(); n != 0 {
			all = append(all, E(n))
		}
	}
	return all
}
