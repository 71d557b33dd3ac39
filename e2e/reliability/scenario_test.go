package reliability

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Steps several fault families' scenarios share.

// leader returns the cluster's leader, waiting up to 10s for one.
func leader(t *testing.T, c *Cluster) *Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// restart starts m again, failing the test if it cannot.
func restart(t *testing.T, m *Member) {
	t.Helper()
	if err := m.Restart(); err != nil {
		t.Fatalf("restart etcd %s: %v", m.Name, err)
	}
}

// recordedClient is a recorded client on its own connection to addr.
func recordedClient(t *testing.T, e *Env, addr string) *client.Client {
	t.Helper()
	cc, err := harness.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	conn, _ := e.Rec.Conn(cc)
	return client.New(conn,
		client.WithCallTimeout(5*time.Second),
		client.WithBackoff(20*time.Millisecond, 400*time.Millisecond),
		client.WithReportTimeout(30*time.Second))
}

// registerAll registers keys[i] with params(i), eight at a time, each until
// intentd acknowledges it.
func registerAll(t *testing.T, c *client.Client, keys []string, paramsOf func(int) *intentv1.RegisterRequest) {
	t.Helper()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	var failed atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					return
				}
				req := paramsOf(i)
				req.Key = keys[i]
				var err error
				for try := 0; try < 20; try++ {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err = c.Register(ctx, req)
					cancel()
					if err == nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil && failed.Add(1) <= 3 {
					t.Errorf("register %s: %v", keys[i], err)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
}

// readAll reads every key with its history through an unrecorded client.
func readAll(t *testing.T, e *Env, keys []string) map[string]*intentv1.Intent {
	t.Helper()
	cc, err := harness.Dial(e.Addrs()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := client.New(cc, client.WithCallTimeout(5*time.Second))
	out := map[string]*intentv1.Intent{}
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		resp, err := c.Get(ctx, &intentv1.GetRequest{Key: k})
		cancel()
		if err != nil {
			t.Fatalf("read %s: %v", k, err)
		}
		out[k] = resp.GetIntent()
	}
	return out
}
