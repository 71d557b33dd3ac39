package machine_test

import (
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

func TestRegisterTransitions(t *testing.T) {
	reg := func(mod func(*intent.Registration)) machine.RegisterCall {
		r := registration()
		if mod != nil {
			mod(r)
		}
		return machine.RegisterCall{Reg: r, Fingerprint: intent.Fingerprint(r.Params), Principal: "approver"}
	}
	created := func(t *testing.T, d machine.Decision) {
		if !d.Answer.Created {
			t.Error("answer not Created")
		}
		if h := d.Next.History; len(h) != 1 || h[0].Kind != intent.EventRegistered || h[0].Principal != "approver" || h[0].RequestID != "reg-1" {
			t.Errorf("history %+v, want the registration alone", h)
		}
	}
	withParent := func(r *intent.Registration) { r.ParentKey = "parent-1" }
	for _, tc := range []struct {
		name string
		v    *machine.View
		call machine.RegisterCall
		want expect
	}{
		{"a free key is PENDING with the store's defaults", live(nil), reg(nil),
			expect{state: intent.StatePending, guards: []machine.GuardKind{machine.RecordAt, machine.NoTombstone}, show: machine.ShowNext, shown: intent.StatePending,
				check: func(t *testing.T, d machine.Decision) {
					created(t, d)
					if d.Next.Retention != rules.DefaultRetention || d.Next.MaxAttempts != rules.MaxAttempts || d.Next.Fingerprint != intent.Fingerprint(d.Next.Params) {
						t.Errorf("record %+v, want the default retention and attempts limit, the params' fingerprint", d.Next)
					}
				}}},
		{"the registration's own retention and limit win", live(nil), reg(func(r *intent.Registration) { r.Retention, r.MaxAttempts = time.Minute, 7 }),
			expect{state: intent.StatePending, guards: []machine.GuardKind{machine.RecordAt, machine.NoTombstone}, show: machine.ShowNext, check: func(t *testing.T, d machine.Decision) {
				if d.Next.Retention != time.Minute || d.Next.MaxAttempts != 7 {
					t.Errorf("retention %v max attempts %d, want 1m and 7", d.Next.Retention, d.Next.MaxAttempts)
				}
			}}},
		{"a parent read and present is guarded to stay", func() *machine.View {
			v := live(nil)
			v.Others["parent-1"] = machine.Other{Rec: pending()}
			return v
		}(), reg(withParent), expect{state: intent.StatePending, guards: []machine.GuardKind{machine.RecordAt, machine.NoTombstone, machine.Exists}, show: machine.ShowNext}},
		{"a parent not read (an optimistic view) is guarded", &machine.View{Key: key}, reg(withParent),
			expect{state: intent.StatePending, guards: []machine.GuardKind{machine.RecordAt, machine.NoTombstone, machine.Exists}, show: machine.ShowNext}},
		{"a parent read and absent is refused", func() *machine.View {
			v := live(nil)
			v.Others["parent-1"] = machine.Other{}
			return v
		}(), reg(withParent), expect{err: intent.ErrInvalid}},
		{"a tombstone is EXPIRED", func() *machine.View {
			v := live(nil)
			v.Tomb = &machine.Tombstone{Key: key, State: intent.StateCompleted}
			return v
		}(), reg(nil), expect{err: intent.ErrExpired}},
		{"the same key and fingerprint answer the stored intent", live(held(intent.ModeExecute)), reg(func(r *intent.Registration) { r.RequestID = "" }),
			expect{shown: intent.StateUnknown, check: func(t *testing.T, d machine.Decision) {
				if d.Answer.Created {
					t.Error("Created for another caller's registration")
				}
			}}},
		{"our own registration, read back, is created", live(pending()), reg(nil), expect{shown: intent.StatePending, check: func(t *testing.T, d machine.Decision) {
			if !d.Answer.Created {
				t.Error("our own write read back is not Created")
			}
		}}},
		{"another fingerprint is a conflict", live(pending()), reg(func(r *intent.Registration) { r.Params = []byte(`{"item":"desk"}`) }), expect{err: intent.ErrFingerprintMismatch}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.Register(tc.v, tc.call, now), tc.want)
		})
	}
}
