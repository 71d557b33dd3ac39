package embedetcd_test

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcderrors "go.etcd.io/etcd/server/v3/etcdserver/errors"
	"google.golang.org/protobuf/proto"

	"github.com/intentd/intentd/internal/run/embedetcd"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// LocalGet answers what a serializable Get of the same key answers from
// the same member: the key's value and revisions as last written, nothing
// for a key never written or deleted, the one key asked for and not the
// keys it is a prefix of. Once the member stops, it refuses rather than
// read a store closing under it.
func TestLocalGetAnswersAsASerializableGet(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	get := embedetcd.LocalGet(etcd.Etcd)
	ctx := context.Background()
	for _, op := range []clientv3.Op{
		clientv3.OpPut("a", "1"),
		clientv3.OpPut("ab", "prefixed by a"),
		clientv3.OpPut("b", "2"),
		clientv3.OpPut("b", "2, again"),
		clientv3.OpPut("c", "3"),
		clientv3.OpDelete("c"),
		clientv3.OpPut("empty", ""),
	} {
		if _, err := cli.Do(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"a", "ab", "b", "c", "empty", "never"} {
		resp, err := cli.Get(ctx, key, clientv3.WithSerializable())
		if err != nil {
			t.Fatal(err)
		}
		kv, err := get(ctx, key)
		if err != nil {
			t.Fatalf("LocalGet(%q): %v", key, err)
		}
		switch {
		case len(resp.Kvs) == 0 && kv != nil:
			t.Errorf("LocalGet(%q) = %v, want nothing, as the Get", key, kv)
		case len(resp.Kvs) == 1 && !proto.Equal(kv, resp.Kvs[0]):
			t.Errorf("LocalGet(%q) = %v, want the Get's %v", key, kv, resp.Kvs[0])
		}
	}

	etcd.Stop()
	if kv, err := get(ctx, "a"); !errors.Is(err, etcderrors.ErrStopped) {
		t.Errorf("LocalGet of a stopped member = %v, %v; want %v", kv, err, etcderrors.ErrStopped)
	}
}
