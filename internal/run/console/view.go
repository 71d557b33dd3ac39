package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// stateWord is a state as the pages say it: UNKNOWN, NEEDS_REVIEW.
func stateWord(s intentv1.State) string { return strings.TrimPrefix(s.String(), "STATE_") }

// stateClass is the CSS class of a state's badge.
func stateClass(word string) string {
	return "state-" + strings.ToLower(strings.ReplaceAll(word, "_", "-"))
}

// age says how long ago t was, in the largest whole unit that fits.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(0, int(d.Seconds())))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

// clock is a time as the timeline shows it: UTC, to the second.
func clock(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

func funcs(now func() time.Time) template.FuncMap {
	return template.FuncMap{
		"stateClass": stateClass,
		"clock":      clock,
		"iso":        func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"age":        func(t time.Time) string { return age(t, now()) },
		"bidi":       bidi,
		"key":        keyHTML,
		"errorFor":   func(f *decideForm, k string) string { return f.Errors[k] },
		"checked":    func(a, b string) bool { return a == b },
		"q":          url.QueryEscape,
	}
}

// bidi and the template funcs built on it isolate every string a caller
// or a person supplied (keys, summaries, actions, identity and params
// values, labels, reasons, names, references) in a <bdi> of its own, so
// that a right-to-left override (U+202E) or right-to-left text in one
// cannot reorder what the page shows after it.
func bidi(s string) template.HTML {
	return template.HTML("<bdi>" + template.HTMLEscapeString(balanced(s)) + "</bdi>")
}

// balanced is s without the U+2069 (pop directional isolate) characters
// that close no isolate s opened itself. Chromium lets such a character
// close the <bdi> around it, after which an override in s applies to the
// rest of the line; a string that means no harm never holds one.
func balanced(s string) string {
	if !strings.ContainsRune(s, '\u2069') {
		return s
	}
	var b strings.Builder
	open := 0
	for _, r := range s {
		switch r {
		case '\u2066', '\u2067', '\u2068': // LRI, RLI, FSI
			open++
		case '\u2069':
			if open == 0 {
				continue
			}
			open--
		}
		b.WriteRune(r)
	}
	return b.String()
}

// phrase is a sentence of ours with supplied strings in it: format is
// escaped as text, each value isolated (see bidi) where its %s stands.
func phrase(format string, values ...string) template.HTML {
	args := make([]any, len(values))
	for i, v := range values {
		args[i] = bidi(v)
	}
	return template.HTML(fmt.Sprintf(template.HTMLEscapeString(format), args...))
}

// isolated is s as plain text that cannot reorder what follows it, where
// no element can be put around it (a flash message, a title): between FSI
// and PDI. ASCII text has no right-to-left letter and no directional
// control, so it is left as it is.
func isolated(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return "\u2068" + balanced(s) + "\u2069"
		}
	}
	return s
}

// keyView is a key as the pages show it. A key DeriveKey made is 64 hex
// digits that say nothing to a person and would widen a column: it is
// shown shortened, the whole of it in Full (a title, and the intent
// page's details). Any other key is shown whole.
type keyView struct{ Full, Short string }

func newKeyView(key string) keyView {
	k := keyView{Full: key, Short: key}
	if derivedKey(key) {
		k.Short = key[:12] + "…" + key[len(key)-6:]
	}
	return k
}

// derivedKey reports whether key has the shape of a derived key: 64
// lowercase hex digits.
func derivedKey(key string) bool {
	if len(key) != 64 {
		return false
	}
	for _, c := range key {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// keyHTML shows a key, isolated, shortened when it is derived (the whole
// key in its title).
func keyHTML(k keyView) template.HTML {
	if k.Short == k.Full {
		return template.HTML(`<bdi class="key">` + template.HTMLEscapeString(k.Full) + `</bdi>`)
	}
	return template.HTML(`<bdi class="key" title="` + template.HTMLEscapeString(k.Full) + `">` + template.HTMLEscapeString(k.Short) + `</bdi>`)
}

// described is what the registration says the intent is, in the
// approver's words: the summary, the action and the identity fields the
// key was derived from. The pages lead with it; nothing of it is guessed
// from the key or the params.
type described struct {
	Summary, Action string
	Identity        []term
}

func newDescribed(in *intentv1.Intent) described {
	d := described{Summary: in.GetSummary(), Action: in.GetAction()}
	f := in.GetIdentity().GetFields()
	for _, k := range slices.Sorted(maps.Keys(f)) {
		d.Identity = append(d.Identity, term{k, valueText(f[k])})
	}
	return d
}

// Any reports whether the registration described the intent at all.
func (d described) Any() bool { return d.Summary != "" || d.Action != "" || len(d.Identity) > 0 }

// queueRow is one line of the review queue.
type queueRow struct {
	described
	Key      keyView
	Link     string
	State    string
	Since    time.Time
	Age      string
	Terms    []term // the approved params as they are, the first few
	More     int    // how many params are not in Terms
	Labels   []term
	Why      template.HTML
	Attempts string
}

// queueTerms and queueValue bound what a queue row shows of the params:
// the intent page shows them all, whole.
const (
	queueTerms = 6
	queueValue = 80
)

func newQueueRow(in *intentv1.Intent, now time.Time) queueRow {
	since := ts(in.GetUpdatedAt())
	if e := lastWhy(in.GetHistory()); e != nil {
		since = ts(e.GetTime())
	}
	r := queueRow{
		described: newDescribed(in), Key: newKeyView(in.GetKey()), Link: intentURL(in.GetTenant(), in.GetKey()),
		State: stateWord(in.GetState()), Since: since, Age: age(since, now), Why: why(in),
	}
	f := in.GetParams().GetFields()
	for i, k := range slices.Sorted(maps.Keys(f)) {
		if i == queueTerms {
			r.More = len(f) - queueTerms
			break
		}
		r.Terms = append(r.Terms, term{k, cut(valueText(f[k]), queueValue)})
	}
	r.Labels = labels(in.GetLabels())
	if in.GetMaxAttempts() > 0 {
		r.Attempts = fmt.Sprintf("%d of %d", in.GetAttempts(), in.GetMaxAttempts())
	}
	return r
}

// cut shortens s to n characters, marking the cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func labels(m map[string]string) []term {
	var out []term
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, term{k, m[k]})
	}
	return out
}

// lastWhy is the history entry that put the intent where it is: the last
// MarkUnknown, lapsed lease or escalation.
func lastWhy(h []*intentv1.HistoryEntry) *intentv1.HistoryEntry {
	for i := len(h) - 1; i >= 0; i-- {
		switch e := h[i]; e.GetKind() {
		case intentv1.HistoryEntry_KIND_MARKED_UNKNOWN, intentv1.HistoryEntry_KIND_ESCALATED:
			if e.GetAccepted() {
				return e
			}
		case intentv1.HistoryEntry_KIND_LEASE_LAPSED:
			return e
		}
	}
	return nil
}

// why says in a line why the intent waits for a person.
func why(in *intentv1.Intent) template.HTML {
	e := lastWhy(in.GetHistory())
	if e == nil {
		if in.GetState() == intentv1.State_STATE_UNKNOWN {
			return phrase("Lease lapsed: the worker's session ended without a report.")
		}
		return "—"
	}
	who := e.GetWorker()
	if who == "" {
		who = e.GetPrincipal()
	}
	switch e.GetKind() {
	case intentv1.HistoryEntry_KIND_MARKED_UNKNOWN:
		return phrase("Timeout: %s could not tell whether its call took effect", who) + colon(e.GetReason())
	case intentv1.HistoryEntry_KIND_LEASE_LAPSED:
		return phrase("Lapsed lease: %s's session ended before it reported.", who)
	default:
		if e.GetPrincipal() == "intentd" {
			return phrase("Too many attempts ended without a report") + colon(e.GetReason())
		}
		return phrase("Escalated by %s", who) + colon(e.GetReason())
	}
}

// colon ends a sentence with its reason, if it has one.
func colon(s string) template.HTML {
	if s == "" {
		return "."
	}
	return phrase(": %s", s)
}

// intentView is the intent page's summary of one intent.
type intentView struct {
	described
	Tenant, State                            string
	Key                                      keyView
	Fingerprint, ParamsVersion               string
	Parent                                   keyView
	ParentLink                               string
	Terms                                    []term
	Labels                                   []term
	Created, Updated, Completed, RetainUntil time.Time
	Attempts                                 string
	Lease                                    *leaseView
	Result                                   *resultView
	Failure                                  *intentv1.Failure
	Reports                                  []timelineEntry // the workers' reports, newest first
	Provider                                 []providerSaid
	Children                                 []childView
	Timeline                                 []timelineEntry
	Why                                      template.HTML
	Revision                                 int64
	// DecidedBy is the reviewer's decision that stands, when the last
	// word on the intent was a reviewer's.
	DecidedBy *timelineEntry
	// Decidable: the state a reviewer may decide (UNKNOWN, NEEDS_REVIEW).
	Decidable bool
	// HeldLive: a worker holds a live lease; a decision must wait.
	HeldLive bool
}

type term struct{ Name, Value string }

// leaseView is the current lease, for the mechanics. After a reviewer's
// decision (mode REVIEW) there is no holder: Worker is who decided.
type leaseView struct {
	Token             uint64
	Mode, Worker      string
	Session           string
	Acquired, Expires time.Time
	Live              bool
	Review            bool
}

type resultView struct {
	PayloadBytes int
	Payload      string // shown when it is short UTF-8 text
}

// providerSaid is a set of the provider's references as the intent came
// by them: its result, or a report that was kept as evidence.
type providerSaid struct {
	Refs   []term
	Source template.HTML
}

type childView struct {
	Key         keyView
	Link, State string
}

// timelineEntry is one history entry as the timeline shows it.
type timelineEntry struct {
	Time          time.Time
	Kind          string
	Headline      string
	Who           template.HTML
	Token         uint64
	Stale         bool
	Reason        string
	Refs          []term
	Failure       template.HTML
	ResolvedState string
	Channel       string
}

// reportKinds are the history entries that say what a worker reported
// (or that it reported nothing before its lease lapsed).
var reportKinds = map[intentv1.HistoryEntry_Kind]bool{
	intentv1.HistoryEntry_KIND_COMPLETED:      true,
	intentv1.HistoryEntry_KIND_MARKED_UNKNOWN: true,
	intentv1.HistoryEntry_KIND_RELEASED:       true,
	intentv1.HistoryEntry_KIND_FAILED:         true,
	intentv1.HistoryEntry_KIND_LEASE_LAPSED:   true,
	intentv1.HistoryEntry_KIND_ESCALATED:      true,
}

func newIntentView(in *intentv1.Intent, now time.Time) intentView {
	v := intentView{
		described: newDescribed(in), Tenant: in.GetTenant(), Key: newKeyView(in.GetKey()), State: stateWord(in.GetState()),
		Fingerprint: in.GetFingerprint(), ParamsVersion: in.GetParamsVersion(),
		Created: ts(in.GetCreatedAt()), Updated: ts(in.GetUpdatedAt()), Completed: ts(in.GetCompletedAt()), RetainUntil: ts(in.GetRetainUntil()),
		Failure: in.GetFailure(), Revision: in.GetRevision(), Why: why(in),
	}
	if p := in.GetParentKey(); p != "" {
		v.Parent, v.ParentLink = newKeyView(p), intentURL(v.Tenant, p)
	}
	f := in.GetParams().GetFields()
	for _, k := range slices.Sorted(maps.Keys(f)) {
		v.Terms = append(v.Terms, term{k, valueText(f[k])})
	}
	v.Labels = labels(in.GetLabels())
	if in.GetMaxAttempts() > 0 {
		v.Attempts = fmt.Sprintf("%d of %d", in.GetAttempts(), in.GetMaxAttempts())
	}
	if l := in.GetLease(); l != nil {
		v.Lease = &leaseView{Token: l.GetToken(), Mode: strings.TrimPrefix(l.GetMode().String(), "LEASE_MODE_"), Worker: l.GetWorker(),
			Session: l.GetSessionId(), Acquired: ts(l.GetAcquiredAt()), Expires: ts(l.GetExpiresAt()), Live: l.GetLive(),
			Review: l.GetMode() == intentv1.LeaseMode_LEASE_MODE_REVIEW}
	}
	if r := in.GetResult(); r != nil {
		rv := &resultView{PayloadBytes: len(r.GetPayload())}
		if p := r.GetPayload(); len(p) > 0 && len(p) <= 2048 && json.Valid(p) {
			rv.Payload = string(p)
		}
		v.Result = rv
		if refs := refs(r.GetExternalRefs()); len(refs) > 0 {
			v.Provider = append(v.Provider, providerSaid{Refs: refs, Source: phrase("The intent's result, as recorded.")})
		}
	}
	for _, c := range in.GetChildren() {
		v.Children = append(v.Children, childView{Key: newKeyView(c.GetKey()), Link: intentURL(v.Tenant, c.GetKey()), State: stateWord(c.GetState())})
	}
	for _, e := range in.GetHistory() {
		t := newTimelineEntry(e)
		v.Timeline = append(v.Timeline, t)
		if reportKinds[e.GetKind()] && e.GetPrincipal() != "intentd" {
			v.Reports = append([]timelineEntry{t}, v.Reports...)
		}
		// References a worker reported that the intent's result does not
		// hold (under a superseded lease, or before a reviewer decided
		// otherwise) are still what a provider said: evidence.
		if e.GetKind() == intentv1.HistoryEntry_KIND_COMPLETED && len(t.Refs) > 0 && (t.Stale || in.GetState() != intentv1.State_STATE_COMPLETED) {
			src := phrase("Reported")
			if t.Who != "" {
				src += phrase(" by ") + t.Who
			}
			if t.Stale {
				src += phrase(" under a superseded lease: kept as evidence, it changed nothing.")
			} else {
				src += phrase("; the intent is not completed.")
			}
			v.Provider = append(v.Provider, providerSaid{Refs: t.Refs, Source: src})
		}
	}
	switch in.GetState() {
	case intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW:
		v.Decidable = true
	case intentv1.State_STATE_IN_PROGRESS:
		v.HeldLive = in.GetLease().GetLive()
		v.Decidable = !v.HeldLive
	}
	if v.Lease != nil && v.Lease.Review {
		v.DecidedBy = lastDecision(v)
	}
	return v
}

func refs(m map[string]string) []term {
	var out []term
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, term{k, m[k]})
	}
	return out
}

// valueText is a params value as text: strings as they are, the rest as
// JSON.
func valueText(v *structpb.Value) string {
	if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
		return s.StringValue
	}
	b, err := v.MarshalJSON()
	if err != nil {
		return "?"
	}
	return string(b)
}

// kindWords are the timeline's names of the history kinds.
var kindWords = map[intentv1.HistoryEntry_Kind]string{
	intentv1.HistoryEntry_KIND_REGISTERED:       "Registered",
	intentv1.HistoryEntry_KIND_ACQUIRED:         "Lease issued",
	intentv1.HistoryEntry_KIND_COMPLETED:        "Reported completed",
	intentv1.HistoryEntry_KIND_MARKED_UNKNOWN:   "Marked unknown",
	intentv1.HistoryEntry_KIND_RELEASED:         "Released (confirmed absent)",
	intentv1.HistoryEntry_KIND_FAILED:           "Reported failed",
	intentv1.HistoryEntry_KIND_HEARTBEAT:        "Heartbeat",
	intentv1.HistoryEntry_KIND_LEASE_LAPSED:     "Lease lapsed",
	intentv1.HistoryEntry_KIND_ESCALATED:        "Escalated to review",
	intentv1.HistoryEntry_KIND_RESOLVED:         "Decided by a reviewer",
	intentv1.HistoryEntry_KIND_CANCELLED:        "Cancelled",
	intentv1.HistoryEntry_KIND_CHILD_REGISTERED: "Child registered",
	// The fencing gateway's (docs/GATEWAY.md).
	intentv1.HistoryEntry_KIND_SUBMISSION_STARTED:  "Sent through the gateway",
	intentv1.HistoryEntry_KIND_SUBMISSION_RECORDED: "Upstream's answer recorded",
	intentv1.HistoryEntry_KIND_SUBMISSION_UNKNOWN:  "Upstream's answer lost",
}

func newTimelineEntry(e *intentv1.HistoryEntry) timelineEntry {
	t := timelineEntry{
		Time: ts(e.GetTime()), Kind: strings.ToLower(strings.TrimPrefix(e.GetKind().String(), "KIND_")), Headline: kindWords[e.GetKind()],
		Token: e.GetToken(), Stale: !e.GetAccepted(), Reason: e.GetReason(), Refs: refs(e.GetResult().GetExternalRefs()),
	}
	if t.Headline == "" {
		t.Headline = e.GetKind().String()
	}
	if t.Stale {
		t.Headline += " — stale, changed nothing"
	}
	switch w, p := e.GetWorker(), e.GetPrincipal(); {
	// "anonymous" is every caller without authentication: it says nothing.
	case w != "" && p != "" && p != w && p != "anonymous":
		t.Who = phrase("worker %s, %s", w, p)
	case w != "":
		t.Who = phrase("worker %s", w)
	case p != "" && p != "anonymous":
		t.Who = bidi(p)
	}
	if f := e.GetFailure(); f != nil {
		t.Failure = bidi(f.GetCode()) + colon(f.GetMessage())
	}
	if e.GetKind() == intentv1.HistoryEntry_KIND_ACQUIRED {
		t.Headline += " (" + strings.ToLower(strings.TrimPrefix(e.GetMode().String(), "LEASE_MODE_")) + ")"
	}
	if e.GetKind() == intentv1.HistoryEntry_KIND_RESOLVED {
		t.ResolvedState = stateWord(e.GetResolvedState())
		t.Headline += ": " + t.ResolvedState
		t.Channel = e.GetChannel()
		if t.Channel == "" {
			t.Channel = "API"
		}
	}
	if e.GetKind() == intentv1.HistoryEntry_KIND_CHILD_REGISTERED {
		t.Reason = "child " + e.GetReason()
	}
	return t
}

// lastDecision is the newest reviewer's decision in v's timeline.
func lastDecision(v intentView) *timelineEntry {
	for i := len(v.Timeline) - 1; i >= 0; i-- {
		if v.Timeline[i].Kind == "resolved" {
			return &v.Timeline[i]
		}
	}
	return nil
}

// refusalView is one line of the overview's refusals.
type refusalView struct {
	Time            time.Time
	Age             string
	Key             keyView
	Link            string
	Method, Reason  string
	Principal, What string
}

func newRefusalView(r Refusal, tenant string, now time.Time) refusalView {
	v := refusalView{Time: r.Time, Age: age(r.Time, now), Key: newKeyView(r.Key), Method: r.Method, Reason: r.Reason, Principal: r.Principal}
	if r.Key != "" {
		v.Link = intentURL(tenant, r.Key)
	}
	switch r.Reason {
	case "STALE_TOKEN":
		v.What = fmt.Sprintf("token %d is superseded (current %d)", r.Token, r.Current)
	case "FINGERPRINT_MISMATCH":
		v.What = "the key is registered with other terms"
	case "INVALID_TRANSITION":
		v.What = "the intent's state does not allow " + r.Method
	case "LEASE_HELD":
		v.What = "a worker holds a live lease"
	}
	return v
}

// chart is the overview's bar chart of unknown outcomes, laid out for an
// inline SVG (no script, no style attributes: the page's CSP allows
// neither).
type chart struct {
	Width, Height int
	Bars          []bar
	Max           int
	Total         int
	Ticks         []tick
	Empty         bool
}

type bar struct {
	X, Y1, H1, Y2, H2, W int
	Label                string
}

type tick struct {
	X     int
	Label string
	// End anchors the label's end at X (the chart's right edge).
	End bool
}

// tickEvery is how many bins apart the time labels are: an hour.
const tickEvery = 6

// newChart lays out bins (oldest first, the current one last). The time
// labels are counted back from the current bin, so that the last one is
// always "now" at the right edge, then one an hour before the current
// bin began, and so on: counted from the oldest bin, as they were, the
// last label named a time up to an hour before the bar that is now.
func newChart(bins []UnknownBin) chart {
	const w, h, top, bottom = 720, 160, 10, 24
	c := chart{Width: w, Height: h}
	for _, b := range bins {
		c.Max = max(c.Max, b.Marked+b.Reconcil)
		c.Total += b.Marked + b.Reconcil
	}
	c.Empty = c.Total == 0
	scale := max(c.Max, 1)
	slot := w / max(len(bins), 1)
	plot := h - top - bottom
	last := len(bins) - 1
	for i, b := range bins {
		h1 := b.Marked * plot / scale
		h2 := b.Reconcil * plot / scale
		x := i*slot + 1
		base := top + plot
		when := b.Start.UTC().Format("15:04")
		if i == last {
			when += " (now)"
		}
		c.Bars = append(c.Bars, bar{
			X: x, W: slot - 2, Y1: base - h1, H1: h1, Y2: base - h1 - h2, H2: h2,
			Label: fmt.Sprintf("%s: %d marked unknown, %d reconcile leases", when, b.Marked, b.Reconcil),
		})
		if i < last && (last-i)%tickEvery == 0 {
			c.Ticks = append(c.Ticks, tick{X: x, Label: b.Start.UTC().Format("15:04")})
		}
	}
	if last >= 0 {
		c.Ticks = append(c.Ticks, tick{X: w - 2, Label: "now", End: true})
	}
	return c
}
