package console

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// layoutChecks are JavaScript helpers that read the order in which text is
// laid out, from the DOM: ltr(el, s) says whether the characters of s (in
// one text node of el) go left to right, line by line; before(el, a, b)
// whether a is laid out before b (above, or left on the same line).
const layoutChecks = `
function rectsOf(el, needle) {
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let n; (n = walker.nextNode());) {
    const i = n.data.indexOf(needle);
    if (i < 0) continue;
    const out = [];
    for (let k = 0; k < needle.length; k++) {
      const r = document.createRange();
      r.setStart(n, i + k);
      r.setEnd(n, i + k + 1);
      out.push(r.getBoundingClientRect());
    }
    return out;
  }
  return null;
}
function ltr(el, needle) {
  const rs = rectsOf(el, needle);
  if (!rs) return needle + ": not in " + JSON.stringify(el.textContent);
  for (let k = 1; k < rs.length; k++) {
    const sameLine = Math.abs(rs[k].top - rs[k - 1].top) < 3;
    if (sameLine && rs[k].left < rs[k - 1].left) return needle + ": reordered, character " + k + " (" + JSON.stringify(needle[k]) + ") is left of the one before";
  }
  return "";
}
function before(el, a, b) {
  const ra = rectsOf(el, a), rb = rectsOf(el, b);
  if (!ra || !rb) return a + " or " + b + ": not in " + JSON.stringify(el.textContent);
  const x = ra[0], y = rb[0];
  if (y.top > x.top + 3 || (Math.abs(y.top - x.top) < 3 && y.left > x.left)) return "";
  return JSON.stringify(b) + " is laid out before " + JSON.stringify(a);
}
`

// TestBidiTextDoesNotReorderTheQueue loads the queue with a label holding a
// right-to-left override (U+202E, after a U+2069 that would close an
// isolation around it), a summary holding one, and an escalation whose
// actor holds one, and checks from the laid-out DOM that what follows each
// is not reordered: the next label, the reason after the actor's name, the
// intent page's lines. It also checks that a derived key, a long label and
// a long param wrap: "Why it is here" stays on the screen.
func TestBidiTextDoesNotReorderTheQueue(t *testing.T) {
	w := newWorld(t)
	session := w.unknown("acme", "bidi-1", func(r *intentv1.RegisterRequest) {
		r.Labels = map[string]string{"a-note": "x\u2069\u202eevil-1", "b-next": "AFTER-2"}
		r.Summary = "Refund \u202eevil summary"
	})
	ctx := w.ctx(worker)
	a, err := w.api.Acquire(ctx, &intentv1.AcquireRequest{Tenant: "acme", Key: "bidi-1", SessionId: session, RequestId: "reconcile-1"})
	if err != nil || a.GetOutcome() != intentv1.Outcome_OUTCOME_RECONCILE {
		t.Fatalf("Acquire: %v %v, want RECONCILE", a.GetOutcome(), err)
	}
	if _, err := w.api.Escalate(ctx, &intentv1.EscalateRequest{Tenant: "acme", Key: "bidi-1", Token: a.GetLease().GetToken(),
		Reason: "merchant shows two orders", Actor: "rec\u202eevil"}); err != nil {
		t.Fatalf("Escalate: %v", err)
	}
	w.unknown("acme", "", func(r *intentv1.RegisterRequest) {
		r.Action = "refund.issue"
		r.Identity, _ = structpb.NewStruct(map[string]any{"order_id": "ORD-88412", "return_id": "RA-20931"})
		r.Labels = map[string]string{"note": strings.Repeat("long-label-value-without-spaces", 8)}
		r.Params, _ = structpb.NewStruct(map[string]any{"amount": "40.00", "currency": "USD", "memo": strings.Repeat("a-long-param-value-without-spaces", 6)})
	})

	p := w.browser().person("alice")
	p.signIn(alice)
	p.do("see the queue", chromedp.WaitVisible(chromedp.CSS(`table.queue tbody tr`)))
	p.shot("queue")
	problems, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]string](`(() => {`+layoutChecks+`
		const out = [];
		const row = [...document.querySelectorAll("table.queue tbody tr")].find(r => r.textContent.includes("AFTER-2"));
		if (!row) return ["no row with the bidi labels"];
		const cell = s => [...row.cells].find(c => c.textContent.includes(s));
		const labels = cell("b-next"), why = row.cells[row.cells.length - 1];
		out.push(ltr(labels, "b-next"), ltr(labels, "AFTER-2"), before(labels, "a-note", "b-next"), before(labels, "evil-1", "AFTER-2"));
		out.push(ltr(why, "Escalated by"), ltr(why, "merchant shows two orders"), before(why, "Escalated by", "merchant"));
		const what = cell("bidi-1");
		out.push(before(what, "Refund", "bidi-1"), ltr(what, "bidi-1"));
		// Nothing runs off the screen: every "Why it is here" cell ends
		// within the window, the table too.
		const width = document.documentElement.clientWidth;
		for (const td of document.querySelectorAll("table.queue td:last-child")) {
			const r = td.getBoundingClientRect();
			if (r.right > width + 1) out.push("a 'Why it is here' cell ends at " + r.right + ", past the window's " + width);
		}
		if (document.documentElement.scrollWidth > width) out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + width);
		return out.filter(s => s);
	})()`))
	if err != nil {
		t.Fatalf("layout checks: %v", err)
	}
	for _, pr := range problems {
		t.Errorf("queue: %s", pr)
	}

	p.open(intentPath("acme", "bidi-1"), "#intent-key")
	p.shot("intent")
	problems, err = chromedp.Run(p.ctx, chromedp.Evaluate[[]string](`(() => {`+layoutChecks+`
		const out = [];
		const why = document.querySelector("p.why");
		out.push(ltr(why, "merchant shows two orders"), before(why, "Escalated by", "merchant"));
		const labels = [...document.querySelectorAll("dd")].find(d => d.textContent.includes("AFTER-2"));
		out.push(labels ? ltr(labels, "AFTER-2") : "no labels", labels ? before(labels, "a-note", "b-next") : "");
		const reported = document.querySelector("ul.reports li");
		out.push(ltr(reported, "Escalated to review"));
		const h1 = document.querySelector("h1");
		out.push(before(h1, "Refund", "NEEDS_REVIEW"));
		return out.filter(s => s);
	})()`))
	if err != nil {
		t.Fatalf("layout checks: %v", err)
	}
	for _, pr := range problems {
		t.Errorf("intent page: %s", pr)
	}
}
