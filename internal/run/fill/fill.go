// Package fill runs intents through intentd's happy path as fast as it
// can, to measure what stored intents cost the store: cmd/intentd-fill
// and the store's sizing tests drive it.
package fill

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Run registers, acquires and completes n intents on conn with the given
// number of concurrent workers (each with its own session), and returns
// the first error, after which the other workers stop. done, if not nil,
// counts completed intents as they go.
func Run(ctx context.Context, conn grpc.ClientConnInterface, n, workers int, done *atomic.Int64) error {
	return RunAt(ctx, conn, n, workers, rate.Inf, done)
}

// RunAt is Run with the intents started at most perSecond a second. A
// store's size depends on the rate: etcd keeps every revision written
// within its compaction window, so a fill as fast as the machine goes
// holds more history, the faster the machine.
func RunAt(ctx context.Context, conn grpc.ClientConnInterface, n, workers int, perSecond rate.Limit, done *atomic.Int64) error {
	if done == nil {
		done = new(atomic.Int64)
	}
	pace := rate.NewLimiter(perSecond, 1)
	c := client.New(conn)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			if err := worker(ctx, c, w, int64(n), pace, &next, done); err != nil {
				once.Do(func() { first = err })
				cancel()
			}
		})
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}

// worker opens a session and runs intents until n are taken.
func worker(ctx context.Context, c *client.Client, w int, n int64, pace *rate.Limiter, next, done *atomic.Int64) error {
	s, err := c.OpenSession(ctx, fmt.Sprintf("fill-worker-%d", w), time.Minute)
	if err != nil {
		return fmt.Errorf("open session: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(cctx)
	}()
	for {
		i := next.Add(1)
		if i > n || ctx.Err() != nil {
			return nil
		}
		if err := pace.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return nil // ended: Run reports it
			}
			return err // the next start is past ctx's deadline
		}
		if err := Cycle(ctx, c, s.ID(), i); err != nil {
			return err
		}
		done.Add(1)
	}
}

// Cycle is intent i's happy path as a shop's workers run it: an approver
// registers the purchase (params with a shipping address, two labels), a
// worker acquires it under session, places the order and completes it with
// the merchant's order id.
func Cycle(ctx context.Context, c *client.Client, session string, i int64) error {
	key := fmt.Sprintf("purchase-%012d", i)
	params, err := structpb.NewStruct(map[string]any{
		"item":       "desk lamp, brushed steel",
		"sku":        fmt.Sprintf("LMP-%06d", i%1000000),
		"quantity":   float64(1 + i%3),
		"merchant":   "merchant-17",
		"max_amount": "89.00",
		"currency":   "EUR",
		"ship_to":    map[string]any{"name": "Ada Lovelace", "street": "12 St James's Square", "city": "London", "postcode": "SW1Y 4JH", "country": "GB"},
	})
	if err != nil {
		return err
	}
	_, err = c.Register(ctx, &intentv1.RegisterRequest{
		Key: key, Params: params, RequestId: "reg-" + key,
		Labels: map[string]string{"customer": fmt.Sprintf("c-%d", i%50000), "channel": "agent"},
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", key, err)
	}
	acq, err := c.Acquire(ctx, &intentv1.AcquireRequest{Key: key, SessionId: session, RequestId: "acq-" + key})
	if err != nil {
		return fmt.Errorf("acquire %s: %w", key, err)
	}
	if acq.GetOutcome() != intentv1.Outcome_OUTCOME_EXECUTE {
		return fmt.Errorf("acquire %s: outcome %v, want EXECUTE", key, acq.GetOutcome())
	}
	_, err = c.Complete(ctx, &intentv1.CompleteRequest{
		Key: key, Token: acq.GetLease().GetToken(),
		Result: &intentv1.Result{
			Payload:      fmt.Appendf(nil, `{"order_id":"SO-%d","amount":"84.90","currency":"EUR"}`, i),
			ExternalRefs: map[string]string{"supplier_order_id": fmt.Sprintf("SO-%d", i)},
		},
	})
	if err != nil {
		return fmt.Errorf("complete %s: %w", key, err)
	}
	return nil
}
