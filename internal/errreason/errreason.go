// Package errreason spells the proto's ErrorReason as the reason of a
// google.rpc.ErrorInfo on the wire, and back. buf's STANDARD lint wants every
// enum value prefixed with its enum's name (ERROR_REASON_STALE_TOKEN), while
// the wire reason is the bare name ("STALE_TOKEN"), as googleapis' own
// reasons are: the prefix is added and removed here and nowhere else.
package errreason

import (
	"strings"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

const prefix = "ERROR_REASON_"

// String is r's reason on the wire: its name without the prefix.
func String(r intentv1.ErrorReason) string {
	return strings.TrimPrefix(r.String(), prefix)
}

// Parse is the ErrorReason a wire reason names; false for a reason the
// proto does not declare (and for the empty reason).
func Parse(reason string) (intentv1.ErrorReason, bool) {
	v, ok := intentv1.ErrorReason_value[prefix+reason]
	if !ok || v == int32(intentv1.ErrorReason_ERROR_REASON_UNSPECIFIED) {
		return intentv1.ErrorReason_ERROR_REASON_UNSPECIFIED, false
	}
	return intentv1.ErrorReason(v), true
}

// All is every reason intentd sends, in the proto's order (UNSPECIFIED
// left out).
func All() []intentv1.ErrorReason {
	values := intentv1.ErrorReason_ERROR_REASON_UNSPECIFIED.Descriptor().Values()
	all := make([]intentv1.ErrorReason, 0, values.Len()-1)
	for i := range values.Len() {
		if n := intentv1.ErrorReason(values.Get(i).Number()); n != intentv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
			all = append(all, n)
		}
	}
	return all
}
