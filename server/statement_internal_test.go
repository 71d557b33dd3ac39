package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// A statement names its intent by key, and adds the approver's summary,
// quoted, when the registration gave one. Without a summary every text is
// word for word what it was before summaries existed (agents, tests and
// other languages match them); with one, only the intent's name changes,
// and a summary's quotes, backslashes and bidi controls stay escaped inside
// its quotation.
func TestStatementsNameTheSummary(t *testing.T) {
	done := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	lease := &intent.Lease{Token: 896, Mode: intent.ModeExecute, Worker: "w-1"}
	for _, tc := range []struct {
		outcome intent.Outcome
		state   intent.State
		lease   *intent.Lease
		text    string // of intent "k" without a summary
	}{
		{intent.OutcomeExecute, intent.StateInProgress, lease,
			"execute: you hold intent k under token 896; perform it once, sending operation keys such as k:create-order downstream"},
		{intent.OutcomeReconcile, intent.StateInProgress, lease,
			"reconcile: an earlier attempt at intent k may have taken effect; you hold token 896; ask the downstream system by operation key before acting"},
		{intent.OutcomeCompleted, intent.StateCompleted, nil,
			`already_completed: intent k completed at 2026-12-01T15:00:00Z with {"refund_id":"RF-1"}; action_taken: none`},
		{intent.OutcomeFailed, intent.StateFailed, nil,
			"already_failed: intent k failed (card_declined); action_taken: none"},
		{intent.OutcomeCancelled, intent.StateCancelled, nil,
			"cancelled: intent k was withdrawn; action_taken: none"},
		{intent.OutcomeInProgress, intent.StateInProgress, lease,
			`in_progress: intent k is held by worker "w-1"; wait and acquire again; action_taken: none`},
		{intent.OutcomeNeedsReview, intent.StateNeedsReview, nil,
			"needs_review: intent k waits for a human decision; action_taken: none"},
		{intent.OutcomeExpired, intent.StateCompleted, nil,
			"expired: intent k outlived its retention (it was COMPLETED); it needs a new approval; action_taken: none"},
	} {
		t.Run(tc.outcome.String(), func(t *testing.T) {
			in := &intent.Intent{Key: "k", State: tc.state, CompletedAt: done,
				Result:  &intent.Result{ExternalRefs: map[string]string{"refund_id": "RF-1"}},
				Failure: &intent.Failure{Code: "card_declined"}}
			a := &intent.Acquisition{Outcome: tc.outcome, Intent: in, Lease: tc.lease}
			if got := statement(a).GetText(); got != tc.text {
				t.Errorf("without a summary:\n%s\nwant\n%s", got, tc.text)
			}
			for summary, name := range map[string]string{
				"Refund 40.00 USD to Alice":    `k ("Refund 40.00 USD to Alice")`,
				`say "done" \ now`:             `k ("say \"done\" \\ now")`,
				"Refund \u202eDSU 00.04\u2066": `k ("Refund \u202eDSU 00.04\u2066")`,
			} {
				in.Summary = summary
				want := strings.Replace(tc.text, "intent k ", "intent "+name+" ", 1)
				if got := statement(a).GetText(); got != want {
					t.Errorf("with summary %q:\n%s\nwant\n%s", summary, got, want)
				}
			}
		})
	}
	// A refused report's statement names the intent as Acquire's do.
	in := &intent.Intent{Key: "k", State: intent.StateCompleted, Summary: "Refund 40.00 USD to Alice"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&intent.TransitionError{Key: "k", State: intent.StateCompleted, Call: "Fail", Intent: in},
			`refused: Fail is not allowed on intent k ("Refund 40.00 USD to Alice") in state COMPLETED; action_taken: none`},
		{&intent.StaleTokenError{Key: "k", Token: 5, Current: 9, Intent: in},
			`stale_token: a newer lease (token 9) superseded yours on intent k ("Refund 40.00 USD to Alice"); your report changed nothing and is kept as evidence; acquire again to learn what to do; action_taken: evidence_recorded`},
		{&intent.TransitionError{Key: "k", State: intent.StateCompleted, Call: "Fail"},
			"refused: Fail is not allowed on intent k in state COMPLETED; action_taken: none"},
	} {
		var text string
		for _, d := range status.Convert(toStatus(slog.New(slog.DiscardHandler), tc.err)).Details() {
			if st, ok := d.(*intentv1.Statement); ok {
				text = st.GetText()
			}
		}
		if text != tc.want {
			t.Errorf("refusal of %v: statement %q, want %q", tc.err, text, tc.want)
		}
	}
}

// An intent registered without action, identity or summary (every intent
// stored before they existed) is answered in exactly the bytes it was
// before: the new fields are absent from the encoding, not empty, so a
// replay kept or sent by an earlier version and one sent now are the same
// bytes. A described intent's kept answer is, byte for byte, its fresh
// conversion.
func TestDescriptionAddsNoBytesUnlessGiven(t *testing.T) {
	wire := func(r proto.Message) string {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	plain := acquireResponse(completedAcquisition())
	if plain.GetIntent().Identity != nil {
		t.Errorf("identity of an intent without one = %v, want it absent", plain.GetIntent().GetIdentity())
	}
	for b := []byte(wire(plain.GetIntent())); len(b) > 0; {
		n, _, size := protowire.ConsumeField(b)
		if size < 0 {
			t.Fatalf("intent encoding does not parse: %v", protowire.ParseError(size))
		}
		if n == 22 || n == 23 || n == 24 { // Intent's action, identity, summary
			t.Errorf("an undescribed intent's encoding holds field %d", n)
		}
		b = b[size:]
	}

	a := completedAcquisition()
	a.Intent.Action, a.Intent.Identity, a.Intent.Summary = "refund.issue", []byte(`{"order_id":"ORD-88412","return_id":"RA-20931"}`), "Refund 40.00 USD to Alice"
	fresh := *a
	a.Memo = new(intent.Memo)
	sent := wire(acquireResponse(a))
	if want := wire(acquireResponse(&fresh)); sent != want {
		t.Errorf("kept answer of a described intent differs from its fresh conversion:\n%q\nwant\n%q", sent, want)
	}
	kept := new(intentv1.AcquireResponse) // as the client reads it
	if err := proto.Unmarshal([]byte(sent), kept); err != nil {
		t.Fatal(err)
	}
	if got := kept.GetIntent().GetIdentity().GetFields()["return_id"].GetStringValue(); got != "RA-20931" {
		t.Errorf("kept answer's identity %v, want return_id RA-20931", kept.GetIntent().GetIdentity())
	}
	stripped := proto.CloneOf(kept)
	stripped.Intent.Action, stripped.Intent.Identity, stripped.Intent.Summary = "", nil, ""
	stripped.Statement.Text = plain.GetStatement().GetText()
	if wire(stripped) != wire(plain) {
		t.Error("a described answer without its description is not the undescribed answer")
	}
}
