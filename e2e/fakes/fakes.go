// Package fakes holds the effect-counting providers the end-to-end and
// reliability suites measure the world with: they run on loopback
// (httptest) and count effects, so that a test asserts how many orders,
// authorizations and pickups really exist, not what a status field says.
//
//   - Merchant creates one order per Idempotency-Key and can be asked for
//     the order of a key.
//   - Payments behaves like Stripe API v1 idempotency: keys scoped per
//     account, parameters compared, a concurrent duplicate refused as "in
//     use" with nothing stored, the first response (even a 500) stored and
//     replayed, keys forgotten after a retention window.
//   - Courier takes no idempotency key at all: every call is an effect. It
//     sits behind Gateway, ours, which admits a call only under a fencing
//     token no older than one it has already admitted for the same intent.
//
// CutReply is the network fault that matters most: the request reaches the
// provider, the effect happens, and the answer never comes back.
//
// e2e's fakes_test.go pins down that each behaves as documented, through
// the same client code the scenarios use.
package fakes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/intentd/intentd/fencing"
)

// Clock is the providers' notion of now: the wall clock plus an offset a
// test moves forward, so that retention windows pass without waiting. The
// zero Clock is the wall clock. Safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now returns the wall clock plus the offset.
func (c *Clock) Now() time.Time {
	if c == nil {
		return time.Now()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// IdempotencyKeyHeader carries a provider idempotency key (Merchant,
// Payments).
const IdempotencyKeyHeader = "Idempotency-Key"

// ReplayedHeader is set to "true" on a response replayed for a known
// idempotency key.
const ReplayedHeader = "Idempotent-Replayed"

// writeJSON writes v as a JSON response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// APIError is the error body every provider here answers with, shaped like
// Stripe's.
type APIError struct {
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, code, format string, args ...any) {
	var e APIError
	e.Error.Type, e.Error.Code, e.Error.Message = typ, code, fmt.Sprintf(format, args...)
	writeJSON(w, status, e)
}

// Order is one order a Merchant holds.
type Order struct {
	ID        string `json:"id"`
	Key       string `json:"idempotency_key"`
	Reference string `json:"reference"`
	Item      string `json:"item"`
	Quantity  int    `json:"quantity"`
}

// OrderRequest is the body of POST /orders.
type OrderRequest struct {
	// Reference is the buyer's own reference for the order (the intent
	// key): the merchant does not deduplicate on it, but Duplicates counts
	// by it, so that an order placed twice under two idempotency keys shows.
	Reference string `json:"reference"`
	Item      string `json:"item"`
	Quantity  int    `json:"quantity"`
}

// Merchant is a shop that deduplicates orders on the Idempotency-Key
// header, as a well-behaved provider does.
//
//	POST /orders      (Idempotency-Key required, body OrderRequest)
//	                  201 + Order when created; 200 + the same Order, with
//	                  Idempotent-Replayed: true, for a key it knows; 422 for
//	                  a known key with another body.
//	GET  /orders?key=K  200 + the Order of key K, or 404.
type Merchant struct {
	mu       sync.Mutex
	byKey    map[string]*Order
	orders   []*Order
	requests int
}

// NewMerchant returns a merchant with no orders.
func NewMerchant() *Merchant { return &Merchant{byKey: map[string]*Order{}} }

// ServeHTTP implements the API above.
func (m *Merchant) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		m.create(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/orders":
		m.mu.Lock()
		o, ok := m.byKey[r.URL.Query().Get("key")]
		var cp Order
		if ok {
			cp = *o
		}
		m.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "no order under key %q", r.URL.Query().Get("key"))
			return
		}
		writeJSON(w, http.StatusOK, cp)
	default:
		http.NotFound(w, r)
	}
}

func (m *Merchant) create(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(IdempotencyKeyHeader)
	if key == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_idempotency_key", "orders need an %s header", IdempotencyKeyHeader)
		return
	}
	var req OrderRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "bad_body", "%v", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests++
	if o, ok := m.byKey[key]; ok {
		if o.Reference != req.Reference || o.Item != req.Item || o.Quantity != req.Quantity {
			writeError(w, http.StatusUnprocessableEntity, "idempotency_error", "", "key %q was used for another order", key)
			return
		}
		w.Header().Set(ReplayedHeader, "true")
		writeJSON(w, http.StatusOK, *o)
		return
	}
	o := &Order{ID: fmt.Sprintf("SO-%04d", len(m.orders)+1), Key: key, Reference: req.Reference, Item: req.Item, Quantity: req.Quantity}
	m.byKey[key] = o
	m.orders = append(m.orders, o)
	writeJSON(w, http.StatusCreated, *o)
}

// Count is the number of orders created: the merchant's effects.
func (m *Merchant) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.orders)
}

// Requests is the number of POST /orders the merchant accepted for
// processing, replays included.
func (m *Merchant) Requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests
}

// Orders returns a copy of every order, oldest first.
func (m *Merchant) Orders() []Order {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Order, len(m.orders))
	for i, o := range m.orders {
		out[i] = *o
	}
	return out
}

// ByReference returns every order of each reference, oldest first.
func (m *Merchant) ByReference() map[string][]Order {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]Order{}
	for _, o := range m.orders {
		out[o.Reference] = append(out[o.Reference], *o)
	}
	return out
}

// Duplicates counts orders beyond the first for each reference: orders
// the buyer placed twice, under any keys.
func (m *Merchant) Duplicates() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	n := 0
	for _, o := range m.orders {
		if seen[o.Reference] {
			n++
		}
		seen[o.Reference] = true
	}
	return n
}

// Authorization is one payment authorization Payments holds.
type Authorization struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Account   string `json:"account"`
	Amount    int    `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference"`
	Status    string `json:"status"`
}

// AccountHeader scopes a Payments request (and its idempotency key) to a
// connected account, as Stripe-Account does.
const AccountHeader = "Stripe-Account"

// PlatformAccount is the account of a request without AccountHeader.
const PlatformAccount = "acct_platform"

// IdempotencyRecord is what GET /v1/idempotency_keys answers about a key.
type IdempotencyRecord struct {
	Key      string `json:"key"`
	Account  string `json:"account"`
	InFlight bool   `json:"in_flight"`
	// Status and Body are the stored first response, when not in flight.
	Status int             `json:"status,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
}

type scopedKey struct{ account, key string }

type idempotencyEntry struct {
	params   string
	created  time.Time
	inFlight bool
	status   int
	body     []byte
}

// Payments is a payment provider whose idempotency behaves like Stripe API
// v1:
//
//   - Keys are scoped per account (AccountHeader): the same key under two
//     accounts is two requests.
//   - A key reused with other parameters is refused with 400
//     (idempotency_error), and nothing happens.
//   - A request whose key is held by a request still in flight is refused
//     with 409 (idempotency_key_in_use); nothing is stored for it.
//   - The first response under a key, whatever it is (a 500 included), is
//     stored and replayed to every later request with that key, with
//     Idempotent-Replayed: true.
//   - Keys are forgotten Retention after first use (by Clock): a request
//     after that is a new request.
//   - A request without a key is not deduplicated at all.
//
// Its API:
//
//	POST /v1/payment_intents          form: amount, currency, reference;
//	                                  200 + Authorization (status requires_capture)
//	GET  /v1/idempotency_keys?key=K   200 + IdempotencyRecord, or 404 for a
//	                                  key it never saw or has forgotten
//
// The GET stands in for reconciliation by key (Stripe's own answer is to
// replay the request; a lookup keeps the test's reconciliation honest about
// what it asks).
type Payments struct {
	// Retention is how long a key is remembered (Stripe: 24h).
	Retention time.Duration
	// Clock tells time for Retention; nil is the wall clock.
	Clock *Clock

	mu       sync.Mutex
	keys     map[scopedKey]*idempotencyEntry
	auths    []Authorization
	posts    int
	byKey    map[string]int // POSTs per idempotency key, any outcome
	holds    []hold
	failures int
}

// hold is a request HoldNext asked for: started is closed when the request
// waits, gate releases it.
type hold struct{ started, gate chan struct{} }

// NewPayments returns a provider that remembers keys for retention.
func NewPayments(retention time.Duration, clock *Clock) *Payments {
	return &Payments{Retention: retention, Clock: clock, keys: map[scopedKey]*idempotencyEntry{}, byKey: map[string]int{}}
}

// HoldNext makes the next request that is executed (not refused, not
// replayed) wait, after its key is reserved, until release is called. started
// is closed when it is waiting. The request keeps running if its client
// goes away, as a provider's does.
func (p *Payments) HoldNext() (started <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := hold{started: make(chan struct{}), gate: make(chan struct{})}
	p.holds = append(p.holds, h)
	var once sync.Once
	return h.started, func() { once.Do(func() { close(h.gate) }) }
}

// FailNext makes the next n executed requests answer 500 without
// authorizing anything; each 500 is stored under its key and replayed.
func (p *Payments) FailNext(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failures += n
}

// ServeHTTP implements the API above.
func (p *Payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/payment_intents":
		p.authorize(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/idempotency_keys":
		p.lookup(w, r)
	default:
		http.NotFound(w, r)
	}
}

func account(r *http.Request) string {
	if a := r.Header.Get(AccountHeader); a != "" {
		return a
	}
	return PlatformAccount
}

// live returns the entry of k unless it is unknown or past retention (then
// forgotten).
func (p *Payments) live(k scopedKey) *idempotencyEntry {
	e := p.keys[k]
	if e != nil && p.Retention > 0 && p.Clock.Now().Sub(e.created) > p.Retention {
		delete(p.keys, k)
		return nil
	}
	return e
}

func (p *Payments) authorize(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "%v", err)
		return
	}
	params := r.PostForm.Encode() // sorted by name: the parameters as compared
	key := r.Header.Get(IdempotencyKeyHeader)
	sk := scopedKey{account(r), key}

	p.mu.Lock()
	p.posts++
	if key != "" {
		p.byKey[key]++
		if e := p.live(sk); e != nil {
			switch {
			case e.params != params:
				p.mu.Unlock()
				writeError(w, http.StatusBadRequest, "idempotency_error", "",
					"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '%s' if you meant to execute a different request.", key)
			case e.inFlight:
				p.mu.Unlock()
				writeError(w, http.StatusConflict, "idempotency_error", "idempotency_key_in_use",
					"There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): %s. Please try again later.", key)
			default:
				status, body := e.status, e.body
				p.mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set(ReplayedHeader, "true")
				w.WriteHeader(status)
				_, _ = w.Write(body)
			}
			return
		}
		p.keys[sk] = &idempotencyEntry{params: params, created: p.Clock.Now(), inFlight: true}
	}
	var gate chan struct{}
	if len(p.holds) > 0 {
		gate = p.holds[0].gate
		close(p.holds[0].started)
		p.holds = p.holds[1:]
	}
	p.mu.Unlock()

	if gate != nil {
		// A provider keeps processing when the client goes away; the bound
		// only keeps a forgotten hold from leaking this goroutine.
		select {
		case <-gate:
		case <-time.After(time.Minute):
		}
	}

	p.mu.Lock()
	status, body := p.execute(sk.account, r.PostForm)
	if key != "" {
		e := p.keys[sk]
		e.inFlight, e.status, e.body = false, status, body
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// execute runs one request (p.mu held): an authorization, or an injected
// 500.
func (p *Payments) execute(acct string, form url.Values) (int, []byte) {
	if p.failures > 0 {
		p.failures--
		var e APIError
		e.Error.Type, e.Error.Message = "api_error", "An unknown error occurred"
		b, _ := json.Marshal(e)
		return http.StatusInternalServerError, b
	}
	amount, err := strconv.Atoi(form.Get("amount"))
	if err != nil || amount <= 0 {
		var e APIError
		e.Error.Type, e.Error.Code, e.Error.Message = "invalid_request_error", "parameter_invalid_integer", "amount must be a positive integer"
		b, _ := json.Marshal(e)
		return http.StatusBadRequest, b
	}
	a := Authorization{
		ID: fmt.Sprintf("pi_%04d", len(p.auths)+1), Object: "payment_intent", Account: acct,
		Amount: amount, Currency: form.Get("currency"), Reference: form.Get("reference"), Status: "requires_capture",
	}
	p.auths = append(p.auths, a)
	b, _ := json.Marshal(a)
	return http.StatusOK, b
}

func (p *Payments) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	sk := scopedKey{account(r), key}
	p.mu.Lock()
	e := p.live(sk)
	var rec IdempotencyRecord
	if e != nil {
		rec = IdempotencyRecord{Key: key, Account: sk.account, InFlight: e.inFlight, Status: e.status, Body: e.body}
	}
	p.mu.Unlock()
	if e == nil {
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "no idempotency key %q for account %s", key, sk.account)
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// Count is the number of authorizations: the provider's effects.
func (p *Payments) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.auths)
}

// Authorizations returns a copy of every authorization, oldest first.
func (p *Payments) Authorizations() []Authorization {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Authorization(nil), p.auths...)
}

// Posts is the number of POSTs received, refused and replayed ones
// included.
func (p *Payments) Posts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.posts
}

// PostsByKey returns, for each idempotency key received, how many POSTs
// carried it.
func (p *Payments) PostsByKey() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.byKey))
	for k, n := range p.byKey {
		out[k] = n
	}
	return out
}

// Pickup is one pickup a Courier booked.
type Pickup struct {
	ID      string `json:"id"`
	Parcel  string `json:"parcel"`
	Address string `json:"address"`
}

// Courier books a pickup for every POST /pickups it receives: it knows no
// idempotency key, so every call is an effect. It must sit behind Gateway.
type Courier struct {
	mu      sync.Mutex
	pickups []Pickup
}

// ServeHTTP books a pickup from a JSON body {parcel, address}.
func (c *Courier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/pickups" {
		http.NotFound(w, r)
		return
	}
	var p Pickup
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "%v", err)
		return
	}
	c.mu.Lock()
	p.ID = fmt.Sprintf("PU-%04d", len(c.pickups)+1)
	c.pickups = append(c.pickups, p)
	c.mu.Unlock()
	writeJSON(w, http.StatusCreated, p)
}

// Count is the number of pickups booked: the courier's effects.
func (c *Courier) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pickups)
}

// IntentKeyHeader names the intent a call through Gateway is for: the
// resource its fencing tokens are compared within.
const IntentKeyHeader = "Intent-Key"

// Forwarded is one call Gateway passed on, as GET /pickups reports it.
type Forwarded struct {
	Token  fencing.Token   `json:"token"`
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// Gateway fronts a provider without idempotency (Courier) with fencing. It
// reads the worker's token (fencing.Header) and intent key (IntentKeyHeader)
// and admits a call only through Checker.Admit(intent key, token): a token
// older than one already admitted for that intent gets 409 and never
// reaches the provider. It holds one lock across the check and the
// forwarded call, so that a check and its write are one step.
//
//	POST /pickups          forwarded to Upstream when admitted; 409 when
//	                       stale; 400 without a token or intent key
//	GET  /pickups?intent=K with a token: admitted like a call (a reconciler's
//	                       lookup fences out every older token), then
//	                       200 + []Forwarded for K, or 404 if none
type Gateway struct {
	// Upstream is the provider's base URL.
	Upstream string
	// Checker remembers the highest token admitted per intent.
	Checker *fencing.MemoryChecker
	// Client calls Upstream; nil is http.DefaultClient.
	Client *http.Client

	mu        sync.Mutex
	forwarded map[string][]Forwarded
	refused   int
}

// NewGateway returns a gateway to upstream with an empty MemoryChecker.
func NewGateway(upstream string) *Gateway {
	return &Gateway{Upstream: upstream, Checker: fencing.NewMemoryChecker(), forwarded: map[string][]Forwarded{}}
}

// ServeHTTP implements the API above.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/pickups" || (r.Method != http.MethodPost && r.Method != http.MethodGet) {
		http.NotFound(w, r)
		return
	}
	tok, err := fencing.FromHeader(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "fencing_token", "%v", err)
		return
	}
	key := r.Header.Get(IntentKeyHeader)
	if r.Method == http.MethodGet {
		key = r.URL.Query().Get("intent")
	}
	if key == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "intent_key", "no intent key")
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.Checker.Admit(r.Context(), key, tok); err != nil {
		if errors.Is(err, fencing.ErrStale) {
			g.refused++
			writeError(w, http.StatusConflict, "fencing_error", "stale_token", "%v", err)
			return
		}
		writeError(w, http.StatusServiceUnavailable, "api_error", "", "%v", err)
		return
	}
	if r.Method == http.MethodGet {
		calls := g.forwarded[key]
		if len(calls) == 0 {
			writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "no call forwarded for intent %q", key)
			return
		}
		writeJSON(w, http.StatusOK, calls)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "%v", err)
		return
	}
	client := g.Client
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, g.Upstream+"/pickups", bytes.NewReader(body))
	if err != nil {
		writeError(w, http.StatusInternalServerError, "api_error", "", "%v", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		// The call may have reached the provider: keep the doubt visible.
		g.forwarded[key] = append(g.forwarded[key], Forwarded{Token: tok, Status: 0})
		writeError(w, http.StatusBadGateway, "api_error", "", "upstream: %v", err)
		return
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	g.forwarded[key] = append(g.forwarded[key], Forwarded{Token: tok, Status: resp.StatusCode, Body: rb})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(rb)
}

// Refused is the number of calls refused for a stale token.
func (g *Gateway) Refused() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused
}

// ErrReplyCut is the error CutReply returns in place of a response that
// the provider did send.
var ErrReplyCut = errors.New("fakes: connection reset after the request was sent (reply cut)")

// CutReply is an http.RoundTripper for a worker's HTTP client that lets a
// chosen request reach the provider, waits for the provider's answer, and
// then drops it: the caller gets ErrReplyCut, as after a connection reset,
// while the effect happened.
type CutReply struct {
	// Base sends the requests; nil is http.DefaultTransport.
	Base http.RoundTripper
	// Cut chooses the requests whose reply is lost; it is called after the
	// provider answered. nil cuts nothing.
	Cut func(*http.Request) bool

	mu   sync.Mutex
	cuts []string
}

// RoundTrip sends req and, if Cut says so, loses the answer.
func (c *CutReply) RoundTrip(req *http.Request) (*http.Response, error) {
	base := c.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	if err != nil || c.Cut == nil || !c.Cut(req) {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	c.mu.Lock()
	c.cuts = append(c.cuts, req.Method+" "+req.URL.Path+" "+req.Header.Get(IdempotencyKeyHeader))
	c.mu.Unlock()
	return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, ErrReplyCut)
}

// Cuts lists the requests whose replies were cut ("METHOD path key").
func (c *CutReply) Cuts() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.cuts...)
}

// CutFirst returns a Cut function that cuts the reply to the first request
// with method and path for each idempotency key in keys (every key, when
// keys is empty), and no later one.
func CutFirst(method, path string, keys ...string) func(*http.Request) bool {
	var mu sync.Mutex
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	done := map[string]bool{}
	return func(r *http.Request) bool {
		if r.Method != method || r.URL.Path != path {
			return false
		}
		k := r.Header.Get(IdempotencyKeyHeader)
		mu.Lock()
		defer mu.Unlock()
		if (len(want) > 0 && !want[k]) || done[k] {
			return false
		}
		done[k] = true
		return true
	}
}
