package server

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

// codeName is a code as the proto and the README spell it (FAILED_PRECONDITION).
func codeName(c codes.Code) string {
	return strings.ToUpper(regexp.MustCompile(`([a-z])([A-Z])`).ReplaceAllString(c.String(), "${1}_${2}"))
}

// TestEveryReasonIsDeclaredEverywhere: the proto's ErrorReason is the one
// vocabulary; the error table gives every reason a code, the proto's comment
// on each value names the same code, and the README's error table lists each
// reason once, with that code.
func TestEveryReasonIsDeclaredEverywhere(t *testing.T) {
	all := vocab.Reasons()
	for _, r := range all {
		if _, ok := codeOf[r]; !ok {
			t.Errorf("the error table has no code for %v", r)
		}
	}
	for r := range codeOf {
		if !slices.Contains(all, r) {
			t.Errorf("the error table has %v, which the proto's ErrorReason does not declare", r)
		}
	}

	t.Run("proto comments", func(t *testing.T) {
		src, err := os.ReadFile("../proto/intent/v1/intent.proto")
		if err != nil {
			t.Fatal(err)
		}
		// Each value's comment begins with its code: "// ABORTED: ...".
		value := regexp.MustCompile(`(?m)^  // ([A-Z_]+): (?:.*\n  //.*)*.*\n  ERROR_REASON_([A-Z_]+) = \d+;`)
		got := map[string]string{}
		for _, m := range value.FindAllStringSubmatch(string(src), -1) {
			got[m[2]] = m[1]
		}
		for _, r := range all {
			if got, want := got[vocab.Reason(r)], codeName(codeOf[r]); got != want {
				t.Errorf("proto comment of %v names code %q, want %q (the error table's)", r, got, want)
			}
		}
	})

	t.Run("README", func(t *testing.T) {
		readme, err := os.ReadFile("../README.md")
		if err != nil {
			t.Fatal(err)
		}
		_, table, ok := strings.Cut(string(readme), "| code | reason | meaning |\n|---|---|---|\n")
		if !ok {
			t.Fatal("README has no error table (| code | reason | meaning |)")
		}
		table, _, _ = strings.Cut(table, "\n\n")
		ticked := regexp.MustCompile("`([A-Z_]+)`")
		listed := map[string]int{}
		for _, row := range strings.Split(table, "\n") {
			cells := strings.Split(row, "|")
			if len(cells) < 4 {
				t.Fatalf("README error table row %q has fewer than three cells", row)
			}
			var rowCodes []string
			for _, m := range ticked.FindAllStringSubmatch(cells[1], -1) {
				rowCodes = append(rowCodes, m[1])
			}
			for _, m := range ticked.FindAllStringSubmatch(cells[2], -1) {
				reason := m[1]
				listed[reason]++
				r, ok := vocab.ParseReason(reason)
				if !ok {
					t.Errorf("README lists reason %s, which the proto's ErrorReason does not declare", reason)
					continue
				}
				if want := codeName(codeOf[r]); !slices.Contains(rowCodes, want) {
					t.Errorf("README lists %s with codes %v, want %s (the error table's)", reason, rowCodes, want)
				}
			}
		}
		for _, r := range all {
			if n := listed[vocab.Reason(r)]; n != 1 {
				t.Errorf("README lists %s %d times, want once", vocab.Reason(r), n)
			}
		}
	})
}

// TestWithDetailsSendsTheWireReason: the reason on the wire is the enum
// value's name without its ERROR_REASON_ prefix, and the code the table's.
func TestWithDetailsSendsTheWireReason(t *testing.T) {
	st := status.Convert(withDetails(intentv1.ErrorReason_ERROR_REASON_RATE_LIMITED, "slow down", nil))
	if got, want := st.Code(), codes.ResourceExhausted; got != want {
		t.Errorf("code = %v, want %v", got, want)
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil {
		t.Fatalf("details = %v, want an ErrorInfo", st.Details())
	}
	if got, want := info.GetReason(), "RATE_LIMITED"; got != want {
		t.Errorf("reason = %q, want %q", got, want)
	}
	if got, want := info.GetDomain(), ErrorDomain; got != want {
		t.Errorf("domain = %q, want %q", got, want)
	}
}

// TestStatementsSpeakTheProtosWords: every Statement status and action_taken
// intentd sends is a word of the proto's StatementStatus and ActionTaken, and
// every word of StatementStatus is sent by some outcome or refusal.
func TestStatementsSpeakTheProtosWords(t *testing.T) {
	statuses, actions := map[string]bool{}, map[string]bool{}
	see := func(st *intentv1.Statement) {
		statuses[st.GetStatus()] = true
		actions[st.GetActionTaken()] = true
	}
	for o := intent.OutcomeExecute; o <= intent.OutcomeExpired; o++ {
		st := statement(&intent.Acquisition{
			Outcome: o,
			Intent:  &intent.Intent{Key: "k", State: intent.StatePending},
			Lease:   &intent.Lease{Token: 1, Worker: "w"},
		})
		see(st)
		// The text an agent reads opens with the same word.
		if !strings.HasPrefix(st.GetText(), st.GetStatus()+": ") {
			t.Errorf("outcome %v: text %q does not open with its status %q", o, st.GetText(), st.GetStatus())
		}
	}
	in := &intent.Intent{Key: "k", State: intent.StateCompleted}
	for _, evidence := range []bool{false, true} {
		see(refusal(intentv1.StatementStatus_STATEMENT_STATUS_STALE_TOKEN, "stale_token: t", in, 2, evidence))
		see(refusal(intentv1.StatementStatus_STATEMENT_STATUS_REFUSED, "refused: t", in, 0, evidence))
	}

	var wantStatuses []string
	for _, s := range vocab.Statuses() {
		wantStatuses = append(wantStatuses, vocab.Status(s))
	}
	if got := slices.Sorted(maps.Keys(statuses)); !slices.Equal(got, slices.Sorted(slices.Values(wantStatuses))) {
		t.Errorf("statuses sent = %q, want StatementStatus's %q", got, slices.Sorted(slices.Values(wantStatuses)))
	}
	var wantActions []string
	for _, a := range vocab.Actions() {
		wantActions = append(wantActions, vocab.Action(a))
	}
	for a := range actions {
		if !slices.Contains(wantActions, a) {
			t.Errorf("action_taken %q sent, which ActionTaken does not declare (%q)", a, wantActions)
		}
	}
}
