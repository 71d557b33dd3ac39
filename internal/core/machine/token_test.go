package machine_test

import (
	"testing"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// A lease issued by a write is stored with token 0 and its slot; reading
// it materializes the token from the write's revision and the slot. A
// lease stored before there were slots keeps the bare revision it was
// issued under.
func TestMaterializeTokenFromRevisionAndSlot(t *testing.T) {
	for _, tc := range []struct {
		name string
		rev  int64
		slot int
		want fencing.Token
	}{
		{"stored before slots: the revision", 1000, 0, 1000},
		{"first slot", 1000, 1, 1000 * machine.TokenSlots},
		{"second slot", 1000, 2, 1000*machine.TokenSlots + 1},
		{"last slot", 1000, machine.TokenSlots, 1000*machine.TokenSlots + machine.TokenSlots - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &machine.Record{
				Lease:   &machine.Lease{Slot: tc.slot},
				History: []intent.Event{{Kind: intent.EventAcquired, Issued: true}, {Kind: intent.EventHeartbeat, Token: 7}},
			}
			r.Materialize(tc.rev)
			if r.Lease.Token != tc.want || r.Lease.Slot != 0 {
				t.Errorf("lease token %d slot %d, want token %d slot 0", r.Lease.Token, r.Lease.Slot, tc.want)
			}
			if got := r.History[0].Token; got != tc.want {
				t.Errorf("issuing entry's token %d, want %d", got, tc.want)
			}
			if got := r.History[1].Token; got != 7 {
				t.Errorf("other entry's token %d, want 7 as it was", got)
			}
			// A materialized record is not materialized again.
			r.Materialize(tc.rev + 1)
			if r.Lease.Token != tc.want {
				t.Errorf("materialized twice: token %d, want %d", r.Lease.Token, tc.want)
			}
		})
	}
}

// Tokens strictly increase over revisions whatever the slots, and a token
// stored before there were slots (a bare revision) is below every token
// issued at any later revision.
func TestTokensIncreaseAcrossRevisionsAndSlots(t *testing.T) {
	var prev fencing.Token
	for rev := int64(1); rev <= 300; rev++ {
		for slot := 1; slot <= machine.TokenSlots; slot++ {
			tok := machine.TokenAt(rev, slot)
			if tok <= prev {
				t.Fatalf("TokenAt(%d, %d) = %d, not above the previous %d", rev, slot, tok, prev)
			}
			prev = tok
		}
		// Every older bare-revision token is below the first new one.
		if old, first := machine.TokenAt(rev, 0), machine.TokenAt(rev+1, 1); old >= first {
			t.Fatalf("old token %d at revision %d, not below %d issued at revision %d", old, rev, first, rev+1)
		}
	}
}
