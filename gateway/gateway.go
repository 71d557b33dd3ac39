package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// The headers of a call through the gateway. A worker sends the first
// four (Intentd-Tenant only when its credentials cover several tenants);
// the gateway answers with the others.
const (
	// HeaderKey names the intent the call acts for.
	HeaderKey = "Intentd-Key"
	// HeaderOperation names the kind of call ("create-pickup"): one
	// submission per (intent, operation) is ever in flight, and its
	// answer is what every retry gets.
	HeaderOperation = "Intentd-Operation"
	// HeaderToken is the worker's lease: fencing.Header.
	HeaderToken = fencing.Header
	// HeaderTenant names the intent's tenant; absent: the worker's own,
	// as intentd resolves it.
	HeaderTenant = "Intentd-Tenant"

	// HeaderOutcome says what the gateway did (OutcomeForwarded, ...).
	HeaderOutcome = "Intentd-Outcome"
	// HeaderReplayed is "true" on an answer replayed from the record:
	// the upstream was not called again.
	HeaderReplayed = "Intentd-Replayed"
	// HeaderSubmission is the id of the submission an answer belongs to.
	HeaderSubmission = "Intentd-Submission"
	// HeaderTruncated is the upstream body's whole size, on an answer
	// whose body was cut to what the record keeps.
	HeaderTruncated = "Intentd-Body-Truncated"
	// HeaderNotFollowed is a Location the upstream answered that the
	// gateway removed: a redirect is never followed, by the gateway or,
	// through it, by the worker's client.
	HeaderNotFollowed = "Intentd-Redirect-Not-Followed"
)

// What a call through the gateway came to: HeaderOutcome's values, and the
// outcome label of intentd_gateway_submissions_total.
const (
	OutcomeForwarded   = "forwarded"     // sent upstream; its answer recorded, then answered
	OutcomeReplayed    = "replayed"      // the recorded answer, the upstream not called
	OutcomeLookedUp    = "looked_up"     // a lookup found the effect; its answer recorded
	OutcomeAbsent      = "absent"        // a lookup found no effect; the operation may be sent again
	OutcomeStale       = "refused_stale" // a superseded token: nothing sent (STALE_TOKEN)
	OutcomeBusy        = "refused_busy"  // a submission of the operation is in flight: nothing sent
	OutcomeUnknown     = "unknown"       // the answer was lost (now or before): nothing (re)sent
	OutcomeNotSent     = "not_sent"      // the request reached nobody; sending it again is safe
	OutcomeRefused     = "refused"       // a bad call, or one intentd refused: nothing sent
	OutcomeUnavailable = "unavailable"   // intentd did not answer, or could not record: see the statement
	OutcomeLookupError = "lookup_failed" // the lookup itself failed: nothing recorded
)

// Config is what a Gateway serves.
type Config struct {
	// Upstreams are the only places it sends anything to, by name.
	Upstreams map[string]*Upstream
	// RecordGrace is how long past an upstream's timeout the gateway may
	// take to record the answer: a submission not recorded by the
	// upstream's timeout plus this is unknown to every later call.
	RecordGrace time.Duration
	// CallTimeout bounds each call to intentd, with its retries.
	CallTimeout time.Duration
	// Logger receives its log; nil discards.
	Logger *slog.Logger
	// Registry receives its metrics and serves /metrics; nil: a registry
	// of its own.
	Registry *prometheus.Registry
	// TracerProvider receives a span per call, with the upstream call as
	// a child (W3C trace context sent upstream); nil: no spans.
	TracerProvider trace.TracerProvider
}

// The defaults of Config.
const (
	DefaultRecordGrace = 30 * time.Second
	DefaultCallTimeout = 10 * time.Second
)

// Validate fills in Config's defaults and checks its upstreams.
func (c *Config) Validate() error {
	if len(c.Upstreams) == 0 {
		return bad("upstreams", "names no upstream: the gateway forwards only to configured upstreams")
	}
	for name, u := range c.Upstreams {
		if u.Name == "" {
			u.Name = name
		}
		if u.Name != name {
			return bad("upstreams."+name, "is named %q inside", u.Name)
		}
		if err := u.settle("upstreams." + name); err != nil {
			return err
		}
	}
	if c.RecordGrace <= 0 {
		c.RecordGrace = DefaultRecordGrace
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	for name, u := range c.Upstreams {
		if u.Timeout+c.RecordGrace > time.Hour {
			return bad("upstreams."+name+".timeout", "%v with a record grace of %v exceeds the hour a submission may stay in flight", u.Timeout, c.RecordGrace)
		}
	}
	return nil
}

// Gateway is the fencing gateway's HTTP handler.
type Gateway struct {
	cfg     Config
	api     intentv1.IntentServiceClient
	health  healthpb.HealthClient
	clients map[string]*http.Client
	log     *slog.Logger
	m       *metrics
	tracer  trace.Tracer
	prop    propagation.TextMapPropagator
	mux     *http.ServeMux
}

// New returns a gateway that calls intentd over conn. cfg is validated
// (see Config.Validate).
func New(cfg Config, conn grpc.ClientConnInterface) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registry, cfg.Upstreams)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		cfg: cfg, api: intentv1.NewIntentServiceClient(conn), health: healthpb.NewHealthClient(conn),
		clients: map[string]*http.Client{}, log: cfg.Logger, m: m, prop: propagation.TraceContext{},
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	g.tracer = tp.Tracer("github.com/intentd/intentd/gateway")
	for name, u := range cfg.Upstreams {
		g.clients[name] = upstreamClient(u)
	}
	g.mux = http.NewServeMux()
	g.mux.HandleFunc("POST /lookup/{upstream}", g.serveLookup)
	g.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	g.mux.HandleFunc("GET /readyz", g.serveReady)
	g.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	g.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		g.refuse(w, r, nil, http.StatusNotFound, OutcomeRefused, refusedText("", "%s is not a path of the gateway: calls go to /u/<upstream>/<path>, lookups to POST /lookup/<upstream>", quoted(r.URL.Path)))
	})
	return g, nil
}

// upstreamClient is the HTTP client of one upstream: it follows no
// redirect, speaks HTTP/1.1 only (whose retries of a request it can
// reason about: see send), and decompresses what it asked compressed.
func upstreamClient(u *Upstream) *http.Client {
	rt := u.Transport
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ForceAttemptHTTP2 = false
		t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		t.MaxIdleConnsPerHost = 64
		rt = t
	}
	return &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// ServeHTTP implements http.Handler: /u/<upstream>/<path> (a call),
// POST /lookup/<upstream> (a lookup), /healthz, /readyz and /metrics.
//
// Calls under /u/ bypass the mux, which would answer a path with dot
// segments with a redirect to its cleaned form: the gateway refuses such
// a path instead, naming it.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/u/") {
		g.serveSubmission(w, r)
		return
	}
	g.mux.ServeHTTP(w, r)
}

// call is what a worker's request says about itself.
type call struct {
	tenant, key, operation string
	token                  fencing.Token
	authorization          string
}

// parseCall reads the Intentd headers of r; an error names the header.
func parseCall(r *http.Request) (*call, error) {
	c := &call{}
	one := func(name string, required bool) (string, error) {
		vs := r.Header.Values(name)
		switch {
		case len(vs) > 1:
			return "", fmt.Errorf("%s is given %d times; give it once", name, len(vs))
		case len(vs) == 0 || vs[0] == "":
			if required {
				return "", fmt.Errorf("%s is missing: every call through the gateway names its intent (%s), operation (%s) and lease (%s)", name, HeaderKey, HeaderOperation, HeaderToken)
			}
			return "", nil
		}
		return vs[0], nil
	}
	var err error
	if c.key, err = one(HeaderKey, true); err != nil {
		return nil, err
	}
	if c.operation, err = one(HeaderOperation, true); err != nil {
		return nil, err
	}
	if c.tenant, err = one(HeaderTenant, false); err != nil {
		return nil, err
	}
	if _, err = one(HeaderToken, true); err != nil {
		return nil, err
	}
	if c.token, err = fencing.FromHeader(r.Header); err != nil {
		return nil, fmt.Errorf("%s: %v", HeaderToken, err)
	}
	if c.authorization, err = one("Authorization", false); err != nil {
		return nil, err
	}
	return c, nil
}

// outgoing is ctx carrying the worker's credentials to intentd, and
// nothing else of its request.
func (c *call) outgoing(ctx context.Context) context.Context {
	if c.authorization == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", c.authorization)
}

// serveSubmission is a worker's call: /u/<upstream>/<path>.
func (g *Gateway) serveSubmission(w http.ResponseWriter, r *http.Request) {
	name, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/u/"), "/")
	up := g.cfg.Upstreams[name]
	if up == nil {
		g.refuse(w, r, nil, http.StatusNotFound, OutcomeRefused, refusedText(r.Header.Get(HeaderKey), "no upstream %s is configured; the gateway forwards only to its upstreams (%s)", quoted(name), strings.Join(g.names(), ", ")))
		return
	}
	target, err := targetOf(r, name, rest)
	if err != nil {
		g.refuse(w, r, up, http.StatusBadRequest, OutcomeRefused, refusedText(r.Header.Get(HeaderKey), "%v", err))
		return
	}
	if r.Method == http.MethodConnect || r.Method == http.MethodTrace {
		g.refuse(w, r, up, http.StatusMethodNotAllowed, OutcomeRefused, refusedText(r.Header.Get(HeaderKey), "method %s is never forwarded", r.Method))
		return
	}
	c, err := parseCall(r)
	if err != nil {
		g.refuse(w, r, up, http.StatusBadRequest, OutcomeRefused, refusedText(r.Header.Get(HeaderKey), "%v", err))
		return
	}
	body, err := readBody(r, up.MaxRequestBytes)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		g.refuse(w, r, up, status, OutcomeRefused, refusedText(c.key, "the request body %v", err))
		return
	}
	// From here on the submission may be recorded: the worker going away
	// must not stop it halfway (see DESIGN.md, "The fencing gateway").
	ctx := context.WithoutCancel(g.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	ctx, span := g.tracer.Start(ctx, "gateway "+r.Method+" "+name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("intentd.upstream", name), attribute.String("intentd.operation", c.operation), attribute.String("intentd.token", c.token.String())))
	defer span.End()
	sum := sha256.Sum256(body)
	kept := body[:min(len(body), intent.MaxKeptRequestBody)]
	req := &intentv1.BeginSubmissionRequest{
		Tenant: c.tenant, Key: c.key, Operation: c.operation, Token: uint64(c.token), SubmissionId: newID(),
		UpstreamHasLookup: up.Lookup != nil, Timeout: durationpb.New(up.Timeout + g.cfg.RecordGrace),
		Request: &intentv1.SubmittedRequest{Upstream: name, Method: r.Method, Target: target, BodySha256: hex.EncodeToString(sum[:]), BodyBytes: int64(len(body)), BodyKept: kept},
	}
	begun, err := g.begin(ctx, c, req)
	if err != nil {
		g.refuseCall(w, r, up, span, err)
		return
	}
	span.SetAttributes(attribute.String("intentd.verdict", begun.GetVerdict().String()))
	switch begun.GetVerdict() {
	case intentv1.SubmissionVerdict_SUBMISSION_VERDICT_FORWARD:
		g.forward(ctx, w, r, up, c, begun.GetSubmission(), target, body)
	case intentv1.SubmissionVerdict_SUBMISSION_VERDICT_REPLAY:
		g.answer(w, up, begun.GetSubmission(), OutcomeReplayed, true)
	case intentv1.SubmissionVerdict_SUBMISSION_VERDICT_BUSY:
		g.refuse(w, r, up, http.StatusConflict, OutcomeBusy, begun.GetStatement())
	case intentv1.SubmissionVerdict_SUBMISSION_VERDICT_UNKNOWN:
		g.refuse(w, r, up, http.StatusConflict, OutcomeUnknown, begun.GetStatement())
	default:
		g.refuse(w, r, up, http.StatusBadGateway, OutcomeRefused, refusedText(c.key, "intentd answered verdict %v", begun.GetVerdict()))
	}
}

// forward sends the worker's request upstream once, records what came of
// it, and answers the worker what was recorded.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, up *Upstream, c *call, sub *intentv1.Submission, target string, body []byte) {
	deadline := sub.GetDeadline().AsTime()
	out, err := http.NewRequest(r.Method, up.URL.Scheme+"://"+up.URL.Host+upstreamTarget(up, target), nil)
	if err != nil {
		// Not reached: target was checked. Nothing was sent.
		g.settle(ctx, w, r, up, c, sub, deadline, intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_NOT_SENT, nil, "the request could not be built: "+err.Error())
		return
	}
	copyHeaders(out.Header, r.Header)
	for k, v := range up.SetHeaders {
		out.Header.Set(k, v)
	}
	if up.IdempotencyHeader != "" {
		out.Header.Set(up.IdempotencyHeader, intent.OperationKey(c.key, c.operation))
	}
	resp, lost, err := g.send(ctx, up, out, body)
	if err != nil {
		outcome := intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_NOT_SENT
		if lost {
			outcome = intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_LOST
		}
		g.settle(ctx, w, r, up, c, sub, deadline, outcome, nil, err.Error())
		return
	}
	outcome := intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_ANSWERED
	if statusIn(int(resp.GetStatus()), up.RefusalStatuses) {
		outcome = intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_REFUSED
	}
	g.settle(ctx, w, r, up, c, sub, deadline, outcome, resp, "")
}

// send makes the one upstream request of a submission and reads its
// answer into what the record keeps. lost says whether a failure came
// after the request may have reached the upstream.
//
// Nothing here sends a request twice: redirects are not followed, and the
// request body cannot be rewound (no GetBody), so that net/http's
// transport never retries it on a connection that broke, even with an
// Idempotency-Key header (which makes it count a POST as replayable).
func (g *Gateway) send(ctx context.Context, up *Upstream, out *http.Request, body []byte) (resp *intentv1.UpstreamResponse, lost bool, err error) {
	ctx, span := g.tracer.Start(ctx, "upstream "+out.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.String("intentd.upstream", up.Name)))
	defer span.End()
	g.prop.Inject(ctx, propagation.HeaderCarrier(out.Header))
	ctx, cancel := context.WithTimeout(ctx, up.Timeout)
	defer cancel()
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	out = out.WithContext(ctx)
	out.Body, out.GetBody, out.ContentLength = io.NopCloser(bytes.NewReader(body)), nil, int64(len(body))
	start := time.Now()
	defer func() { g.m.upstreamSeconds.WithLabelValues(up.Name).Observe(time.Since(start).Seconds()) }()
	res, err := g.clients[up.Name].Do(out)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, wrote.Load(), fmt.Errorf("%s %s: %w", out.Method, up.Name, unwrapURL(err))
	}
	defer res.Body.Close()
	span.SetAttributes(attribute.Int("http.response.status_code", res.StatusCode))
	keptBody, total, err := readAnswer(res.Body, up.KeepResponseBytes)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, true, fmt.Errorf("the answer (status %d) broke off after %d bytes of its body: %w", res.StatusCode, total, unwrapURL(err))
	}
	return &intentv1.UpstreamResponse{Status: int32(res.StatusCode), Headers: keptHeaders(up, res.Header), Body: keptBody, BodyBytes: total}, false, nil
}

// settle records a submission's outcome and answers the worker: the
// recorded answer, or a statement of what became of the submission.
func (g *Gateway) settle(ctx context.Context, w http.ResponseWriter, r *http.Request, up *Upstream, c *call, sub *intentv1.Submission, deadline time.Time,
	outcome intentv1.SubmissionOutcome, resp *intentv1.UpstreamResponse, why string) {
	rec, err := g.record(ctx, c, deadline, &intentv1.RecordSubmissionRequest{
		Tenant: c.tenant, Key: c.key, Operation: c.operation, Token: sub.GetToken(), SubmissionId: sub.GetSubmissionId(),
		Outcome: outcome, Response: resp, Error: clip(why, 1024),
	})
	if err != nil {
		g.log.Error("gateway: the outcome of a submission could not be recorded", "upstream", up.Name, "key", c.key, "operation", c.operation,
			"submission", sub.GetSubmissionId(), "outcome", outcome.String(), "err", err)
		g.refuse(w, r, up, http.StatusServiceUnavailable, OutcomeUnavailable, refusedText(c.key,
			"the submission of operation %s was sent to %s (%s), but intentd could not record what came back (%v): it reads as unknown once its deadline %s passes, and it is never sent again",
			c.operation, up.Name, outcomeWords(outcome, resp, why), err, deadline.UTC().Format(time.RFC3339)))
		return
	}
	switch outcome {
	case intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_ANSWERED, intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_REFUSED:
		s := rec.GetSubmission()
		if s.GetSubmissionId() != sub.GetSubmissionId() || s.GetResponse() == nil {
			s = &intentv1.Submission{SubmissionId: sub.GetSubmissionId(), Response: resp}
		}
		g.answer(w, up, s, OutcomeForwarded, false)
	case intentv1.SubmissionOutcome_SUBMISSION_OUTCOME_LOST:
		st := rec.GetStatement()
		if st == nil {
			st = refusedText(c.key, "the answer of %s to submission %q was lost (%s); it is never sent again", up.Name, sub.GetSubmissionId(), why)
		}
		g.refuse(w, r, up, http.StatusGatewayTimeout, OutcomeUnknown, st)
	default: // NOT_SENT
		g.refuse(w, r, up, http.StatusBadGateway, OutcomeNotSent, &intentv1.Statement{
			Status: "refused", IntentKey: c.key, ActionTaken: "none",
			Text: fmt.Sprintf("not_sent: nothing reached upstream %s (%s); sending the call again is safe; action_taken: none", up.Name, why),
		})
	}
}

// answer writes a recorded answer: the upstream's status, the kept
// headers in their order, and the kept body, the same bytes first and on
// every replay.
func (g *Gateway) answer(w http.ResponseWriter, up *Upstream, s *intentv1.Submission, outcome string, replayed bool) {
	resp := s.GetResponse()
	h := w.Header()
	for _, f := range resp.GetHeaders() {
		h.Add(f.GetName(), f.GetValue())
	}
	h.Set(HeaderOutcome, outcome)
	h.Set(HeaderSubmission, s.GetSubmissionId())
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	if n := resp.GetBodyBytes(); n > int64(len(resp.GetBody())) {
		h.Set(HeaderTruncated, itoa(n))
	}
	h.Set("Content-Length", itoa(int64(len(resp.GetBody()))))
	g.m.submissions.WithLabelValues(up.Name, outcome).Inc()
	w.WriteHeader(int(resp.GetStatus()))
	_, _ = w.Write(resp.GetBody())
}

// names lists the configured upstreams, sorted.
func (g *Gateway) names() []string {
	out := make([]string, 0, len(g.cfg.Upstreams))
	for n := range g.cfg.Upstreams {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// targetOf is the path and query r asks of upstream name: the upstream's
// base path, then the worker's. A path that is not clean (dot segments,
// doubled or encoded slashes) is refused: it must not reach outside the
// base path.
func targetOf(r *http.Request, name, rest string) (string, error) {
	p := "/" + rest
	raw := r.URL.EscapedPath()
	if strings.Contains(strings.ToLower(raw), "%2f") || strings.Contains(strings.ToLower(raw), "%2e") || strings.Contains(strings.ToLower(raw), "%5c") {
		return "", fmt.Errorf("the path %s encodes a '/', '.' or '\\': not forwarded", quoted(raw))
	}
	if clean := path.Clean(p); clean != p && clean+"/" != p {
		return "", fmt.Errorf("the path %s is not clean (dot segments or doubled slashes): not forwarded", quoted(p))
	}
	if strings.ContainsAny(p, "\\\x00") {
		return "", fmt.Errorf("the path %s holds a backslash or NUL: not forwarded", quoted(p))
	}
	escaped := strings.TrimPrefix(raw, "/u/"+name)
	if escaped == "" {
		escaped = "/"
	}
	t := escaped
	if r.URL.RawQuery != "" {
		t += "?" + r.URL.RawQuery
	}
	return t, nil
}

// upstreamTarget is the target sent to up: its base path, then target.
func upstreamTarget(up *Upstream, target string) string {
	base := up.URL.EscapedPath()
	if target == "/" && base != "" {
		return base
	}
	return base + target
}

var errTooLarge = errors.New("too large")

// readBody reads r's body, at most max bytes.
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.ContentLength > max {
		return nil, fmt.Errorf("of %d bytes exceeds the upstream's max-request-bytes, %d: %w", r.ContentLength, max, errTooLarge)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("could not be read: %v", err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("exceeds the upstream's max-request-bytes, %d: %w", max, errTooLarge)
	}
	return b, nil
}

// readAnswer reads an answer's body: its first keep bytes, and its whole
// size (reading on, bounded, to count it).
func readAnswer(body io.Reader, keep int) ([]byte, int64, error) {
	b, err := io.ReadAll(io.LimitReader(body, int64(keep)))
	if err != nil {
		return b, int64(len(b)), err
	}
	rest, err := io.Copy(io.Discard, io.LimitReader(body, maxRequestBytesLimit))
	return b, int64(len(b)) + rest, err
}

// hopByHop are the headers of one connection, never forwarded.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// copyHeaders copies a worker's headers for the upstream, without the
// hop-by-hop ones (and those its Connection header names), intentd's
// credentials (Authorization: the upstream's own come from set-headers),
// the gateway's own (Intentd-*), Host, Expect, and Accept-Encoding (the
// gateway asks for compression itself and keeps the answer decoded).
func copyHeaders(dst, src http.Header) {
	drop := map[string]bool{}
	for _, v := range src.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			drop[http.CanonicalHeaderKey(strings.TrimSpace(f))] = true
		}
	}
	for k, vs := range src {
		switch {
		case hopByHop[k], drop[k], strings.HasPrefix(k, "Intentd-"),
			k == "Authorization", k == "Host", k == "Expect", k == "Accept-Encoding", k == "Content-Length":
			continue
		}
		dst[k] = append([]string(nil), vs...)
	}
}

// keptHeaders are the answer's headers the upstream keeps, in the order
// it names them. A Location that leaves the upstream's host, or comes
// with a redirect, is not kept: it goes into HeaderNotFollowed instead, so
// that no client is led to follow it.
func keptHeaders(up *Upstream, h http.Header) []*intentv1.HeaderField {
	var out []*intentv1.HeaderField
	for _, name := range up.KeepHeaders {
		for _, v := range h.Values(name) {
			if len(out) == intent.MaxKeptHeaders || len(v) > 8192 {
				break
			}
			if name == "Location" && !sameHost(up, v) {
				out = append(out, &intentv1.HeaderField{Name: HeaderNotFollowed, Value: v})
				continue
			}
			out = append(out, &intentv1.HeaderField{Name: name, Value: v})
		}
	}
	return out
}

// sameHost reports whether location stays on up's host (a relative one
// does).
func sameHost(up *Upstream, location string) bool {
	u, err := url.Parse(location)
	if err != nil {
		return false
	}
	return u.Host == "" && u.Scheme == "" || (u.Scheme == up.URL.Scheme && u.Host == up.URL.Host)
}

// newID is a submission's id: 16 random bytes, in hex.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// unwrapURL drops the *url.Error around a client error, whose text repeats
// the URL (and with it the upstream's base) around the cause.
func unwrapURL(err error) error {
	var u *url.Error
	if errors.As(err, &u) {
		return u.Err
	}
	return err
}

// outcomeWords says what came back from the upstream, for a statement.
func outcomeWords(o intentv1.SubmissionOutcome, resp *intentv1.UpstreamResponse, why string) string {
	if resp != nil {
		return fmt.Sprintf("it answered %d", resp.GetStatus())
	}
	return strings.ToLower(strings.TrimPrefix(o.String(), "SUBMISSION_OUTCOME_")) + ": " + why
}

// clip cuts s to at most n bytes on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

func quoted(s string) string { return fmt.Sprintf("%q", clip(s, 200)) }
