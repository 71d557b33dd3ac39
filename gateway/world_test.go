package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/access"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/gateway"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// The tests' world: a real intentd (the whole daemon, its own embedded
// etcd, a tokens file), the gateway in front of counting upstreams that
// are not idempotent at all, and workers calling through it with their
// own intentd credentials.

// The principals of the tokens file, by bearer token.
const (
	adminToken  = "tok-admin-6f1d"
	workerToken = "tok-worker-acme-93ab" // worker of tenant acme
	otherToken  = "tok-worker-other-c0de"
	readerToken = "tok-reader-acme-77e1"
)

type world struct {
	t       *testing.T
	in      *intentdtest.Intentd
	conn    *grpc.ClientConn
	api     intentv1.IntentServiceClient
	gw      *httptest.Server
	gateway *gateway.Gateway
	courier *courier
}

// newWorld starts intentd and a gateway with the courier as upstream
// "courier" (configured by tune, if not nil).
func newWorld(t *testing.T, tune func(*gateway.Config)) *world {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	var f access.File
	for _, p := range []struct {
		name, token, tenant string
		role                access.Role
	}{
		{"admin", adminToken, access.AllTenants, access.RoleAdmin},
		{"worker-acme", workerToken, "acme", access.RoleWorker},
		{"worker-other", otherToken, "other", access.RoleWorker},
		{"reader-acme", readerToken, "acme", access.RoleReader},
	} {
		f.Principals = append(f.Principals, access.Entry{Name: p.name, Tenants: []string{p.tenant}, Roles: []access.Role{p.role}, TokenSHA256: []string{access.HashToken(p.token)}})
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := intentdtest.Config(filepath.Join(dir, "intentd"))
	cfg.TokensFile = tokens
	in := intentdtest.Start(t, cfg, slog.New(slog.DiscardHandler))
	conn, err := grpc.NewClient(in.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	w := &world{t: t, in: in, conn: conn, api: intentv1.NewIntentServiceClient(conn), courier: newCourier(t)}
	gcfg := gateway.Config{Upstreams: map[string]*gateway.Upstream{
		"courier": {URL: mustURL(t, w.courier.srv.URL), Timeout: 2 * time.Second, IdempotencyHeader: "Idempotency-Key",
			KeepHeaders: []string{"Content-Type", "Location", "X-Pickup"}, SetHeaders: map[string]string{"X-Courier-Key": "courier-secret"},
			Lookup: &gateway.Lookup{Path: "/pickups?reference={operation_key}"}},
	}}
	if tune != nil {
		tune(&gcfg)
	}
	w.gateway, err = gateway.New(gcfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	w.gw = httptest.NewServer(w.gateway)
	t.Cleanup(w.gw.Close)
	return w
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// as is a context carrying token as the caller's bearer credentials.
func (w *world) as(token string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	w.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// register approves key in tenant acme.
func (w *world) register(key string) {
	w.t.Helper()
	params, _ := structpb.NewStruct(map[string]any{"parcel": key, "address": "Main St 1"})
	if _, err := w.api.Register(w.as(adminToken), &intentv1.RegisterRequest{Tenant: "acme", Key: key, Params: params}); err != nil {
		w.t.Fatalf("Register(%s): %v", key, err)
	}
}

// lease opens a session of ttl for a worker of acme and acquires key,
// insisting on outcome want; it returns the session and token.
func (w *world) lease(key, worker string, ttl time.Duration, want intentv1.Outcome) (string, fencing.Token) {
	w.t.Helper()
	s, err := w.api.OpenSession(w.as(workerToken), &intentv1.OpenSessionRequest{Worker: worker, Ttl: durationpb.New(ttl)})
	if err != nil {
		w.t.Fatal(err)
	}
	a, err := w.api.Acquire(w.as(workerToken), &intentv1.AcquireRequest{Key: key, SessionId: s.GetSessionId(), RequestId: worker + "-" + key})
	if err != nil {
		w.t.Fatalf("Acquire(%s) by %s: %v", key, worker, err)
	}
	if a.GetOutcome() != want {
		w.t.Fatalf("Acquire(%s) by %s: %v, want %v", key, worker, a.GetOutcome(), want)
	}
	return s.GetSessionId(), fencing.Token(a.GetLease().GetToken())
}

func (w *world) get(key string) *intentv1.Intent {
	w.t.Helper()
	r, err := w.api.Get(w.as(adminToken), &intentv1.GetRequest{Tenant: "acme", Key: key})
	if err != nil {
		w.t.Fatalf("Get(%s): %v", key, err)
	}
	return r.GetIntent()
}

// answer is a response of the gateway, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// statement decodes a refusal's body.
func (a answer) statement(t *testing.T) *intentv1.Statement {
	t.Helper()
	var st intentv1.Statement
	if err := protojson.Unmarshal(a.body, &st); err != nil {
		t.Fatalf("body %q is no statement: %v", a.body, err)
	}
	return &st
}

// submit sends a call through the gateway as a worker of acme.
func (w *world) submit(method, path, key, operation string, token fencing.Token, body string, extra ...string) answer {
	w.t.Helper()
	req, err := http.NewRequest(method, w.gw.URL+path, strings.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+workerToken)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(gateway.HeaderKey, key)
	}
	if operation != "" {
		req.Header.Set(gateway.HeaderOperation, operation)
	}
	fencing.SetHeader(req.Header, token)
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "" {
			req.Header.Del(extra[i])
		} else {
			req.Header.Add(extra[i], extra[i+1])
		}
	}
	return w.do(req)
}

func (w *world) do(req *http.Request) answer {
	w.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// pickup is the courier's body of one pickup.
func pickup(key string) string { return fmt.Sprintf(`{"parcel":%q,"address":"Main St 1"}`, key) }

// courier books a pickup for every POST /pickups it receives: no
// idempotency at all, every request an effect. GET /pickups?reference=R
// finds a pickup by the Idempotency-Key it was booked under (its lookup).
// It can hold its answers, answer late, or lose them after committing.
type courier struct {
	srv *httptest.Server

	mu       sync.Mutex
	booked   []booking
	requests []*http.Request // every request received, lookups included
	delay    time.Duration   // each POST answers after this (after booking)
	status   int             // each POST answers this (0: 201)
	redirect string          // each POST answers 302 to this
}

type booking struct {
	ID, Reference, Body string
}

func newCourier(t *testing.T) *courier {
	c := &courier{}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *courier) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	c.requests = append(c.requests, r.Clone(context.Background()))
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/pickups":
		if c.status != 0 && c.status != http.StatusCreated {
			status := c.status
			c.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error":"refused with %d"}`, status)
			return
		}
		b := booking{ID: fmt.Sprintf("PU-%04d", len(c.booked)+1), Reference: r.Header.Get("Idempotency-Key"), Body: string(body)}
		c.booked = append(c.booked, b)
		delay, redirect := c.delay, c.redirect
		c.mu.Unlock()
		time.Sleep(delay)
		if redirect != "" {
			w.Header().Set("Location", redirect)
			w.WriteHeader(http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/pickups/"+b.ID)
		w.Header().Set("X-Pickup", b.ID)
		w.Header().Set("X-Not-Kept", "secret-internal")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"reference":%q}`, b.ID, b.Reference)
	case r.Method == http.MethodGet && r.URL.Path == "/pickups":
		ref := r.URL.Query().Get("reference")
		defer c.mu.Unlock()
		for _, b := range c.booked {
			if b.Reference == ref {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":%q,"reference":%q}`, b.ID, b.Reference)
				return
			}
		}
		http.Error(w, `{"error":"no pickup"}`, http.StatusNotFound)
	default:
		c.mu.Unlock()
		http.NotFound(w, r)
	}
}

// count is the number of pickups booked: the courier's effects.
func (c *courier) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.booked)
}

func (c *courier) set(f func(c *courier)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

// received lists the requests received.
func (c *courier) received() []*http.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*http.Request(nil), c.requests...)
}

// cutReplies is an upstream transport that lets a request reach the
// upstream and its effect happen, then loses the answer, as a connection
// reset after the request was sent does.
type cutReplies struct {
	mu   sync.Mutex
	cut  bool
	cuts int
}

func (c *cutReplies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || !c.cut {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	c.cuts++
	return nil, fmt.Errorf("read tcp: connection reset by peer (the reply was cut after the upstream answered %d)", resp.StatusCode)
}

func (c *cutReplies) set(cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = cut
}

// entries are key's history entries of kind.
func entries(in *intentv1.Intent, kind intentv1.HistoryEntry_Kind) []*intentv1.HistoryEntry {
	var out []*intentv1.HistoryEntry
	for _, e := range in.GetHistory() {
		if e.GetKind() == kind {
			out = append(out, e)
		}
	}
	return out
}

func httptestServer(t *testing.T, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}
