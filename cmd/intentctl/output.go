package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Output formats of -o. The default is for people; json and yaml are the
// response itself, for scripts; wide is the people's form with more columns.
const (
	formatText = "text"
	formatWide = "wide"
	formatJSON = "json"
	formatYAML = "yaml"
)

var formats = []string{formatText, formatWide, formatJSON, formatYAML}

// Document formats. Default values are shown, so that "accepted": false in
// a history entry is visible rather than absent.
var (
	pretty  = protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitDefaultValues: true}
	oneLine = protojson.MarshalOptions{EmitDefaultValues: true}
)

// timeLayout is every time intentctl prints for people: UTC, fixed width,
// milliseconds (history entries a few milliseconds apart stay ordered).
const timeLayout = "2006-01-02T15:04:05.000Z"

// output prints responses in the format of -o.
type output struct {
	format string
}

func (o *output) check() error {
	if !slices.Contains(formats, o.format) {
		return usagef("-o %q: want %s", o.format, strings.Join(formats, ", "))
	}
	return nil
}

// machine reports whether the response itself is printed (json, yaml).
func (o *output) machine() bool { return o.format == formatJSON || o.format == formatYAML }

func (o *output) wide() bool { return o.format == formatWide }

// print writes m as json or yaml, or, for people, as text does.
func (o *output) print(w io.Writer, m proto.Message, text func(w io.Writer, wide bool) error) error {
	switch o.format {
	case formatJSON:
		return printProto(w, pretty, m)
	case formatYAML:
		b, err := oneLine.Marshal(m)
		if err != nil {
			return err
		}
		// protojson first, so that field names, enums, timestamps and
		// int64s read as in JSON; yaml is its re-encoding.
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	}
	return text(w, o.wide())
}

func printProto(w io.Writer, opts protojson.MarshalOptions, m proto.Message) error {
	b, err := opts.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// table aligns tab-separated cells into columns two spaces apart.
func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// row writes cells as one table line; an empty cell prints "-", so that
// every column of every line holds something and awk '{print $2}' works.
func row(w io.Writer, cells ...string) {
	for i, c := range cells {
		if c == "" {
			c = "-"
		}
		cells[i] = clean(c)
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// clean escapes what in s could mislead whoever reads it in a terminal, in
// Go's spelling (\x1b, \n, \u202e): control characters, with which what
// workers, approvers and reviewers write (keys, labels, summaries, reasons,
// worker names, references) could send the terminal escape sequences that
// rewrite what is shown, or break the table's columns and lines; and the
// invisible characters that reorder text (bidi), with which a label value
// holding U+202E, right-to-left override, shows the text and columns after
// it backwards. Every user-supplied string intentctl prints for people goes
// through it (row, get's summary lines, watch's lines, messages and
// refusals); -o json and -o yaml print the response exactly as it came.
func clean(s string) string {
	if !strings.ContainsFunc(s, misleading) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if misleading(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// misleading reports whether r is a control character (Unicode's Cc), a
// bidi control (U+061C arabic letter mark, U+200E and U+200F the
// left-to-right and right-to-left marks, U+202A to U+202E the embeddings
// and overrides, U+2066 to U+2069 the isolates), or a line or paragraph
// separator (U+2028, U+2029), which some terminals break lines at.
func misleading(r rune) bool {
	switch {
	case unicode.IsControl(r),
		r == '\u061c', r == '\u200e', r == '\u200f',
		'\u202a' <= r && r <= '\u202e',
		'\u2066' <= r && r <= '\u2069',
		r == '\u2028', r == '\u2029':
		return true
	}
	return false
}

func stamp(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(timeLayout)
}

// stateName is STATE_NEEDS_REVIEW without its prefix.
func stateName(s intentv1.State) string { return strings.TrimPrefix(s.String(), "STATE_") }

func kindName(k intentv1.HistoryEntry_Kind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "KIND_"))
}

func modeName(m intentv1.LeaseMode) string {
	if m == intentv1.LeaseMode_LEASE_MODE_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(m.String(), "LEASE_MODE_"))
}

// short is the first 12 hex digits of a fingerprint: enough to tell two
// apart by eye (-o wide prints all 64).
func short(fp string, wide bool) string {
	if wide || len(fp) <= 12 {
		return fp
	}
	return fp[:12]
}

func token(t uint64) string {
	if t == 0 {
		return ""
	}
	return fmt.Sprint(t)
}

// pairsText is a map as "a=1,b=2", sorted by name.
func pairsText(m map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return strings.Join(out, ",")
}

// resultText summarizes a result: its external references and the size of
// its payload (the payload itself is the json output's business).
func resultText(r *intentv1.Result) string {
	if r == nil {
		return ""
	}
	s := pairsText(r.GetExternalRefs())
	if n := len(r.GetPayload()); n > 0 {
		s = strings.TrimPrefix(s+fmt.Sprintf(", payload %d bytes", n), ", ")
	}
	if s == "" {
		s = "(empty)"
	}
	return s
}

func failureText(f *intentv1.Failure) string {
	if f == nil {
		return ""
	}
	if f.GetMessage() == "" {
		return f.GetCode()
	}
	return f.GetCode() + ": " + f.GetMessage()
}

// leaseText is who holds an intent, under which token, until when.
func leaseText(l *intentv1.Lease) string {
	if l == nil || l.GetToken() == 0 {
		return ""
	}
	s := fmt.Sprintf("%s, token %d, %s", l.GetWorker(), l.GetToken(), modeName(l.GetMode()))
	switch {
	case l.GetLive():
		return s + ", live until " + stamp(l.GetExpiresAt())
	case l.GetExpiresAt() != nil:
		return s + ", lapsed at " + stamp(l.GetExpiresAt())
	}
	return s + ", ended" // superseded, or the intent is decided

}

// what is what a person reads an intent as: the action and the identity
// fields its key was derived from, "refund.issue · order_id=ORD-88412 ·
// return_id=RA-20931", fields by name; empty when its registration gave
// neither.
func what(in *intentv1.Intent) string {
	var parts []string
	if a := in.GetAction(); a != "" {
		parts = append(parts, a)
	}
	fields := in.GetIdentity().GetFields()
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		parts = append(parts, name+"="+valueText(fields[name]))
	}
	return strings.Join(parts, " · ")
}

// valueText is an identity value as a person reads it: a string as it is,
// anything else as compact JSON (7, true, ["a","b"]).
func valueText(v *structpb.Value) string {
	if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
		return s.StringValue
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v.AsInterface()); err != nil {
		return "?"
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func attemptsText(in *intentv1.Intent) string {
	if in.GetMaxAttempts() == 0 {
		return fmt.Sprint(in.GetAttempts())
	}
	return fmt.Sprintf("%d of %d", in.GetAttempts(), in.GetMaxAttempts())
}

// printIntent is get's text: a summary, then the history as a timeline.
func printIntent(w io.Writer, in *intentv1.Intent, wide bool) error {
	tw := table(w)
	line := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", name, clean(value))
		}
	}
	// What the intent is comes first: a derived key is 64 hex digits, and
	// the action, identity and summary say what it stands for.
	line("what", what(in))
	line("summary", in.GetSummary())
	line("key", in.GetKey())
	line("tenant", in.GetTenant())
	line("state", stateName(in.GetState()))
	line("fingerprint", short(in.GetFingerprint(), wide))
	line("params_version", in.GetParamsVersion())
	if wide {
		if b, err := oneLine.Marshal(in.GetParams()); err == nil {
			line("params", string(b))
		}
	}
	line("attempts", attemptsText(in))
	line("lease", leaseText(in.GetLease()))
	line("result", resultText(in.GetResult()))
	line("failure", failureText(in.GetFailure()))
	line("labels", pairsText(in.GetLabels()))
	line("parent", in.GetParentKey())
	for _, c := range in.GetChildren() {
		line("child", c.GetKey()+" "+stateName(c.GetState()))
	}
	line("created", stamp(in.GetCreatedAt()))
	line("updated", stamp(in.GetUpdatedAt()))
	line("completed", stamp(in.GetCompletedAt()))
	line("retain_until", stamp(in.GetRetainUntil()))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printHistory(w, in.GetHistory(), wide)
}

// printHistory is the history as a timeline: one line per event.
func printHistory(w io.Writer, history []*intentv1.HistoryEntry, wide bool) error {
	tw := table(w)
	head := []string{"TIME", "EVENT", "BY", "TOKEN", "ACCEPTED", "DETAIL"}
	if wide {
		head = append(head, "SESSION")
	}
	row(tw, head...)
	for _, h := range history {
		cells := []string{stamp(h.GetTime()), kindName(h.GetKind()), who(h), token(h.GetToken()), accepted(h), detail(h)}
		if wide {
			cells = append(cells, h.GetSessionId())
		}
		row(tw, cells...)
	}
	return tw.Flush()
}

// who acted: the worker for a worker's event, else the principal.
func who(h *intentv1.HistoryEntry) string {
	if h.GetWorker() != "" {
		return h.GetWorker()
	}
	return h.GetPrincipal()
}

// accepted says whether the event changed the intent: "no" marks a report
// under a superseded token, kept only as evidence.
func accepted(h *intentv1.HistoryEntry) string {
	if h.GetAccepted() {
		return "yes"
	}
	return "no"
}

// detail is what else the event says: the mode of a lease, the decided
// state, the result or failure, the reason.
func detail(h *intentv1.HistoryEntry) string {
	var parts []string
	add := func(s string) {
		if s != "" {
			parts = append(parts, s)
		}
	}
	add(modeName(h.GetMode()))
	if h.GetResolvedState() != intentv1.State_STATE_UNSPECIFIED {
		add("→ " + stateName(h.GetResolvedState()))
	}
	if r := h.GetResult(); r != nil {
		add(pairsText(r.GetExternalRefs()))
	}
	add(failureText(h.GetFailure()))
	if h.GetReason() != "" {
		add(fmt.Sprintf("%q", h.GetReason()))
	}
	return strings.Join(parts, " ")
}

// printIntents is list's text: one line per intent, oldest first.
func printIntents(w io.Writer, intents []*intentv1.Intent, next string, wide bool) error {
	if len(intents) == 0 && next == "" {
		_, err := fmt.Fprintln(w, "(no intents)")
		return err
	}
	tw := table(w)
	// WHAT and SUMMARY, free text, come last, so that the columns before
	// them stay one word each for awk and cut.
	head := []string{"KEY", "STATE", "ATTEMPTS", "HOLDER", "TOKEN", "UPDATED"}
	if wide {
		head = append(head, "CREATED", "FINGERPRINT", "PARAMS_VERSION", "RESULT", "LABELS")
	}
	head = append(head, "WHAT", "SUMMARY")
	row(tw, head...)
	for _, in := range intents {
		l := in.GetLease()
		holder := ""
		if l.GetToken() != 0 && l.GetLive() {
			holder = l.GetWorker()
		}
		cells := []string{in.GetKey(), stateName(in.GetState()), attemptsText(in), holder, token(l.GetToken()), stamp(in.GetUpdatedAt())}
		if wide {
			cells = append(cells, stamp(in.GetCreatedAt()), short(in.GetFingerprint(), false), in.GetParamsVersion(),
				firstNonEmpty(resultText(in.GetResult()), failureText(in.GetFailure())), pairsText(in.GetLabels()))
		}
		cells = append(cells, what(in), in.GetSummary())
		row(tw, cells...)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(w, "(more: --page-token %s, or --all)\n", next)
	}
	return nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// event prints one change of a watch as it arrives: a line (json: one
// protojson object per line; yaml: one document each), never a table,
// whose columns would need every line before the first is out.
func (o *output) event(w io.Writer, ev *intentv1.WatchResponse) error {
	switch o.format {
	case formatJSON:
		return printProto(w, oneLine, ev)
	case formatYAML:
		if _, err := io.WriteString(w, "---\n"); err != nil {
			return err
		}
		return o.print(w, ev, nil)
	}
	kind := strings.ToLower(strings.TrimPrefix(ev.GetType().String(), "TYPE_"))
	in := ev.GetIntent()
	if in == nil {
		_, err := fmt.Fprintf(w, "rev %d  %s\n", ev.GetRevision(), kind)
		return err
	}
	s := fmt.Sprintf("rev %d  %s  %s  %s", ev.GetRevision(), kind, in.GetKey(), stateName(in.GetState()))
	if l := in.GetLease(); l.GetToken() != 0 {
		s += fmt.Sprintf("  token %d %s", l.GetToken(), l.GetWorker())
	}
	if o.wide() {
		s += "  " + stamp(in.GetUpdatedAt())
	}
	_, err := fmt.Fprintln(w, clean(s))
	return err
}
