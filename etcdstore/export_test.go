package etcdstore

import (
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/internal/machine"
)

// NewWithKV returns a Store that talks to etcd through kv, so that tests can
// put faults between the store and etcd.
func NewWithKV(c *clientv3.Client, kv clientv3.KV, cfg Config) (*Store, error) {
	return newStore(kv, c.Lease, c.Watcher, cfg)
}

// DecodeRecord decodes a record stored under etcdKey (in the default
// prefix), in any format, for tests that read etcd's keys directly.
func DecodeRecord(etcdKey string, b []byte) (*machine.Record, error) {
	// <prefix>t/<tenant>/i/<key>: a tenant holds no '/', a key may.
	rest, ok := strings.CutPrefix(etcdKey, DefaultConfig().Prefix+"t/")
	tenant, key, found := strings.Cut(rest, "/i/")
	if !ok || !found {
		return nil, fmt.Errorf("%q is not the etcd key of a record", etcdKey)
	}
	return decodeRecord(tenant, key, b, 0)
}
