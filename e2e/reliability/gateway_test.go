package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// The fencing gateway's fault family: workers whose side effect is an HTTP
// call through `intentd gateway` processes to a courier that keeps no
// idempotency at all, while the etcd leader is killed and the gateways
// are restarted (one SIGKILLed mid-call). The world must hold one pickup
// per intent, the one its result names.

// courierRef is the header the gateway sends the operation key in; the
// courier books regardless, and finds bookings by it (its lookup).
const courierRef = "Idempotency-Key"

// bookings is the courier: every POST /pickups books a pickup; GET
// /pickups?reference=R finds the one booked under R.
type bookings struct {
	mu    sync.Mutex
	byRef map[string][]string // reference → pickup ids
	n     int
	// armed makes the next call forwarded by gateway g1 book, tell caught
	// and then hold its answer until release: a call in flight to kill
	// g1 in.
	armed   bool
	caught  chan struct{}
	release chan struct{}
}

func (b *bookings) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ref := r.Header.Get(courierRef)
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/pickups":
		_, _ = io.Copy(io.Discard, r.Body)
		b.mu.Lock()
		b.n++
		id := fmt.Sprintf("PU-%05d", b.n)
		b.byRef[ref] = append(b.byRef[ref], id)
		hold := b.armed && r.Header.Get("X-Gateway") == "g1"
		if hold {
			b.armed = false
		}
		b.mu.Unlock()
		if hold {
			close(b.caught)
			<-b.release
		}
		time.Sleep(20 * time.Millisecond) // an upstream that takes its time: calls are in flight when the faults strike
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	case r.Method == http.MethodGet && r.URL.Path == "/pickups":
		b.mu.Lock()
		ids := b.byRef[r.URL.Query().Get("reference")]
		b.mu.Unlock()
		if len(ids) == 0 {
			http.Error(w, `{"error":"no pickup"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q}`, ids[0])
	default:
		http.NotFound(w, r)
	}
}

// gatewayWorker carries intents out through the gateways: Execute sends
// the pickup; Reconcile sends it again (the gateway replays an answer it
// recorded, forwards when nothing was ever sent, and says when the answer
// was lost), then asks the lookup.
type gatewayWorker struct {
	urls      []string
	next      atomic.Int64
	transport atomic.Int64 // calls that met a gateway down or restarting
	busy      atomic.Int64
	unknown   atomic.Int64
}

type gwReply struct {
	status  int
	outcome string
	body    []byte
}

// call posts to path through the gateways in turn, retrying a call that met
// no gateway, or intentd unavailable, for up to 20s.
func (g *gatewayWorker) call(ctx context.Context, path string, att *client.Attempt, body string) (gwReply, error) {
	var last error
	for try := 0; try < 100; try++ {
		url := g.urls[int(g.next.Add(1))%len(g.urls)]
		req, err := http.NewRequestWithContext(ctx, "POST", url+path, strings.NewReader(body))
		if err != nil {
			return gwReply{}, err
		}
		req.Header.Set("Intentd-Key", att.Key)
		req.Header.Set("Intentd-Operation", "create-pickup")
		req.Header.Set("Intentd-Fencing-Token", att.Token.String())
		resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			r := gwReply{status: resp.StatusCode, outcome: resp.Header.Get("Intentd-Outcome"), body: b}
			if rerr == nil && r.outcome != "unavailable" && r.outcome != "not_sent" {
				return r, nil
			}
			err = fmt.Errorf("%d %s", r.status, r.outcome)
		}
		last = err
		g.transport.Add(1)
		select {
		case <-ctx.Done():
			return gwReply{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return gwReply{}, last
}

func pickupOf(r gwReply) *intentv1.Result {
	var b struct{ ID string }
	_ = json.Unmarshal(r.body, &b)
	return &intentv1.Result{Payload: r.body, ExternalRefs: map[string]string{"pickup": b.ID}}
}

func (g *gatewayWorker) task(key string) client.Task {
	send := func(ctx context.Context, att *client.Attempt) (gwReply, error) {
		for {
			r, err := g.call(ctx, "/u/courier/pickups", att, `{"parcel":"`+key+`"}`)
			if err != nil || r.outcome != "refused_busy" {
				return r, err
			}
			g.busy.Add(1) // an earlier call is in flight (a killed gateway's, until its deadline)
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(300 * time.Millisecond):
			}
		}
	}
	return client.Task{
		Key:            key,
		WaitInProgress: 5 * time.Second,
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			r, err := send(ctx, att)
			switch {
			case err != nil:
				return nil, err
			case r.status == http.StatusCreated:
				return pickupOf(r), nil
			case r.outcome == "unknown":
				g.unknown.Add(1)
			}
			return nil, fmt.Errorf("gateway: %d %s %s", r.status, r.outcome, r.body) // MarkUnknown: never a fresh attempt
		},
		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			r, err := send(ctx, att)
			switch {
			case err != nil:
				return client.Evidence{}, err
			case r.status == http.StatusCreated:
				return client.Found(pickupOf(r)), nil
			case r.outcome != "unknown":
				return client.Evidence{}, fmt.Errorf("gateway: %d %s %s", r.status, r.outcome, r.body)
			}
			l, err := g.call(ctx, "/lookup/courier", att, "")
			switch {
			case err != nil:
				return client.Evidence{}, err
			case l.outcome == "looked_up" || l.outcome == "replayed":
				return client.Found(pickupOf(l)), nil
			case l.outcome == "absent":
				return client.Absent("the courier's lookup found no pickup"), nil
			}
			return client.Evidence{}, fmt.Errorf("lookup: %d %s %s", l.status, l.outcome, l.body)
		},
	}
}

// TestGatewayUnderFaults: load through two gateways while the etcd leader
// is killed and restarted, one gateway is SIGKILLed mid-call and restarted,
// and the other is restarted with SIGTERM. Every intent ends COMPLETED
// with the one pickup the courier booked for it: zero duplicate effects.
func TestGatewayUnderFaults(t *testing.T) {
	e := NewEnv(t, report, EnvConfig{})
	courier := &bookings{byRef: map[string][]string{}, caught: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(courier)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-courier.release:
		default:
			close(courier.release)
		}
	})
	conf := func(name string) string {
		return fmt.Sprintf("upstreams:\n  courier:\n    url: %s\n    timeout: 2s\n    idempotency-header: %s\n    set-headers: {X-Gateway: %s}\n    lookup:\n      path: /pickups?reference={operation_key}\n", srv.URL, courierRef, name)
	}
	gws := []*harness.Gateway{
		harness.StartGateway(t, e.Bins, "g1", e.Intentds[0].Addr, conf("g1"), "--record-grace", "2s"),
		harness.StartGateway(t, e.Bins, "g2", e.Intentds[0].Addr, conf("g2"), "--record-grace", "2s"),
	}
	worker := &gatewayWorker{urls: []string{gws[0].URL, gws[1].URL}}
	conn, err := harness.Dial(e.Addrs()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := client.New(conn, client.WithCallTimeout(5*time.Second), client.WithReportTimeout(30*time.Second), client.WithBackoff(20*time.Millisecond, 500*time.Millisecond))
	api := intentv1.NewIntentServiceClient(conn)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keys := make(chan string, 1024)
	var issued []string
	var mu sync.Mutex
	settled := map[string]string{}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess, err := c.OpenSession(ctx, fmt.Sprintf("gw-worker-%d", i), 3*time.Second)
			for err != nil && ctx.Err() == nil {
				time.Sleep(200 * time.Millisecond)
				sess, err = c.OpenSession(ctx, fmt.Sprintf("gw-worker-%d", i), 3*time.Second)
			}
			for key := range keys {
				rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
				out, err := sess.Run(rctx, worker.task(key))
				rcancel()
				select {
				case <-sess.Done(): // the session lapsed (its heartbeats met the faults): a new one
					if s, serr := c.OpenSession(ctx, fmt.Sprintf("gw-worker-%d", i), 3*time.Second); serr == nil {
						sess = s
					}
				default:
				}
				if err == nil && out.Outcome == intentv1.Outcome_OUTCOME_COMPLETED {
					mu.Lock()
					settled[key] = out.Result().GetExternalRefs()["pickup"]
					mu.Unlock()
					continue
				}
				if ctx.Err() == nil {
					go func() { time.Sleep(300 * time.Millisecond); keys <- key }() // not settled: again later
				}
			}
		}()
	}
	register := func(n int) {
		for i := range n {
			key := fmt.Sprintf("gw-%d-%03d", time.Now().UnixNano()%1e6, i)
			params, _ := structpb.NewStruct(map[string]any{"parcel": key})
			for {
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := api.Register(rctx, &intentv1.RegisterRequest{Key: key, Params: params})
				rcancel()
				if err == nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			mu.Lock()
			issued = append(issued, key)
			mu.Unlock()
			keys <- key
			if i%5 == 0 {
				keys <- key // delivered twice: two workers race for it
			}
			time.Sleep(30 * time.Millisecond)
		}
	}
	register(30)

	old := leader(t, e.Cluster)
	ev := e.Faults.Inject("kill-leader", "etcd %s, SIGKILL", old.Name)
	old.Kill()
	go register(30)
	leader(t, e.Cluster)
	courier.mu.Lock()
	courier.armed = true
	courier.mu.Unlock()
	select {
	case <-courier.caught:
	case <-time.After(30 * time.Second):
		t.Fatal("no call through g1 reached the courier")
	}
	gev := e.Faults.Inject("kill-gateway", "gateway g1, SIGKILL mid-call (the courier booked, its answer held)")
	gws[0].Kill()
	close(courier.release)
	time.Sleep(time.Second)
	restart(t, old)
	e.Faults.Heal(ev)
	if err := gws[0].Restart(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(gev)
	tev := e.Faults.Inject("restart-gateway", "gateway g2, SIGTERM and restart")
	gws[1].Stop()
	if err := gws[1].Restart(); err != nil {
		t.Fatal(err)
	}
	e.Faults.Heal(tev)
	register(20)

	deadline := time.Now().Add(3 * time.Minute)
	for {
		mu.Lock()
		done := len(settled) == len(issued) && len(issued) == 80
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	cancel()
	close(keys)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	courier.mu.Lock()
	defer courier.mu.Unlock()
	duplicates := 0
	for _, key := range issued {
		ids := courier.byRef[key+":create-pickup"]
		if len(ids) > 1 {
			duplicates += len(ids) - 1
			t.Errorf("%s: %d pickups booked %v, want 1", key, len(ids), ids)
		}
		got, ok := settled[key]
		switch {
		case !ok:
			t.Errorf("%s: not completed", key)
		case len(ids) != 1 || got != ids[0]:
			t.Errorf("%s: result names pickup %q, the courier booked %v", key, got, ids)
		}
	}
	if worker.transport.Load() == 0 {
		t.Error("no call met a gateway down or restarting, or intentd unavailable: the faults were not felt")
	}
	if worker.busy.Load() == 0 && worker.unknown.Load() == 0 {
		t.Error("no call met the submission g1 was killed in (busy, or unknown after its deadline): the kill struck no call")
	}
	t.Logf("%d intents, %d pickups, %d duplicates; calls that met a fault %d, busy %d, answers lost %d",
		len(issued), courier.n, duplicates, worker.transport.Load(), worker.busy.Load(), worker.unknown.Load())
}
