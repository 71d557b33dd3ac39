package daemon

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// intentd reached its own embedded etcd over gRPC on the unix socket:
// HTTP/2 framing and protobuf coding twice per etcd call, both ways, a
// third of its CPU at one client. Its client is in-process now, with no
// connection at all, and still answers everything the daemon asks of it:
// reads, transactions, watches, leases and the database status; and the
// store reads a replay's record from the member's own store.
func TestEmbeddedEtcdClientHasNoConnection(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.EmbedClientURL, cfg.EmbedPeerURL = "http://127.0.0.1:0", "http://127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	etcd, closeAll, err := connectEtcd(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	cli, endpoints := etcd.cli, etcd.endpoints
	if conn := cli.ActiveConnection(); conn != nil {
		t.Errorf("client of the embedded etcd dials %s, want it in-process", conn.Target())
	}
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	// The store reads a replay's record from the member itself.
	if etcd.localGet == nil {
		t.Error("no read of the embedded member's own store for the store")
	} else if kv, err := etcd.localGet(ctx, "k"); err != nil || kv == nil || string(kv.Value) != "v" {
		t.Errorf("local read of k: %v, %v; want v", kv, err)
	}
	w := cli.Watch(ctx, "w")
	if _, err := cli.Put(ctx, "w", "1"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if ev := <-w; ev.Err() != nil || len(ev.Events) != 1 {
		t.Errorf("watch: %v %v, want one event", ev.Err(), ev.Events)
	}
	lease, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	if _, err := cli.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Errorf("KeepAliveOnce: %v", err)
	}
	st, ok := fullest(ctx, cli, endpoints, time.Second)
	if !ok || st.size == 0 || st.quota != cfg.EmbedQuotaBytes {
		t.Errorf("database status %+v %v, want its size and quota %d", st, ok, cfg.EmbedQuotaBytes)
	}
}
