package etcdstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/internal/core/machine"
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

// Every commit the store's tests make checks that the record it caches and
// answers with is the one a reader decodes from the value written.
func init() {
	checkCommitted = func(tenant, key string, committed *machine.Record, value []byte, rev int64) {
		decoded, err := decodeRecord(tenant, key, value, rev)
		if err != nil {
			panic(fmt.Sprintf("etcdstore: committed record %s/%s does not decode: %v", tenant, key, err))
		}
		if diff := readerDiff(decoded, committed); diff != "" {
			panic(fmt.Sprintf("etcdstore: committed record %s/%s is not what a reader decodes (-decoded +committed):\n%s", tenant, key, diff))
		}
	}
}

// readerDiff is how committed differs from decoded, what a reader decodes:
// "" when they are the same, times in the same form (location, monotonic
// reading: == on time.Time) and fields empty in one and nil in the other
// taken as equal.
func readerDiff(decoded, committed *machine.Record) string {
	return cmp.Diff(decoded, committed, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b time.Time) bool { return a == b }))
}
