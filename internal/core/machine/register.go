package machine

import (
	"time"

	"github.com/intentd/intentd/intent"
)

// RegisterCall is a Register: an approver stores an intent.
type RegisterCall struct {
	Reg *intent.Registration
	// Fingerprint is the fingerprint of Reg.Params.
	Fingerprint string
	Principal   string
}

// Register decides a registration. A free key gets a PENDING record,
// guarded by the key having no tombstone and the parent (if any) existing;
// the same key with the same fingerprint answers the stored intent (created
// when the stored registration carries the call's request id: our own
// write, read back after a lost reply); another fingerprint is a
// *intent.FingerprintMismatchError; a tombstone is EXPIRED.
func (r Rules) Register(v *View, c RegisterCall, now time.Time) Decision {
	if v.Rec != nil {
		if v.Rec.Fingerprint != c.Fingerprint {
			return refuse(&intent.FingerprintMismatchError{Key: c.Reg.Key, Stored: v.Rec.Fingerprint, Given: c.Fingerprint})
		}
		// The holder is not read: an IN_PROGRESS intent shows as lapsed.
		d := answer(v.Rec.ToIntent(v.Rev, HolderGone))
		first := v.Rec.History[0]
		d.Answer.Created = c.Reg.RequestID != "" && first.Kind == intent.EventRegistered && first.RequestID == c.Reg.RequestID
		return d
	}
	rec, guards, err := r.newRecord(v, c.Reg, c.Fingerprint, c.Principal, now)
	if err != nil {
		return refuse(err)
	}
	d := v.write(rec, guards...)
	d.Answer = Answer{Show: ShowNext, Created: true}
	return d
}

// newRecord builds the record of a registration whose key is free, and the
// guards that keep it so until the write: no tombstone appeared, the parent
// (if any) exists. A view that has not read the tombstone and the parent
// (an optimistic one) relies on those guards alone.
func (r Rules) newRecord(v *View, reg *intent.Registration, fp, principal string, now time.Time) (*Record, []Guard, error) {
	if v.Tomb != nil {
		return nil, nil, v.Tomb.Expired()
	}
	guards := []Guard{{Kind: NoTombstone, Key: reg.Key}}
	if reg.ParentKey != "" {
		if o, read := v.Others[reg.ParentKey]; v.Fresh && read && o.Rec == nil {
			return nil, nil, intent.Invalid("parent_key", "no intent %q in this tenant", reg.ParentKey)
		}
		guards = append(guards, Guard{Kind: Exists, Key: reg.ParentKey})
	}
	return r.record(reg, fp, principal, now), guards, nil
}

// record is the PENDING record of a registration.
func (r Rules) record(reg *intent.Registration, fp, principal string, now time.Time) *Record {
	retention := reg.Retention
	if retention == 0 {
		retention = r.DefaultRetention
	}
	maxAttempts := reg.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = r.MaxAttempts
	}
	return &Record{
		Tenant:        reg.Tenant,
		Key:           reg.Key,
		State:         intent.StatePending,
		Params:        reg.Params,
		ParamsVersion: reg.ParamsVersion,
		Fingerprint:   fp,
		Labels:        reg.Labels,
		ParentKey:     reg.ParentKey,
		History:       []intent.Event{{Time: now, Kind: intent.EventRegistered, Accepted: true, Principal: principal, RequestID: reg.RequestID}},
		CreatedAt:     now,
		UpdatedAt:     now,
		Retention:     retention,
		MaxAttempts:   maxAttempts,
		Action:        reg.Action,
		Identity:      reg.Identity,
		Summary:       reg.Summary,
	}
}
