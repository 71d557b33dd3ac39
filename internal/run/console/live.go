package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// liveKeepAlive is how often a quiet event stream sends a comment, so that
// proxies and browsers do not take it for dead.
const liveKeepAlive = 15 * time.Second

// liveCount is what the queue page's stream sends: the number of intents
// in the review queue, exact unless Capped (more than countCap).
type liveCount struct {
	Count  int  `json:"count"`
	Capped bool `json:"capped,omitempty"`
}

// liveIntent is what the intent page's stream sends when its intent
// changes: its state and current token.
type liveIntent struct {
	State string `json:"state"`
	Token uint64 `json:"token,string"`
}

// live streams server-sent events: with ?key=, the changes of one intent;
// else the review queue's size, kept by the informer pattern: List the
// queue once, then Watch the tenant from the listing's revision + 1 and
// apply each change to the set of keys in the queue, so that no change
// between the two is missed and none is counted twice. On a watch that
// ends (a compacted revision, intentd stopping) it lists again.
func (c *Console) live(w http.ResponseWriter, r *http.Request, v *viewer, tenant string) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	send := func(event string, data any) error {
		b, _ := json.Marshal(data)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return err
		}
		flusher.Flush()
		return nil
	}
	ctx := withToken(r.Context(), v)
	events := make(chan any)
	go func() { // exits when ctx ends (the browser leaves or intentd stops)
		defer close(events)
		for ctx.Err() == nil {
			var err error
			if key := keyOf(r); key != "" {
				from, _ := strconv.ParseInt(r.URL.Query().Get("from"), 10, 64)
				err = c.followIntent(ctx, tenant, key, max(from, 0), events)
			} else {
				err = c.followQueue(ctx, tenant, events)
			}
			if ctx.Err() != nil {
				return
			}
			c.cfg.Log.Debug("console: live stream restarts", "tenant", tenant, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	tick := time.NewTicker(liveKeepAlive)
	defer tick.Stop()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return
			}
			var err error
			switch e := e.(type) {
			case liveCount:
				err = send("count", e)
			case liveIntent:
				err = send("intent", e)
			}
			if err != nil {
				return
			}
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case <-ctx.Done():
			return
		}
	}
}

func emit(ctx context.Context, out chan<- any, e any) error {
	select {
	case out <- e:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Console) followQueue(ctx context.Context, tenant string, out chan<- any) error {
	in := map[string]bool{}
	var rev int64
	capped := false
	token := ""
	for {
		resp, err := c.cfg.Service.List(ctx, &intentv1.ListRequest{Tenant: tenant, States: queueStates, PageSize: 100, PageToken: token})
		if err != nil {
			return err
		}
		if rev == 0 {
			rev = resp.GetRevision()
		}
		for _, i := range resp.GetIntents() {
			in[i.GetKey()] = true
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		if len(in) >= countCap {
			capped = true
			break
		}
	}
	last := liveCount{Count: len(in), Capped: capped}
	if err := emit(ctx, out, last); err != nil {
		return err
	}
	stream, err := c.cfg.Service.Watch(ctx, &intentv1.WatchRequest{Tenant: tenant, StartRevision: rev + 1})
	if err != nil {
		return err
	}
	for {
		e, err := stream.Recv()
		if err != nil {
			return err
		}
		k := e.GetIntent().GetKey()
		if e.GetType() == intentv1.WatchResponse_TYPE_PUT && slices.Contains(queueStates, e.GetIntent().GetState()) {
			in[k] = true
		} else {
			delete(in, k)
		}
		if now := (liveCount{Count: len(in), Capped: capped}); now != last {
			last = now
			if err := emit(ctx, out, now); err != nil {
				return err
			}
		}
	}
}

// followIntent reports the changes of key after revision from (the
// revision the page showed; 0: from now).
func (c *Console) followIntent(ctx context.Context, tenant, key string, from int64, out chan<- any) error {
	start := int64(0)
	if from > 0 {
		start = from + 1
	}
	stream, err := c.cfg.Service.Watch(ctx, &intentv1.WatchRequest{Tenant: tenant, Key: key, StartRevision: start})
	if err != nil {
		return err
	}
	for {
		e, err := stream.Recv()
		if err != nil {
			return err
		}
		if e.GetType() != intentv1.WatchResponse_TYPE_PUT {
			continue
		}
		if err := emit(ctx, out, liveIntent{State: stateWord(e.GetIntent().GetState()), Token: e.GetIntent().GetLease().GetToken()}); err != nil {
			return err
		}
	}
}
