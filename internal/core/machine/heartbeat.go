package machine

import (
	"fmt"
	"time"

	"github.com/intentd/intentd/intent"
)

// HeldCall is one lease a heartbeat names, checked against its record.
type HeldCall struct {
	Held intent.HeldLease
	// Index is the lease's place in the heartbeat's list, for naming the
	// field of a token never issued ("leases[2].token").
	Index     int
	Session   Session
	Principal string
}

// CheckHeld decides one lease a heartbeat names (see fence): under the
// current token nothing is written and nothing refused; under a superseded
// one the heartbeat is kept as evidence and refused as stale; a token
// never issued is refused naming the field.
func CheckHeld(v *View, c HeldCall, now time.Time) Decision {
	if v.Rec == nil {
		return refuse(v.Missing())
	}
	d, _ := fence(v, c.Held.Token, fmt.Sprintf("leases[%d].token", c.Index), intent.Event{
		Time: now, Kind: intent.EventHeartbeat, Token: c.Held.Token,
		SessionID: c.Session.ID, Worker: c.Session.Worker, Principal: c.Principal,
	})
	return d
}
