package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// intentctl formats shows what a replica's metrics listener reads from
// etcd: the cluster's format version and every live replica, this one
// among them; -o json passes the answer through.
func TestFormatsShowsTheClusterAndEachReplica(t *testing.T) {
	metrics := freeport.Addr(t)
	cfg := intentdtest.Config(t.TempDir())
	cfg.MetricsListen = metrics
	intentdtest.Start(t, cfg, slog.New(slog.DiscardHandler))

	// The metrics listener starts beside gRPC: wait until it answers.
	text := invocation{args: []string{"formats", "http://" + metrics}, env: map[string]string{}}.run(t)
	for deadline := time.Now().Add(10 * time.Second); text.code == exitUnreachable && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		text = invocation{args: []string{"formats", "http://" + metrics}, env: map[string]string{}}.run(t)
	}
	if text.code != exitOK {
		t.Fatalf("formats: exit %d\n%s", text.code, text.stderr)
	}
	for _, want := range []string{
		"cluster format version: ", "settled: ", "REPLICA", "VERSION", "READS", "WRITES", " (answered)",
		fmt.Sprintf("  %d  ", etcdstore.FormatNewest),
	} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("formats printed no %q:\n%s", want, text.stdout)
		}
	}

	js := invocation{args: []string{"-o", "json", "formats", "http://" + metrics + "/formats"}, env: map[string]string{}}.run(t)
	if js.code != exitOK {
		t.Fatalf("formats -o json: exit %d\n%s", js.code, js.stderr)
	}
	var a formatsAnswer
	if err := json.Unmarshal([]byte(js.stdout), &a); err != nil {
		t.Fatalf("formats -o json: %v\n%s", err, js.stdout)
	}
	if len(a.Replicas) == 0 || a.Self.ID == "" || a.Self.Reads != etcdstore.FormatNewest || a.Effective < etcdstore.FormatFirst {
		t.Errorf("formats -o json = %+v, want this replica announced, reading format %d", a, etcdstore.FormatNewest)
	}

	for _, tc := range []struct {
		arg  string
		code int
	}{
		{"not-a-url", exitUsage},
		{"http://" + metrics + "/nope", exitFailure},
	} {
		r := invocation{args: []string{"formats", tc.arg}, env: map[string]string{}}.run(t)
		if r.code != tc.code {
			t.Errorf("formats %s: exit %d, want %d\n%s", tc.arg, r.code, tc.code, r.stderr)
		}
	}
}
