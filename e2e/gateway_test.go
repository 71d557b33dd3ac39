package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// The fencing gateway as it ships, `intentd gateway` processes in front of
// an intentd process and a courier that keeps no idempotency at all: the
// gateway killed mid-call and restarted, and two replicas serving one
// operation at once, still make one pickup per operation, and every
// recorded answer replays byte for byte.

// pickups is a courier: every POST /pickups books a pickup, whatever came
// before; it counts them by the reference the gateway sends (the
// operation key, in Idempotency-Key). hold makes it book and then keep
// the answer until released.
type pickups struct {
	srv *httptest.Server

	mu     sync.Mutex
	byRef  map[string]int
	total  int
	hold   chan struct{} // nil: answer at once
	booked chan string   // told each reference booked, when not nil
}

func newPickups(t *testing.T) *pickups {
	p := &pickups{byRef: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/pickups" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		ref := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		p.byRef[ref]++
		p.total++
		n, hold, booked := p.total, p.hold, p.booked
		p.mu.Unlock()
		if booked != nil {
			booked <- ref
		}
		if hold != nil {
			<-hold
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/pickups/PU-%04d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"PU-%04d","reference":%q,"request":%q}`, n, ref, body)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// count is the number of pickups booked under ref.
func (p *pickups) count(ref string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byRef[ref]
}

func (p *pickups) duplicates() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for ref, n := range p.byRef {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s: %d", ref, n))
		}
	}
	return out
}

// gatewayConfig is a gateway config with the courier at url as upstream
// "courier".
func gatewayConfig(url string, timeout time.Duration, lookup bool) string {
	c := fmt.Sprintf("upstreams:\n  courier:\n    url: %s\n    timeout: %s\n    idempotency-header: Idempotency-Key\n", url, timeout)
	if lookup {
		c += "    lookup:\n      path: /pickups?reference={operation_key}\n"
	}
	return c
}

// gwWorld is intentd, its API, and a courier.
type gwWorld struct {
	t       *testing.T
	d       *harness.Intentd
	api     intentv1.IntentServiceClient
	courier *pickups
}

func newGwWorld(t *testing.T) *gwWorld {
	d := startIntentd(t)
	conn, err := harness.Dial(d.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &gwWorld{t: t, d: d, api: intentv1.NewIntentServiceClient(conn), courier: newPickups(t)}
}

func (w *gwWorld) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	w.t.Cleanup(cancel)
	return ctx
}

// held registers key and acquires it for a worker whose session lives
// ttl; it returns the lease's token.
func (w *gwWorld) held(key string, ttl time.Duration) uint64 {
	w.t.Helper()
	params, _ := structpb.NewStruct(map[string]any{"parcel": key})
	if _, err := w.api.Register(w.ctx(), &intentv1.RegisterRequest{Key: key, Params: params}); err != nil {
		w.t.Fatal(err)
	}
	s, err := w.api.OpenSession(w.ctx(), &intentv1.OpenSessionRequest{Worker: "w-" + key, Ttl: durationpb.New(ttl)})
	if err != nil {
		w.t.Fatal(err)
	}
	a, err := w.api.Acquire(w.ctx(), &intentv1.AcquireRequest{Key: key, SessionId: s.GetSessionId(), RequestId: "r-" + key})
	if err != nil {
		w.t.Fatal(err)
	}
	return a.GetLease().GetToken()
}

// gwAnswer is what a call through the gateway came back with; err is a
// transport error (the gateway gone).
type gwAnswer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a gwAnswer) outcome() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return a.header.Get("Intentd-Outcome")
}

// submitTo sends key's pickup through the gateway at url under token.
func submitTo(url, key string, token uint64) gwAnswer {
	req, err := http.NewRequest("POST", url+"/u/courier/pickups", strings.NewReader(`{"parcel":"`+key+`"}`))
	if err != nil {
		return gwAnswer{err: err}
	}
	req.Header.Set("Intentd-Key", key)
	req.Header.Set("Intentd-Operation", "create-pickup")
	req.Header.Set("Intentd-Fencing-Token", fmt.Sprint(token))
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return gwAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return gwAnswer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// sameAnswer reports whether a replay carries exactly the first answer:
// status, the kept headers, the body.
func sameAnswer(first, replay gwAnswer) bool {
	return first.status == replay.status && bytes.Equal(first.body, replay.body) &&
		first.header.Get("Location") == replay.header.Get("Location") && first.header.Get("Content-Type") == replay.header.Get("Content-Type") &&
		replay.header.Get("Intentd-Replayed") == "true"
}

// A gateway SIGKILLed while the courier holds its answer, then restarted:
// the worker's retry is told the call is in flight until its deadline, and
// unknown after it (the intent in the review queue: the courier has no
// lookup); nothing is sent again. An answer recorded before the kill
// replays byte for byte from the restarted gateway.
func TestGatewayKilledMidCall(t *testing.T) {
	w := newGwWorld(t)
	gw := harness.StartGateway(t, harness.Bins(t), "g1", w.d.Addr, gatewayConfig(w.courier.srv.URL, 3*time.Second, false), "--record-grace", "1s")
	done := w.held("parcel-done", time.Minute)
	first := submitTo(gw.URL, "parcel-done", done)
	if first.status != http.StatusCreated || first.outcome() != "forwarded" {
		t.Fatalf("first call: %d %s %s", first.status, first.outcome(), first.body)
	}

	tok := w.held("parcel-killed", time.Minute)
	hold, booked := make(chan struct{}), make(chan string, 1)
	w.courier.mu.Lock()
	w.courier.hold, w.courier.booked = hold, booked
	w.courier.mu.Unlock()
	t.Cleanup(func() { close(hold) })
	lost := make(chan gwAnswer, 1)
	go func() { lost <- submitTo(gw.URL, "parcel-killed", tok) }()
	select {
	case <-booked:
	case <-time.After(20 * time.Second):
		t.Fatal("the courier never received the call")
	}
	gw.Kill()
	if a := <-lost; a.err == nil {
		t.Fatalf("the call through the killed gateway answered %d %s", a.status, a.body)
	}
	w.courier.mu.Lock()
	w.courier.booked = nil
	w.courier.mu.Unlock()
	if err := gw.Restart(); err != nil {
		t.Fatal(err)
	}

	if replay := submitTo(gw.URL, "parcel-done", done); !sameAnswer(first, replay) {
		t.Errorf("after the restart the recorded answer replays as %d %v %q, want %d %q", replay.status, replay.header, replay.body, first.status, first.body)
	}
	if a := submitTo(gw.URL, "parcel-killed", tok); a.status != http.StatusConflict || a.outcome() != "refused_busy" {
		t.Errorf("retry at once: %d %s %s, want 409 refused_busy", a.status, a.outcome(), a.body)
	}
	deadline := time.Now().Add(30 * time.Second)
	var a gwAnswer
	for {
		a = submitTo(gw.URL, "parcel-killed", tok)
		if a.outcome() != "refused_busy" || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if a.status != http.StatusConflict || a.outcome() != "unknown" || !strings.Contains(string(a.body), "needs_review") {
		t.Errorf("retry past the deadline: %d %s %s, want 409 unknown, needs_review", a.status, a.outcome(), a.body)
	}
	in, err := w.api.Get(w.ctx(), &intentv1.GetRequest{Key: "parcel-killed"})
	if err != nil {
		t.Fatal(err)
	}
	if in.GetIntent().GetState() != intentv1.State_STATE_NEEDS_REVIEW {
		t.Errorf("intent %v, want NEEDS_REVIEW", in.GetIntent().GetState())
	}
	if n := w.courier.count("parcel-killed:create-pickup"); n != 1 {
		t.Errorf("%d pickups booked for parcel-killed, want 1", n)
	}
}

// Two gateway replicas, each operation called at once through both by
// racing workers (the same lease), one replica restarted in the middle:
// one pickup per operation, and every later call through either replica
// replays the recorded answer byte for byte.
func TestTwoGatewayReplicasOneEffect(t *testing.T) {
	w := newGwWorld(t)
	bins := harness.Bins(t)
	conf := gatewayConfig(w.courier.srv.URL, 5*time.Second, true)
	gws := []*harness.Gateway{
		harness.StartGateway(t, bins, "g1", w.d.Addr, conf, "--record-grace", "2s"),
		harness.StartGateway(t, bins, "g2", w.d.Addr, conf, "--record-grace", "2s"),
	}
	const n = 24
	tokens := make([]uint64, n)
	for i := range n {
		tokens[i] = w.held(fmt.Sprintf("parcel-%02d", i), time.Minute)
	}
	var mu sync.Mutex
	firsts := map[string]gwAnswer{}
	var wg sync.WaitGroup
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(150 * time.Millisecond)
		gws[1].Stop() // SIGTERM: its calls in flight finish and record
		if err := gws[1].Restart(); err != nil {
			t.Error(err)
		}
	}()
	for i := range n {
		key := fmt.Sprintf("parcel-%02d", i)
		for racer := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
				for try := 0; try < 60; try++ {
					a := submitTo(gws[(i+racer+try)%2].URL, key, tokens[i])
					if a.err == nil && a.status == http.StatusCreated {
						mu.Lock()
						if _, ok := firsts[key]; !ok && a.outcome() == "forwarded" {
							firsts[key] = a
						}
						mu.Unlock()
						return
					}
					time.Sleep(100 * time.Millisecond) // busy, or the replica restarting
				}
				t.Errorf("%s: no answer after 60 tries", key)
			}()
		}
	}
	wg.Wait()
	<-restarted
	if d := w.courier.duplicates(); len(d) > 0 {
		t.Errorf("duplicate pickups: %v", d)
	}
	for i := range n {
		key := fmt.Sprintf("parcel-%02d", i)
		if c := w.courier.count(key + ":create-pickup"); c != 1 {
			t.Errorf("%s: %d pickups, want 1", key, c)
		}
		first, ok := firsts[key]
		if !ok {
			t.Errorf("%s: no call was answered forwarded", key)
			continue
		}
		for _, g := range gws {
			if r := submitTo(g.URL, key, tokens[i]); !sameAnswer(first, r) {
				t.Errorf("%s through %s replays %d %q, want %d %q", key, g.Name, r.status, r.body, first.status, first.body)
			}
		}
	}
	var body struct{ ID string }
	if err := json.Unmarshal(firsts["parcel-00"].body, &body); err != nil || body.ID == "" {
		t.Errorf("the courier's answer %q did not come through", firsts["parcel-00"].body)
	}
}
