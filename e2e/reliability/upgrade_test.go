package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	"github.com/intentd/intentd/etcdstore"
)

// The keys of the storage format protocol under intentd's default prefix
// (etcdstore/formatgate.go).
const (
	clusterFormatKey = "/intentd/v1/cluster/format"
	replicasPrefix   = "/intentd/v1/replicas/"
	electionPrefix   = "/intentd/v1/janitor/"
)

// A rolling upgrade (issue 31), as an operator does it: the previous
// release (the last line of RELEASES, built from source at its commit) and
// this checkout run as replicas of one 3-member etcd cluster under load,
// replaced one at a time: old,old → old,new → (rollback) old,old →
// old,new → new,new. The cluster's format version stays unwritten while a
// replica of the first release runs (it announces nothing; the janitor's
// election shows it), and advances to this checkout's newest format once
// both replicas run it. A rollback after that works when the previous
// release reads the version (RELEASES says what it reads); otherwise a
// release with format versions refuses to start, in one line, and the
// first release, which cannot check, serves but is seen: it stays
// unannounced in the janitor's election (what IntentdReplicaBehindFormat
// alerts on). Throughout: no duplicate effect, no acknowledged report
// lost, no call answered INTERNAL or CORRUPT, tokens strictly increasing
// per intent, and every replacement bridged by the other replica.
func TestRollingUpgrade(t *testing.T) {
	releases, err := harness.Releases()
	if err != nil {
		t.Fatal(err)
	}
	prev := releases[len(releases)-1]
	bins := harness.Bins(t)
	built := time.Now()
	oldBin, err := harness.BuildRelease(prev, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	newBin := bins.Intentd
	t.Logf("built release %s (%s, reads format %d) in %v; this checkout reads format %d",
		prev.Version, prev.Commit[:12], prev.Format, time.Since(built).Round(time.Second), etcdstore.FormatNewest)

	e := newEnvRunning(t, oldBin, 2)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.clientURLs(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	load := e.StartLoad(LoadConfig{Redeliver: 20, Seed: harness.Seed()})
	e.WaitOK(100, 20*time.Second)
	// A release that announces (any after the first) and this checkout
	// reading the same newest format may write the version at once.
	firstRelease := len(releases) == 1

	var bridged []int64 // calls the other replica answered during each replacement
	replace := func(i int, bin, what string) error {
		t.Helper()
		d, other := e.Intentds[i], e.Intentds[1-i]
		ev := e.Faults.Inject("replace-intentd", "replica %s: %s", d.Name, what)
		before := other.Served()
		if !d.Stop() {
			t.Errorf("replica %s ignored SIGTERM", d.Name)
		}
		d.SetBinary(bin)
		err := d.Restart()
		// The other replica carries the load while this one restarts,
		// and a moment after.
		time.Sleep(2 * time.Second)
		e.Faults.Heal(ev)
		bridged = append(bridged, other.Served()-before)
		return err
	}
	mustReplace := func(i int, bin, what string) {
		t.Helper()
		if err := replace(i, bin, what); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(2 * time.Second) // load on the new pair
	}

	if st := readFormats(t, cli); firstRelease && (len(st.replicas) != 0 || st.version != 0) {
		t.Fatalf("old,old: %+v, want no announcement and no version (the first release announces nothing)", st)
	}
	steps := []struct {
		replica int
		bin     string
		what    string
		// announced is how many replicas announce themselves after it.
		announced int
	}{
		{0, newBin, "old,old → old,new", 1},
		{0, oldBin, "rollback before the version advanced: old,new → old,old", 0},
		{0, newBin, "old,old → old,new again", 1},
	}
	for _, s := range steps {
		mustReplace(s.replica, s.bin, s.what)
		st := readFormats(t, cli)
		if firstRelease && (len(st.replicas) != s.announced || st.version != 0) {
			t.Fatalf("after %s: %+v, want %d replicas announced and no version written while a replica of the first release runs", s.what, st, s.announced)
		}
	}
	mustReplace(1, newBin, "old,new → new,new")
	// Every live replica reads FormatNewest: the version advances once that
	// held for the daemon's settling time (15s).
	deadline := time.Now().Add(45 * time.Second)
	for st := readFormats(t, cli); st.version != etcdstore.FormatNewest; st = readFormats(t, cli) {
		if time.Now().After(deadline) {
			t.Fatalf("new,new: the cluster's format version is %d after 45s, want %d (%+v)", st.version, etcdstore.FormatNewest, st)
		}
		time.Sleep(250 * time.Millisecond)
	}
	advanced := readFormats(t, cli)
	t.Logf("new,new: the cluster's format version advanced to %d (%s)", advanced.version, advanced.by)
	if len(advanced.replicas) != 2 {
		t.Errorf("new,new: %d replicas announced, want 2", len(advanced.replicas))
	}

	// A rollback after the advance: the previous release serves when it
	// reads the version, and refuses to start, saying why, when it does not.
	err = replace(0, oldBin, fmt.Sprintf("rollback after the version advanced to %d: new,new → old,new", advanced.version))
	switch {
	case advanced.version <= prev.Format && err != nil:
		t.Fatalf("the previous release, which reads format %d, did not serve on a cluster at version %d: %v", prev.Format, advanced.version, err)
	case advanced.version <= prev.Format:
		t.Logf("rollback after the advance: the previous release reads format %d, and serves", prev.Format)
	case firstRelease && err != nil:
		t.Fatalf("the first release did not serve: %v", err)
	case firstRelease:
		// It cannot check the version: it serves, and is seen.
		if st := readFormats(t, cli); len(st.unannounced) != 1 || st.version != advanced.version {
			t.Fatalf("the first release started on a cluster at version %d: %+v, want it unannounced in the election, the version unchanged", advanced.version, st)
		}
		const said = "replicas of the first release serve a cluster whose storage format version is past what they read"
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(e.Intentds[1].Logs(500), said); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s did not log %q within 10s of the first release starting on version %d", e.Intentds[1].Name, said, advanced.version)
			}
		}
		t.Logf("rollback after the advance: the first release cannot refuse; it serves, unannounced, and the other replica says so (IntentdReplicaBehindFormat)")
	case err == nil:
		t.Fatalf("the previous release, which reads format %d, served on a cluster at version %d", prev.Format, advanced.version)
	default:
		for _, want := range []string{"refusing to start", fmt.Sprintf("storage format version is %d", advanced.version)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal does not say %q: %v", want, err)
			}
		}
		t.Logf("rollback after the advance: refused: %v", err)
	}
	time.Sleep(2 * time.Second)
	mustReplace(0, newBin, "new again: → new,new")

	e.Finish(load, FinishOptions{Noticed: func(ev FaultEvent, _ []Call) int {
		for i, x := range e.Faults.Events() {
			if x.Injected == ev.Injected && i < len(bridged) {
				return int(bridged[i])
			}
		}
		return 0
	}})
	for i, n := range bridged {
		if n == 0 {
			t.Errorf("replacement %d: the other replica answered no call meanwhile: the service stopped", i+1)
		}
	}
	var broken []string
	for _, c := range e.Rec.Calls() {
		if c.Code == codes.Internal || c.Code == codes.DataLoss || strings.Contains(c.Reason, "CORRUPT") {
			broken = append(broken, fmt.Sprintf("%s: %v %s %s", c.Method, c.Code, c.Reason, c.Message))
		}
	}
	if len(broken) > 0 {
		t.Errorf("%d calls answered INTERNAL, DATA_LOSS or CORRUPT during the upgrade (first: %v)", len(broken), broken[:min(5, len(broken))])
	}
}

// formatsSeen is what etcd holds of the format protocol.
type formatsSeen struct {
	version  int
	by       string
	replicas []string // their announcements' ids
	// unannounced are the janitor's candidates with no announcement.
	unannounced []string
}

func readFormats(t *testing.T, cli *clientv3.Client) formatsSeen {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var st formatsSeen
	resp, err := cli.Get(ctx, clusterFormatKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) > 0 {
		var v struct {
			Version int    `json:"version"`
			By      string `json:"by"`
		}
		if err := json.Unmarshal(resp.Kvs[0].Value, &v); err != nil {
			t.Fatalf("%s holds %q: %v", clusterFormatKey, resp.Kvs[0].Value, err)
		}
		st.version, st.by = v.Version, v.By
	}
	resp, err = cli.Get(ctx, replicasPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		st.replicas = append(st.replicas, strings.TrimPrefix(string(kv.Key), replicasPrefix))
	}
	resp, err = cli.Get(ctx, electionPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if !slices.Contains(st.replicas, string(kv.Value)) {
			st.unannounced = append(st.unannounced, string(kv.Value))
		}
	}
	return st
}

// clientURLs are the members' own client URLs (not their proxies).
func (e *Env) clientURLs() []string {
	var out []string
	for _, m := range e.Cluster.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// newEnvRunning is NewEnv with its replicas running intentd, a binary
// other than the suite's (a previous release).
func newEnvRunning(t *testing.T, intentd string, replicas int) *Env {
	t.Helper()
	bins := harness.Bins(t)
	bins.Intentd = intentd
	cfg := harness.IntentdConfig{RequestTimeout: time.Second, OperationTimeout: 3 * time.Second, Flags: slices.Clone(intentdFlags)}
	e := &Env{T: t, Bins: bins, report: report, started: time.Now(), Merchant: fakes.NewMerchant()}
	e.Artifacts = os.Getenv("RELIABILITY_ARTIFACTS")
	if e.Artifacts == "" {
		e.Artifacts = t.TempDir()
	}
	srv := httptest.NewServer(e.Merchant)
	t.Cleanup(srv.Close)
	e.MerchantURL = srv.URL
	e.Cluster = StartCluster(t, bins.Etcd, ClusterConfig{})
	for i := range replicas {
		var links []*harness.Proxy
		rc := cfg
		rc.Endpoints = nil
		for _, m := range e.Cluster.Members {
			links = append(links, m.Proxy)
			rc.Endpoints = append(rc.Endpoints, "http://"+m.Proxy.Addr())
		}
		e.Links = append(e.Links, links)
		e.Intentds = append(e.Intentds, harness.StartIntentd(t, bins, fmt.Sprintf("r%d", i), rc))
	}
	e.Rec = NewRecorder()
	e.Faults = NewFaultLog(e.Rec)
	return e
}
