package main

import (
	"strings"
	"testing"
	"time"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// clean escapes every character that could rewrite a terminal or reorder
// what a person reads, and nothing else: right-to-left text itself, accents
// and emoji print as they are.
func TestCleanEscapesControlAndBidiCharacters(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"SO-71", "SO-71"},
		{"Grüße, שלום, مرحبا, 👍", "Grüße, שלום, مرحبا, 👍"},
		{"a\x1b[2Jb", `a\x1b[2Jb`},
		{"line one\nline two\r\t", `line one\nline two\r\t`},
		{"\x00\x7f\u0085", `\x00\x7f\u0085`},
		{"ok \u202eevil", `ok \u202eevil`},
		{"\u202a\u202b\u202c\u202d\u202e", `\u202a\u202b\u202c\u202d\u202e`},
		{"\u2066\u2067\u2068\u2069", `\u2066\u2067\u2068\u2069`},
		{"\u200e\u200f\u061c", `\u200e\u200f\u061c`},
		{"one\u2028two\u2029", `one\u2028two\u2029`},
	} {
		if got := clean(tc.in); got != tc.want {
			t.Errorf("clean(%+q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// A label value, a summary, an identity value, a reason and a worker's
// name holding bidi controls print escaped in every table and line for
// people (get, history, list, review-queue, watch, resolve's answer),
// while -o json gives them exactly as stored.
func TestTextOutputEscapesBidiControls(t *testing.T) {
	f := newFixture(t)
	key := f.described("bidi", map[string]string{"run": f.run, "note": "ok \u202eevil"}, "Refund \u2067Alice\u2069 40.00 USD")
	w := startWatchingAs(t, "text", key)
	printed := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(w.out.String(), what); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("watch printed no %q within 30s:\n%s", what, w.out.String())
			}
		}
	}
	printed("created") // established: the resolution is not missed
	mustRun(t, "resolve", key, "--decision", "cancelled", "--actor", "rev\u202eiewer", "--reason", "dup\u200flicate")
	printed("CANCELLED")
	w.stop(t)
	outputs := map[string]string{"watch": w.out.String()}
	for _, args := range [][]string{
		{"get", key}, {"get", key, "-o", "wide"}, {"history", key},
		{"list", "--label", f.label()}, {"list", "--label", f.label(), "-o", "wide"},
		{"resolve", key, "--decision", "cancelled", "--actor", "rev\u202eiewer", "--reason", "dup\u200flicate"},
	} {
		outputs[strings.Join(args, " ")] = mustRun(t, args...)
	}
	bidi := func(r rune) bool { return misleading(r) && r > 0x7f }
	for name, out := range outputs {
		if strings.ContainsFunc(out, bidi) {
			t.Errorf("%s printed a raw bidi control:\n%+q", name, out)
		}
	}
	for name, want := range map[string][]string{
		"get " + key:                             {`note=ok \u202eevil`, `Refund \u2067Alice\u2069 40.00 USD`, "refund.issue · order_id=ORD-88412"},
		"history " + key:                         {`rev\u202eiewer`, `dup\u200flicate`},
		"list --label " + f.label():              {`Refund \u2067Alice\u2069 40.00 USD`},
		"list --label " + f.label() + " -o wide": {`note=ok \u202eevil`},
	} {
		for _, w := range want {
			if !strings.Contains(outputs[name], w) {
				t.Errorf("%s lacks %s:\n%s", name, w, outputs[name])
			}
		}
	}
	in := decode(t, mustJSON(t, "get", key), &intentv1.GetResponse{}).GetIntent()
	if in.GetLabels()["note"] != "ok \u202eevil" || in.GetSummary() != "Refund \u2067Alice\u2069 40.00 USD" {
		t.Errorf("-o json: label %+q, summary %+q; want them exactly as registered", in.GetLabels()["note"], in.GetSummary())
	}
}

// register takes --action, --identity and --summary: without KEY intentd
// derives it (and intentctl prints it), with KEY it must be the
// derivation; --identity needs --action, and KEY is needed without
// --identity.
func TestRegisterDescribed(t *testing.T) {
	f := newFixture(t)
	identity := `{"order_id": "ORD-88412", "return_id": "RA-` + f.run + `"}`
	want, _, err := intent.DeriveKey("refund.issue", map[string]any{"order_id": "ORD-88412", "return_id": "RA-" + f.run})
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"register", "--action", "refund.issue", "--identity", identity, "--summary", "Refund 40.00 USD to Alice for ORD-88412",
		"--params", `{"amount_cents": 4000, "currency": "USD"}`}
	if out := mustRun(t, args...); out != "registered "+want+": now PENDING (created)\n" {
		t.Errorf("register without KEY: %q, want the derived key %s", out, want)
	}
	in := decode(t, mustJSON(t, "get", want), &intentv1.GetResponse{}).GetIntent()
	if in.GetAction() != "refund.issue" || in.GetSummary() != "Refund 40.00 USD to Alice for ORD-88412" || in.GetIdentity().GetFields()["order_id"].GetStringValue() != "ORD-88412" {
		t.Errorf("registered %v, want action, identity and summary", in)
	}
	if out := mustRun(t, append([]string{"register", want}, args[1:]...)...); !strings.Contains(out, "already registered, same params") {
		t.Errorf("register with the derived KEY: %q, want already registered", out)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"KEY not the derivation", append([]string{"register", f.key("refund")}, args[1:]...), exitFailure, "field: key"},
		{"--identity without --action", []string{"register", "--identity", identity, "--params", `{"a": 1}`}, exitUsage, "--identity needs --action"},
		{"neither KEY nor --identity", []string{"register", "--action", "refund.issue", "--params", `{"a": 1}`}, exitUsage, "register needs KEY"},
		{"--identity not an object", []string{"register", "--action", "a", "--identity", `["x"]`, "--params", `{"a": 1}`}, exitUsage, "--identity"},
		{"a summary on two lines", []string{"register", f.key("two-lines"), "--summary", "one\ntwo", "--params", `{"a": 1}`}, exitFailure, "field: summary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := intentctl(t, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
}
