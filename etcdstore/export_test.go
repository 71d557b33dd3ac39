package etcdstore

import clientv3 "go.etcd.io/etcd/client/v3"

// NewWithKV returns a Store that talks to etcd through kv, so that tests can
// put faults between the store and etcd.
func NewWithKV(c *clientv3.Client, kv clientv3.KV, cfg Config) (*Store, error) {
	return newStore(kv, c.Lease, c.Watcher, cfg)
}
