package etcdstore

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/internal/machine"
)

// NewWithKV returns a Store that talks to etcd through kv, so that tests can
// put faults between the store and etcd.
func NewWithKV(c *clientv3.Client, kv clientv3.KV, cfg Config) (*Store, error) {
	return newStore(kv, c.Lease, c.Watcher, cfg)
}

// DecodeRecord decodes a stored record, in either format, for tests that
// read etcd's keys directly.
func DecodeRecord(b []byte) (*machine.Record, error) { return decodeRecord(b, 0) }
