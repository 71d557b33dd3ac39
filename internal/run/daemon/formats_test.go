package daemon_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// A replica whose build does not read the cluster's storage format version
// (advanced by a later release) refuses to start, in one line naming both
// versions and what to do, and announces nothing.
func TestReplicaTooOldForTheClusterFormatRefusesToStart(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	cfg := testConfig(t.TempDir())
	cfg.EtcdEndpoints = srv.Endpoints
	// A format this build does not know: written by hand, as a later
	// release's replicas would have.
	newer := etcdstore.FormatNewest + 1
	v := fmt.Sprintf(`{"version":%d,"by":"r9-0000 (v9.9.9)"}`, newer)
	if _, err := cli.Put(call(t), cfg.Store.Prefix+"cluster/format", v); err != nil {
		t.Fatal(err)
	}
	err, _ := runToExit(t, cfg)
	if _, ok := errors.AsType[*etcdstore.FormatTooNewError](err); !ok {
		t.Fatalf("Run = %v, want a *etcdstore.FormatTooNewError", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"intentd: refusing to start", fmt.Sprintf("the cluster's storage format version is %d (advanced by r9-0000 (v9.9.9))", newer),
		fmt.Sprintf("reads formats up to %d", etcdstore.FormatNewest), fmt.Sprintf("run a release that reads format %d", newer),
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("refusal is more than one line: %q", msg)
	}
	resp, err := cli.Get(call(t), cfg.Store.Prefix+"replicas/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Errorf("the refused replica left %d announcements", resp.Count)
	}
}

// A replica announces what it reads and writes, answers GET /formats and
// exports the format metrics; stopped, it revokes its announcement, so that
// a rolling upgrade does not wait for its lease.
func TestReplicaAnnouncesItsFormats(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	cfg := testConfig(t.TempDir())
	cfg.EtcdEndpoints = srv.Endpoints
	cfg.MetricsListen = freeport.Addr(t)
	in := start(t, cfg)

	scrape(t, cfg.MetricsListen) // waits for the listener
	var got daemon.FormatsAnswer
	body := httpGet(t, "http://"+cfg.MetricsListen+"/formats")
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("GET /formats: %v: %s", err, body)
	}
	self := got.Self
	if self.ID == "" || self.Version == "" || self.Reads != etcdstore.FormatNewest || self.Writes < etcdstore.FormatFirst ||
		len(got.Replicas) != 1 || got.Replicas[0].ID != self.ID || len(got.Unannounced) != 0 || got.Effective != etcdstore.FormatFirst {
		t.Fatalf("GET /formats = %+v, want this replica alone, announced, reading format %d and writing %d", got, etcdstore.FormatNewest, etcdstore.FormatFirst)
	}
	metrics := httpGet(t, "http://"+cfg.MetricsListen+"/metrics")
	for _, want := range []string{
		fmt.Sprintf("intentd_storage_format_readable %d\n", etcdstore.FormatNewest),
		fmt.Sprintf("intentd_storage_format_written %d\n", etcdstore.FormatFirst),
		"intentd_cluster_format_version ",
		"intentd_storage_format_replicas{reads=",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}

	in.shutdown(t)
	resp, err := cli.Get(call(t), cfg.Store.Prefix+"replicas/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Errorf("%d announcements left after the replica stopped, want its own revoked", resp.Count)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// A running replica whose announcement lapsed while a later release
// advanced the version past what it reads stops serving and exits with
// the refusal: from then on it could meet values it cannot decode.
func TestReplicaStopsWhenTheFormatVersionPassesIt(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	cfg := testConfig(t.TempDir())
	cfg.EtcdEndpoints = srv.Endpoints
	in := start(t, cfg)

	resp, err := cli.Get(call(t), cfg.Store.Prefix+"replicas/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("announcements %v, want this replica's, on a lease", resp.Kvs)
	}
	// Its lease lapses (revoked here), and meanwhile a later release
	// advanced the version.
	newer := etcdstore.FormatNewest + 1
	if _, err := cli.Put(call(t), cfg.Store.Prefix+"cluster/format", fmt.Sprintf(`{"version":%d,"by":"r9-0000 (v9.9.9)"}`, newer)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(call(t), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	err = in.waitExit(t, 30*time.Second)
	if _, ok := errors.AsType[*etcdstore.FormatTooNewError](err); !ok || !strings.Contains(err.Error(), "stopped serving") {
		t.Fatalf("Run = %v, want it stopped with a *etcdstore.FormatTooNewError", err)
	}
}
