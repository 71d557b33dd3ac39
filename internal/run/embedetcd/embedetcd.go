// Package embedetcd holds what every embedded etcd of intentd's shares,
// the daemon's own (internal/run/daemon) and the tests' (internal/testing/etcdtest): a
// single member that logs nothing of its own, and the wait for it to serve.
// Where it listens, and how much it keeps, is each caller's.
package embedetcd

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/pkg/v3/traceutil"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/errors"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.uber.org/zap"
)

// Config returns the configuration of a single etcd member named name with
// its data in dir, registered in its one-member cluster under peer, its own
// logging silenced (its failures reach the caller as errors). The caller
// sets the listeners.
func Config(name, dir string, peer url.URL) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = name + "=" + peer.String()
	return cfg
}

// WaitReady waits until e serves clients, and returns an error, after
// closing e, if it fails first or is not ready within the given time.
func WaitReady(e *embed.Etcd, within time.Duration) error {
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		e.Close()
		return err
	case <-time.After(within):
		e.Close()
		return fmt.Errorf("etcd did not become ready within %v", within)
	}
}

// LocalGet returns a read of one key from e's own store, as e answers a
// serializable Range of that key (etcd's txn.Range: a read transaction on
// the member's key-value store, in the mode etcd reads it, limited to the
// key), without the request handling around it: the trace and its steps,
// the span, the metrics, the authentication check (an embedded member has
// no users). That handling was half the cost of the read, and a fifth of
// what intentd allocated, for a replay that missed the cache (see
// docs/PERFORMANCE.md, "Tenth pass"). The value is nil for a key the member
// does not hold. For etcdstore.Config.LocalGet.
func LocalGet(e *embed.Etcd) func(ctx context.Context, key string) (*mvccpb.KeyValue, error) {
	return func(ctx context.Context, key string) (*mvccpb.KeyValue, error) {
		select {
		case <-e.Server.StoppingNotify():
			// Its store is about to close under the read.
			return nil, errors.ErrStopped
		default:
		}
		txn := e.Server.KV().Read(mvcc.ConcurrentReadTxMode, traceutil.TODO())
		defer txn.End()
		r, err := txn.Range(ctx, []byte(key), nil, mvcc.RangeOptions{Limit: 1})
		if err != nil || len(r.KVs) == 0 {
			return nil, err
		}
		return r.KVs[0], nil
	}
}
