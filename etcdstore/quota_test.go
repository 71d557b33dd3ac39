package etcdstore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/etcdtest"
)

// When etcd's backend quota is exhausted, writes fail at once with
// ErrStoreFull (never retried as ambiguous until the deadline), and reads
// are still served. Recovery is an operator's: compact, defragment, and
// disarm the NOSPACE alarm (etcdctl alarm disarm).
func TestBackendQuotaExhausted(t *testing.T) {
	srv := etcdtest.StartWith(t, t.TempDir(), func(c *embed.Config) { c.QuotaBackendBytes = 4 << 20 })
	s, err := etcdstore.New(srv.Client(t), etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 60<<10)
	var full error
	first := ""
	for i := 0; i < 400 && full == nil; i++ {
		params, _ := intent.Canonical(map[string]any{"note": big, "n": float64(i)})
		reg := intent.Registration{Tenant: "default", Key: fmt.Sprintf("fill-%d", i), Params: params}
		if _, _, err := s.Register(ctx(t), reg); err != nil {
			full = err
			break
		}
		if first == "" {
			first = reg.Key
		}
	}
	if !errors.Is(full, intent.ErrStoreFull) {
		t.Fatalf("filling the store ended with %v, want ErrStoreFull", full)
	}
	if _, err := s.Get(ctx(t), "default", first); err != nil {
		t.Fatalf("Get on a full store: %v, want reads still served", err)
	}
}
