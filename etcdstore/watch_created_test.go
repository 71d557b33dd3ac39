package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// startWatch runs Watch in the background and hands its events over a
// channel; the channel closes when Watch returns.
func startWatch(t *testing.T, s *etcdstore.Store, q intent.WatchQuery) <-chan intent.WatchEvent {
	t.Helper()
	wctx, cancel := context.WithCancel(context.Background())
	events := make(chan intent.WatchEvent, 16)
	done := make(chan struct{})
	go func() { // exits when the test cancels wctx
		defer close(done)
		defer close(events)
		err := s.Watch(wctx, q, func(e intent.WatchEvent) error {
			select {
			case events <- e:
				return nil
			case <-wctx.Done():
				return wctx.Err()
			}
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Watch(%+v): %v", q, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return events
}

func nextEvent(t *testing.T, events <-chan intent.WatchEvent, what string) intent.WatchEvent {
	t.Helper()
	select {
	case e, ok := <-events:
		if !ok {
			t.Fatalf("the watch ended before %s", what)
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
	}
	panic("unreachable")
}

// A watch from "now" (start revision 0) sent nothing until a change, so a
// caller could not tell when it was safe to act without missing one. Asked
// to, it now first says it is established and from which revision, before
// any change; and a change made right after that notice is never missed
// (tried many times over, as it is a race by nature).
func TestWatchFromNowSaysItHasStarted(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	const rounds = 25
	for i := range rounds {
		key := fmt.Sprintf("watch-now-%d", i)
		before := register(t, s, lamp(t, key+"-before", 1))
		events := startWatch(t, s, intent.WatchQuery{Filter: intent.Filter{Tenant: "default"}, NotifyCreated: true})
		created := nextEvent(t, events, "created notice")
		if !created.Created || created.Intent != nil || created.Revision < before.Revision {
			t.Fatalf("round %d: first event %+v, want the created notice (no intent) at revision >= %d, the last change before the watch", i, created, before.Revision)
		}
		after := register(t, s, lamp(t, key, 1)) // acting on the notice
		if e := nextEvent(t, events, "the change made after the notice"); e.Created || e.Intent.Key != key || e.Revision != after.Revision || e.Revision <= created.Revision {
			t.Fatalf("round %d: after the notice at %d saw %+v, want %s registered at %d", i, created.Revision, e, key, after.Revision)
		}
	}
}

// With a start revision the notice says start - 1: every change from start
// on follows, as a resumed watch needs. Without NotifyCreated a watch sends
// changes only, as before.
func TestWatchCreatedNoticeRevision(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	first := register(t, s, lamp(t, "watch-rev-1", 1))
	register(t, s, lamp(t, "watch-rev-2", 1))

	events := startWatch(t, s, intent.WatchQuery{Filter: intent.Filter{Tenant: "default"}, StartRevision: first.Revision, NotifyCreated: true})
	if e := nextEvent(t, events, "created notice"); !e.Created || e.Revision != first.Revision-1 {
		t.Fatalf("first event %+v, want the created notice at %d", e, first.Revision-1)
	}
	if e := nextEvent(t, events, "the first change"); e.Created || e.Intent.Key != "watch-rev-1" || e.Revision != first.Revision {
		t.Fatalf("second event %+v, want watch-rev-1 at %d", e, first.Revision)
	}

	plain := startWatch(t, s, intent.WatchQuery{Filter: intent.Filter{Tenant: "default"}, StartRevision: first.Revision})
	if e := nextEvent(t, plain, "the first change"); e.Created || e.Intent.Key != "watch-rev-1" {
		t.Fatalf("without NotifyCreated the first event is %+v, want the change to watch-rev-1", e)
	}
}

// TestEachWatchHasAStreamOfItsOwn: two watches open two gRPC streams. The
// etcd client would put both on one shared stream, which stays on the
// member it was opened on: when that member stalls, a watch added to it
// hangs although the steering sends every other call to members that
// answer (see Store.Watch).
func TestEachWatchHasAStreamOfItsOwn(t *testing.T) {
	srv := etcdtest.Start(t)
	var streams atomic.Int64
	countWatches := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == "/etcdserverpb.Watch/Watch" {
			streams.Add(1)
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(countWatches)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s, err := etcdstore.New(cli, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"one", "two"} {
		nextEvent(t, startWatch(t, s, intent.WatchQuery{Key: key, NotifyCreated: true}), "created notice of "+key)
	}
	if got := streams.Load(); got != 2 {
		t.Errorf("two watches opened %d watch streams, want 2", got)
	}
}
