package machine_test

import (
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

func TestMarkLapsedTransitions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v       *machine.View
		session string
		want    expect
	}{
		{"a lapsed holder's intent goes UNKNOWN while it stays gone", lapsed(held(intent.ModeExecute)), holder,
			expect{state: intent.StateUnknown, guards: []machine.GuardKind{machine.RecordAt, machine.SessionGone}, ended: machine.EndedLapsedAtSweep,
				check: func(t *testing.T, d machine.Decision) {
					if e := last(d); e.Kind != intent.EventLeaseLapsed || e.Principal != "janitor" || e.Token != tok {
						t.Errorf("entry %+v, want the janitor's lapse of %v", e, tok)
					}
					if d.Next.Attempts != 1 {
						t.Errorf("attempts %d, want 1", d.Next.Attempts)
					}
				}}},
		{"past the attempts limit it goes to review", lapsed(func() *machine.Record {
			r := held(intent.ModeReconcile)
			r.Attempts, r.EndedToken = 2, tok-1
			return r
		}()), holder, expect{state: intent.StateNeedsReview, guards: []machine.GuardKind{machine.RecordAt, machine.SessionGone}, ended: machine.EndedLapsedAtSweep, exh: true}},
		{"a live holder is left alone", live(held(intent.ModeExecute)), holder, expect{}},
		{"an intent held by another session since is left alone", lapsed(held(intent.ModeExecute)), "s-other", expect{}},
		{"an intent reported since is left alone", lapsed(in(intent.StateCompleted)), holder, expect{}},
		{"an intent gone is left alone", lapsed(nil), holder, expect{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verify(t, tc.v, rules.MarkLapsed(tc.v, tc.session, now), tc.want)
		})
	}
}

func TestRemoveAtRetention(t *testing.T) {
	due := t0.Add(time.Hour) // the fixtures' final records are retained for an hour from t0
	for _, tc := range []struct {
		name   string
		rec    *machine.Record
		at     time.Time
		remove bool
	}{
		{"COMPLETED at the end of its retention", in(intent.StateCompleted), due, true},
		{"FAILED past it", in(intent.StateFailed), due.Add(time.Hour), true},
		{"CANCELLED past it", in(intent.StateCancelled), due.Add(time.Second), true},
		{"COMPLETED before it", in(intent.StateCompleted), due.Add(-time.Nanosecond), false},
		{"NEEDS_REVIEW is never removed", in(intent.StateNeedsReview), due.Add(time.Hour), false},
		{"PENDING is never removed", pending(), due.Add(time.Hour), false},
		{"gone already", nil, due, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := live(tc.rec)
			d := rules.Remove(v, tc.at)
			if d.Next != nil || d.Err != nil || d.Writes() != tc.remove {
				t.Fatalf("decision %+v, want removal %t and no record written", d, tc.remove)
			}
			if !tc.remove {
				return
			}
			want := machine.Tombstone{Key: key, State: tc.rec.State, Fingerprint: fp1, CompletedAt: t0, RemovedAt: tc.at, Until: tc.at.Add(rules.TombstoneRetention)}
			if *d.Tombstone != want {
				t.Errorf("tombstone %+v, want %+v", *d.Tombstone, want)
			}
			if len(d.Guards) != 1 || d.Guards[0] != (machine.Guard{Kind: machine.RecordAt, Key: key, Rev: rev}) {
				t.Errorf("guards %+v, want the record unchanged since %d", d.Guards, rev)
			}
		})
	}
}
