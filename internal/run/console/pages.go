package console

import (
	"context"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"

	"golang.org/x/sync/errgroup"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/access"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/vocab"
)

// queueStates are the states of the review queue, as in List's doc.
var queueStates = []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW}

const queuePageSize = 25

type signinData struct {
	Next  string
	Error string
}

// WhoMayUse says on the sign-in page which roles may use the console.
func (signinData) WhoMayUse() string { return whoMayUse }

func (c *Console) signinForm(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Directory == nil {
		http.Redirect(w, r, Path, http.StatusSeeOther)
		return
	}
	if v := c.who(w, r); v != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next"), tenantPath(v.homeTenant())+"queue"), http.StatusSeeOther)
		return
	}
	// A session before signing in holds the form's CSRF token.
	ss := c.sessions.get(r)
	if ss == nil {
		if ss = c.sessions.create(w, r, ""); ss == nil {
			c.problem(w, r, nil, http.StatusServiceUnavailable, "Too many sessions", "The console holds as many sessions as it may; try again in a few minutes.")
			return
		}
	}
	c.render(w, r, http.StatusOK, "signin", page{Title: "Sign in", Viewer: &viewer{p: signingIn, s: ss, on: true}, Data: signinData{Next: safeNext(r.URL.Query().Get("next"), "")}})
}

// signingIn stands for the visitor of the sign-in page: no name, no roles.
var signingIn = &access.Principal{}

// safeNext keeps a redirect target inside the console: a path under Path
// on this origin, as the console's own URLs are (never another host:
// "//evil", "/\\evil", "https://evil"; never a path that leaves the
// console once cleaned, "/console/../x"). Its query is kept byte for byte,
// so an intent's key (see intentURL) comes back as it went.
func safeNext(next, fallback string) string {
	if !strings.HasPrefix(next, Path) || strings.ContainsAny(next, "\\") || strings.ContainsFunc(next, unicode.IsControl) {
		return fallback
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(path.Clean(u.Path)+"/", Path) {
		return fallback
	}
	return next
}

func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Directory == nil {
		http.Redirect(w, r, Path, http.StatusSeeOther)
		return
	}
	ss := c.sessions.get(r)
	if !checkCSRF(ss, r) {
		c.problem(w, r, nil, http.StatusForbidden, "Refused: the form's security token is missing or old", "Open the sign-in page again and sign in from there.")
		return
	}
	next := safeNext(r.PostFormValue("next"), "")
	failures := c.failures.of(r)
	if failures.Tokens() < 1 {
		c.cfg.Log.Warn("console: sign-in refused: too many wrong tokens from this address", "peer", r.RemoteAddr)
		c.render(w, r, http.StatusTooManyRequests, "signin", page{Title: "Sign in", Viewer: &viewer{p: signingIn, s: ss, on: true},
			Data: signinData{Next: next, Error: "Too many wrong tokens from your address: wait a minute, then try again."}})
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	p, ok := c.cfg.Directory().ByToken(token)
	if token == "" || !ok {
		failures.Allow() // spends one: only wrong tokens count
		c.cfg.Log.Warn("console: sign-in refused: bearer token not recognized", "peer", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "signin", page{Title: "Sign in", Viewer: &viewer{p: signingIn, s: ss, on: true},
			Data: signinData{Next: next, Error: "That token is not recognized. Check it, or ask whoever keeps intentd's tokens file."}})
		return
	}
	if !mayUse(p) {
		// Refused here, before any session: signed in, every page would
		// be a PERMISSION_DENIED.
		c.cfg.Log.Warn("console: sign-in refused: the principal's roles do not allow the console", "principal", p.Name, "peer", r.RemoteAddr)
		c.render(w, r, http.StatusForbidden, "signin", page{Title: "Sign in", Viewer: &viewer{p: signingIn, s: ss, on: true},
			Data: signinData{Next: next, Error: "That token may not use the console. " + whoMayUse}})
		return
	}
	// A new id on signing in: a session id planted before cannot be
	// used afterwards (fixation).
	c.sessions.end(w, r, ss)
	if !c.startSignedIn(w, r, token) {
		return
	}
	c.cfg.Log.Info("console: signed in", "principal", p.Name, "peer", r.RemoteAddr)
	v := &viewer{p: p}
	http.Redirect(w, r, safeNext(next, tenantPath(v.homeTenant())+"queue"), http.StatusSeeOther)
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request) {
	ss := c.sessions.get(r)
	if !checkCSRF(ss, r) {
		c.problem(w, r, nil, http.StatusForbidden, "Refused: the form's security token is missing or old", "Reload the page and try again.")
		return
	}
	if !c.endSession(w, r, ss) {
		return
	}
	http.Redirect(w, r, Path+"signin", http.StatusSeeOther)
}

// queueData is the queue page's content.
type queueData struct {
	Rows       []queueRow
	State      string // "", "unknown" or "needs_review"
	Label      string
	PageToken  string
	Next       string
	Revision   int64
	Error      string
	FirstPage  bool
	MayDecide  bool
	QueueCount string
}

func (c *Console) queue(w http.ResponseWriter, r *http.Request, v *viewer, tenant string) {
	q := r.URL.Query()
	d := queueData{State: q.Get("state"), Label: strings.TrimSpace(q.Get("label")), PageToken: q.Get("page"), MayDecide: v.mayDecide()}
	d.FirstPage = d.PageToken == ""
	states := queueStates
	switch d.State {
	case "unknown":
		states = queueStates[:1]
	case "needs_review":
		states = queueStates[1:]
	default:
		d.State = ""
	}
	ctx, cancel := c.call(r, v)
	defer cancel()
	resp, err := c.cfg.Service.List(ctx, &intentv1.ListRequest{Tenant: tenant, States: states, Label: d.Label, PageSize: queuePageSize, PageToken: d.PageToken})
	if err != nil {
		if c.refused(w, r, v, err) {
			return
		}
		d.Error = explain(err)
		c.render(w, r, http.StatusBadRequest, "queue", page{Title: "Review queue", Viewer: v, Tenant: tenant, Nav: "queue", Data: d})
		return
	}
	d.Next, d.Revision = resp.GetNextPageToken(), resp.GetRevision()
	// List carries no history; why each intent waits is in its history.
	// One Get per row, a few at a time: a page is 25 rows.
	d.Rows = make([]queueRow, len(resp.GetIntents()))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	now := c.cfg.Now()
	for i, in := range resp.GetIntents() {
		g.Go(func() error {
			full := in
			if got, err := c.cfg.Service.Get(gctx, &intentv1.GetRequest{Tenant: tenant, Key: in.GetKey()}); err == nil {
				full = got.GetIntent()
			}
			d.Rows[i] = newQueueRow(full, now)
			return nil
		})
	}
	_ = g.Wait()
	c.render(w, r, http.StatusOK, "queue", page{Title: "Review queue", Viewer: v, Tenant: tenant, Nav: "queue", Data: d})
}

// refused renders the page for a refusal that is about the viewer, not the
// page: signed out, not allowed, not there. It reports whether it did.
func (c *Console) refused(w http.ResponseWriter, r *http.Request, v *viewer, err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated:
		c.sessions.end(w, r, v.s)
		c.problem(w, r, nil, http.StatusUnauthorized, "Signed out", "intentd no longer recognizes your token. Sign in again.")
	case codes.NotFound:
		c.notFound(w, r, v)
	case codes.PermissionDenied:
		if strings.Contains(status.Convert(err).Message(), "tenant") {
			c.notFound(w, r, v)
			return true
		}
		c.problem(w, r, v, http.StatusForbidden, "Not allowed", explain(err))
	case codes.ResourceExhausted:
		c.problem(w, r, v, http.StatusTooManyRequests, "Too many requests", explain(err))
	case codes.Unavailable, codes.DeadlineExceeded:
		c.problem(w, r, v, http.StatusServiceUnavailable, "intentd cannot reach its store", explain(err)+" Reload in a moment; nothing was changed.")
	default:
		return false
	}
	return true
}

// explain is a refusal as a person reads it: intentd's message (which
// names the field and the limit), and the reason a program would switch
// on.
func explain(err error) string {
	st := status.Convert(err)
	msg := st.Message()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() != "" {
			return msg + " (" + st.Code().String() + ", " + info.GetReason() + ")"
		}
	}
	return msg + " (" + st.Code().String() + ")"
}

func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// intentData is the intent page's content.
type intentData struct {
	In        intentView
	Decide    *decideForm
	Outcome   *decideOutcome
	MayDecide bool
	// Live is the URL of the intent's event stream, built here (liveURL)
	// so that the script never puts a key into a URL itself.
	Live string
}

// title is the intent page's title: what the intent is, in the approver's
// words when there are some, else its key (shortened when derived). The
// browser shows a title as plain text, outside the page: it is isolated
// with FSI and PDI.
func title(v intentView) string {
	switch {
	case v.Summary != "":
		return isolated(v.Summary)
	case v.Action != "":
		return isolated(v.Action)
	}
	return isolated(v.Key.Short)
}

func (c *Console) getIntent(r *http.Request, v *viewer, tenant, key string) (*intentv1.Intent, error) {
	ctx, cancel := c.call(r, v)
	defer cancel()
	resp, err := c.cfg.Service.Get(ctx, &intentv1.GetRequest{Tenant: tenant, Key: key})
	return resp.GetIntent(), err
}

func (c *Console) intentPage(w http.ResponseWriter, r *http.Request, v *viewer, tenant string) {
	key := keyOf(r)
	if key == "" {
		c.notFound(w, r, v)
		return
	}
	in, err := c.getIntent(r, v, tenant, key)
	if err != nil {
		if !c.refused(w, r, v, err) {
			c.problem(w, r, v, http.StatusBadRequest, "Cannot show this intent", explain(err))
		}
		return
	}
	c.showIntent(w, r, v, tenant, in, http.StatusOK, nil, nil)
}

func (c *Console) showIntent(w http.ResponseWriter, r *http.Request, v *viewer, tenant string, in *intentv1.Intent, code int, form *decideForm, out *decideOutcome) {
	view := newIntentView(in, c.cfg.Now())
	d := intentData{In: view, MayDecide: v.mayDecide(), Outcome: out, Live: liveURL(tenant, in.GetKey(), in.GetRevision())}
	if view.Decidable {
		if form == nil {
			form = &decideForm{Decision: "", RefName: "provider_reference", FailureCode: "reviewer_declared"}
		}
		form.RequestID = randomID()[:22]
		form.ExpectedToken = in.GetLease().GetToken()
		form.Action = decideURL(tenant, in.GetKey())
		form.AskActor = !v.on
		if form.Actor == "" {
			form.Actor = v.s.actor
		}
		d.Decide = form
	}
	c.render(w, r, code, "intent", page{Title: title(view), Viewer: v, Tenant: tenant, Nav: "queue", Data: d})
}

// decideForm is the decide form's fields, as sent or to be shown again.
type decideForm struct {
	Action        string
	Decision      string
	RefName       string
	RefValue      string
	FailureCode   string
	FailureMsg    string
	Reason        string
	Actor         string
	AskActor      bool
	RequestID     string
	ExpectedToken uint64
	Errors        map[string]string
}

// decideOutcome tells a reviewer what became of a decision that was not
// recorded as sent.
type decideOutcome struct {
	Heading, Text string
	// By, At, State and Reason describe the decision that won, if any.
	Winner *timelineEntry
}

var decisionsByWord = map[string]intentv1.Decision{
	"completed": intentv1.Decision_DECISION_COMPLETED,
	"pending":   intentv1.Decision_DECISION_PENDING,
	"failed":    intentv1.Decision_DECISION_FAILED,
	"cancelled": intentv1.Decision_DECISION_CANCELLED,
}

func (c *Console) decide(w http.ResponseWriter, r *http.Request, v *viewer, tenant string) {
	key := keyOf(r)
	if !checkCSRF(v.s, r) {
		c.problem(w, r, v, http.StatusForbidden, "Refused: the form's security token is missing or old",
			"Nothing was decided. Open the intent again and decide from its page.")
		return
	}
	f := &decideForm{
		Decision: r.PostFormValue("decision"), RefName: strings.TrimSpace(r.PostFormValue("ref_name")), RefValue: strings.TrimSpace(r.PostFormValue("ref_value")),
		FailureCode: strings.TrimSpace(r.PostFormValue("failure_code")), FailureMsg: strings.TrimSpace(r.PostFormValue("failure_message")),
		Reason: strings.TrimSpace(r.PostFormValue("reason")), Actor: strings.TrimSpace(r.PostFormValue("actor")), Errors: map[string]string{},
	}
	expected, _ := strconv.ParseUint(r.PostFormValue("expected_token"), 10, 64)
	requestID := r.PostFormValue("request_id")
	decision, ok := decisionsByWord[f.Decision]
	if !ok {
		f.Errors["decision"] = "Choose what happened."
	}
	if f.Reason == "" {
		f.Errors["reason"] = "Say why: the next person reads it in the history."
	}
	req := &intentv1.ResolveRequest{Tenant: tenant, Key: key, Decision: decision, Reason: f.Reason, RequestId: requestID,
		Channel: Channel, ExpectedToken: expected, Actor: v.p.Name}
	switch decision {
	case intentv1.Decision_DECISION_COMPLETED:
		if f.RefName == "" || f.RefValue == "" {
			f.Errors["ref"] = "A completed decision needs the provider's reference: its name and value."
		}
		req.Result = &intentv1.Result{ExternalRefs: map[string]string{f.RefName: f.RefValue}}
	case intentv1.Decision_DECISION_FAILED:
		if f.FailureCode == "" {
			f.Errors["failure_code"] = "A failed decision needs a failure code."
		}
		req.Failure = &intentv1.Failure{Code: f.FailureCode, Message: f.FailureMsg}
	}
	if !v.on {
		if f.Actor == "" {
			f.Errors["actor"] = "Authentication is off: say who you are, for the history."
		}
		req.Actor = f.Actor
		c.sessions.setActor(v.s, f.Actor)
	}
	if requestID == "" {
		f.Errors["decision"] = "The form is incomplete; open the intent again."
	}
	if key == "" {
		// Not a form of ours: there is no intent to show it again on.
		c.notFound(w, r, v)
		return
	}
	if len(f.Errors) > 0 {
		c.redecide(w, r, v, tenant, key, http.StatusUnprocessableEntity, f, nil)
		return
	}
	ctx, cancel := c.call(r, v)
	defer cancel()
	resp, err := c.cfg.Service.Resolve(ctx, req)
	if err == nil {
		msg := "Decided: " + stateWord(resp.GetIntent().GetState()) + ", recorded as " + isolated(req.Actor) + " via the console."
		if resp.GetActionTaken() == vocab.Action(intentv1.ActionTaken_ACTION_TAKEN_NONE) {
			msg = "This decision was already recorded (the form was sent twice); nothing changed."
		}
		c.sessions.setFlash(v.s, msg)
		http.Redirect(w, r, intentURL(tenant, key), http.StatusSeeOther)
		return
	}
	c.cfg.Log.Info("console: decision refused", "tenant", tenant, "key", key, "principal", v.p.Name, "err", err)
	switch reasonOf(err) {
	case vocab.Reason(intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN), vocab.Reason(intentv1.ErrorReason_ERROR_REASON_INVALID_TRANSITION):
		c.redecide(w, r, v, tenant, key, http.StatusConflict, nil, &decideOutcome{
			Heading: "Not recorded: someone else decided first",
			Text:    "This intent changed while you were looking at it, so your decision was not recorded. Read what happened below; decide again only if it still needs you.",
		})
		return
	case vocab.Reason(intentv1.ErrorReason_ERROR_REASON_LEASE_HELD):
		c.redecide(w, r, v, tenant, key, http.StatusConflict, nil, &decideOutcome{
			Heading: "Not recorded: a worker holds this intent",
			Text:    "A worker took a lease on this intent since you opened it, and is working on it now. Your decision was not recorded.",
		})
		return
	}
	if c.refused(w, r, v, err) {
		return
	}
	f.Errors["form"] = explain(err)
	c.redecide(w, r, v, tenant, key, http.StatusUnprocessableEntity, f, nil)
}

// redecide shows the intent as it is now with the form (or the outcome).
func (c *Console) redecide(w http.ResponseWriter, r *http.Request, v *viewer, tenant, key string, code int, f *decideForm, out *decideOutcome) {
	in, err := c.getIntent(r, v, tenant, key)
	if err != nil {
		if !c.refused(w, r, v, err) {
			c.problem(w, r, v, http.StatusBadRequest, "Cannot show this intent", explain(err))
		}
		return
	}
	if out != nil {
		out.Winner = lastDecision(newIntentView(in, c.cfg.Now()))
	}
	c.showIntent(w, r, v, tenant, in, code, f, out)
}

// overviewData is the overview page's content.
type overviewData struct {
	Counts   []stateCount
	Refusals []refusalView
	Chart    chart
	Tiers    *tiersView // nil: not shown
	Error    string
}

type stateCount struct {
	State, Word, Count string
	Link               string
}

// countCap bounds how far the overview counts one state: 10 pages.
const countCap = 1000

func (c *Console) overview(w http.ResponseWriter, r *http.Request, v *viewer, tenant string) {
	d := overviewData{}
	states := []intentv1.State{intentv1.State_STATE_UNKNOWN, intentv1.State_STATE_NEEDS_REVIEW, intentv1.State_STATE_PENDING,
		intentv1.State_STATE_IN_PROGRESS, intentv1.State_STATE_COMPLETED, intentv1.State_STATE_FAILED, intentv1.State_STATE_CANCELLED}
	d.Counts = make([]stateCount, len(states))
	ctx, cancel := c.call(r, v)
	defer cancel()
	// Each state on its own: with the archive (PostgreSQL) down, the
	// final states cannot be counted, and the live ones, the review
	// queue's among them, still can.
	errs := make([]error, len(states))
	var wg sync.WaitGroup
	for i, s := range states {
		wg.Go(func() {
			word := "?"
			n, more, err := c.count(ctx, tenant, s)
			if errs[i] = err; err == nil {
				word = strconv.Itoa(n)
				if more {
					word += "+"
				}
			}
			d.Counts[i] = stateCount{State: s.String(), Word: stateWord(s), Count: word}
		})
	}
	wg.Wait()
	if err := firstNotArchive(errs); err != nil {
		if c.refused(w, r, v, err) {
			return
		}
		d.Error = explain(err)
	} else if i := slices.IndexFunc(errs, func(err error) bool { return err != nil }); i >= 0 {
		d.Error = "The archive (PostgreSQL) is not answering: finished intents cannot be counted (?) until it is back; live intents and the review queue are read from etcd. " + explain(errs[i])
	}
	if a := c.cfg.Activity; a != nil {
		for _, rf := range a.Refusals(tenant, 20) {
			d.Refusals = append(d.Refusals, newRefusalView(rf, tenant, c.cfg.Now()))
		}
		d.Chart = newChart(a.Unknowns(tenant))
	}
	if c.cfg.Tiers != nil && v.p.Has(access.RoleAdmin) {
		d.Tiers = newTiersView(c.cfg.Tiers())
	}
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Viewer: v, Tenant: tenant, Nav: "overview", Data: d})
}

// firstNotArchive is the first of errs that is not the archive's
// unavailability (nil: none).
func firstNotArchive(errs []error) error {
	for _, err := range errs {
		if err != nil && reasonOf(err) != vocab.Reason(intentv1.ErrorReason_ERROR_REASON_ARCHIVE_UNAVAILABLE) {
			return err
		}
	}
	return nil
}

// count counts tenant's intents in state s, up to countCap (more: there
// are more).
func (c *Console) count(ctx context.Context, tenant string, s intentv1.State) (n int, more bool, err error) {
	token := ""
	for {
		resp, err := c.cfg.Service.List(ctx, &intentv1.ListRequest{Tenant: tenant, States: []intentv1.State{s}, PageSize: 100, PageToken: token})
		if err != nil {
			return 0, false, err
		}
		n += len(resp.GetIntents())
		token = resp.GetNextPageToken()
		if token == "" {
			return n, false, nil
		}
		if n >= countCap {
			return n, true, nil
		}
	}
}
