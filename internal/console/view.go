package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

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
		"intentPath": intentPath,
		"errorFor":   func(f *decideForm, k string) string { return f.Errors[k] },
		"checked":    func(a, b string) bool { return a == b },
		"q":          url.QueryEscape,
	}
}

// queueRow is one line of the review queue.
type queueRow struct {
	Key, Link, State string
	Since            time.Time
	Age              string
	Action, Amount   string
	Labels           []string
	Why              string
	Attempts         string
}

func newQueueRow(in *intentv1.Intent, now time.Time) queueRow {
	since := ts(in.GetUpdatedAt())
	if e := lastWhy(in.GetHistory()); e != nil {
		since = ts(e.GetTime())
	}
	r := queueRow{
		Key: in.GetKey(), Link: intentPath(in.GetTenant(), in.GetKey()), State: stateWord(in.GetState()),
		Since: since, Age: age(since, now), Action: action(in), Amount: amount(in.GetParams()), Why: why(in),
	}
	for _, k := range slices.Sorted(maps.Keys(in.GetLabels())) {
		r.Labels = append(r.Labels, k+"="+in.GetLabels()[k])
	}
	if in.GetMaxAttempts() > 0 {
		r.Attempts = fmt.Sprintf("%d of %d", in.GetAttempts(), in.GetMaxAttempts())
	}
	return r
}

// action names what the intent does: its params' or labels' "action" (or
// "operation"), else the key's first word ("refund" of "refund-17").
func action(in *intentv1.Intent) string {
	f := in.GetParams().GetFields()
	for _, k := range []string{"action", "operation", "type"} {
		if s := f[k].GetStringValue(); s != "" {
			return s
		}
		if s := in.GetLabels()[k]; s != "" {
			return s
		}
	}
	key := in.GetKey()
	if i := strings.IndexAny(key, "-:_/."); i > 0 {
		return key[:i]
	}
	return key
}

// amount finds the money in params: amount or max_amount (with currency),
// or amount_cents in hundredths.
func amount(p *structpb.Struct) string {
	f := p.GetFields()
	cur := f["currency"].GetStringValue()
	withCur := func(s string) string { return strings.TrimSpace(s + " " + cur) }
	for _, k := range []string{"amount", "max_amount", "total", "price"} {
		switch v := f[k].GetKind().(type) {
		case *structpb.Value_StringValue:
			return withCur(v.StringValue)
		case *structpb.Value_NumberValue:
			return withCur(strconv.FormatFloat(v.NumberValue, 'f', -1, 64))
		}
	}
	for _, k := range []string{"amount_cents", "amount_minor"} {
		if v, ok := f[k].GetKind().(*structpb.Value_NumberValue); ok {
			return withCur(fmt.Sprintf("%.2f", v.NumberValue/100))
		}
	}
	return "—"
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
func why(in *intentv1.Intent) string {
	e := lastWhy(in.GetHistory())
	if e == nil {
		if in.GetState() == intentv1.State_STATE_UNKNOWN {
			return "Lease lapsed: the worker's session ended without a report."
		}
		return "—"
	}
	who := e.GetWorker()
	if who == "" {
		who = e.GetPrincipal()
	}
	switch e.GetKind() {
	case intentv1.HistoryEntry_KIND_MARKED_UNKNOWN:
		return "Timeout: " + who + " could not tell whether its call took effect" + colon(e.GetReason())
	case intentv1.HistoryEntry_KIND_LEASE_LAPSED:
		return "Lapsed lease: " + who + "'s session ended before it reported."
	default:
		if e.GetPrincipal() == "intentd" {
			return "Too many attempts ended without a report" + colon(e.GetReason())
		}
		return "Escalated by " + who + colon(e.GetReason())
	}
}

func colon(s string) string {
	if s == "" {
		return "."
	}
	return ": " + s
}

// intentView is the intent page's summary of one intent.
type intentView struct {
	Tenant, Key, State, Fingerprint, ParamsVersion string
	Parent, ParentLink                             string
	Terms                                          []term
	Labels                                         []string
	Created, Updated, Completed, RetainUntil       time.Time
	Attempts                                       string
	Lease                                          *leaseView
	Result                                         *resultView
	Failure                                        *intentv1.Failure
	Children                                       []childView
	Timeline                                       []timelineEntry
	Why                                            string
	Revision                                       int64
	// Decidable: the state a reviewer may decide (UNKNOWN, NEEDS_REVIEW).
	Decidable bool
	// HeldLive: a worker holds a live lease; a decision must wait.
	HeldLive bool
}

type term struct{ Name, Value string }

type leaseView struct {
	Token             uint64
	Mode, Worker      string
	Session           string
	Acquired, Expires time.Time
	Live              bool
}

type resultView struct {
	Refs         []term
	PayloadBytes int
	Payload      string // shown when it is short UTF-8 text
}

type childView struct{ Key, Link, State string }

// timelineEntry is one history entry as the timeline shows it.
type timelineEntry struct {
	Time          time.Time
	Kind          string
	Headline      string
	Who           string
	Token         uint64
	Stale         bool
	Reason        string
	Refs          []term
	Failure       string
	ResolvedState string
	Channel       string
	Issued        bool
}

func newIntentView(in *intentv1.Intent, now time.Time) intentView {
	v := intentView{
		Tenant: in.GetTenant(), Key: in.GetKey(), State: stateWord(in.GetState()), Fingerprint: in.GetFingerprint(),
		ParamsVersion: in.GetParamsVersion(), Parent: in.GetParentKey(),
		Created: ts(in.GetCreatedAt()), Updated: ts(in.GetUpdatedAt()), Completed: ts(in.GetCompletedAt()), RetainUntil: ts(in.GetRetainUntil()),
		Failure: in.GetFailure(), Revision: in.GetRevision(), Why: why(in),
	}
	if v.Parent != "" {
		v.ParentLink = intentPath(v.Tenant, v.Parent)
	}
	f := in.GetParams().GetFields()
	for _, k := range slices.Sorted(maps.Keys(f)) {
		v.Terms = append(v.Terms, term{k, valueText(f[k])})
	}
	for _, k := range slices.Sorted(maps.Keys(in.GetLabels())) {
		v.Labels = append(v.Labels, k+"="+in.GetLabels()[k])
	}
	if in.GetMaxAttempts() > 0 {
		v.Attempts = fmt.Sprintf("%d of %d", in.GetAttempts(), in.GetMaxAttempts())
	}
	if l := in.GetLease(); l != nil {
		v.Lease = &leaseView{Token: l.GetToken(), Mode: strings.TrimPrefix(l.GetMode().String(), "LEASE_MODE_"), Worker: l.GetWorker(),
			Session: l.GetSessionId(), Acquired: ts(l.GetAcquiredAt()), Expires: ts(l.GetExpiresAt()), Live: l.GetLive()}
	}
	if r := in.GetResult(); r != nil {
		rv := &resultView{Refs: refs(r.GetExternalRefs()), PayloadBytes: len(r.GetPayload())}
		if p := r.GetPayload(); len(p) > 0 && len(p) <= 2048 && json.Valid(p) {
			rv.Payload = string(p)
		}
		v.Result = rv
	}
	for _, c := range in.GetChildren() {
		v.Children = append(v.Children, childView{Key: c.GetKey(), Link: intentPath(v.Tenant, c.GetKey()), State: stateWord(c.GetState())})
	}
	for _, e := range in.GetHistory() {
		v.Timeline = append(v.Timeline, newTimelineEntry(e))
	}
	switch in.GetState() {
	case intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW:
		v.Decidable = true
	case intentv1.State_STATE_IN_PROGRESS:
		v.HeldLive = in.GetLease().GetLive()
		v.Decidable = !v.HeldLive
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
	var who []string
	if w := e.GetWorker(); w != "" {
		who = append(who, "worker "+w)
	}
	// "anonymous" is every caller without authentication: it says nothing.
	if p := e.GetPrincipal(); p != "" && p != e.GetWorker() && p != "anonymous" {
		who = append(who, p)
	}
	t.Who = strings.Join(who, ", ")
	if f := e.GetFailure(); f != nil {
		t.Failure = f.GetCode() + colon(f.GetMessage())
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
	Key, Link       string
	Method, Reason  string
	Principal, What string
}

func newRefusalView(r Refusal, tenant string, now time.Time) refusalView {
	v := refusalView{Time: r.Time, Age: age(r.Time, now), Key: r.Key, Method: r.Method, Reason: r.Reason, Principal: r.Principal}
	if r.Key != "" {
		v.Link = intentPath(tenant, r.Key)
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
}

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
	for i, b := range bins {
		h1 := b.Marked * plot / scale
		h2 := b.Reconcil * plot / scale
		x := i*slot + 1
		base := top + plot
		c.Bars = append(c.Bars, bar{
			X: x, W: slot - 2, Y1: base - h1, H1: h1, Y2: base - h1 - h2, H2: h2,
			Label: fmt.Sprintf("%s: %d marked unknown, %d reconcile leases", b.Start.UTC().Format("15:04"), b.Marked, b.Reconcil),
		})
		if i%6 == 0 {
			c.Ticks = append(c.Ticks, tick{X: x, Label: b.Start.UTC().Format("15:04")})
		}
	}
	return c
}
