package etcdstore_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
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

// Regression (found by the reliability suite, TestEtcdBackendQuotaExhausted):
// etcd applies the write that crosses the backend quota, then raises the
// NOSPACE alarm and answers that write NOSPACE. The store took every NOSPACE
// for a refusal and answered STORE_FULL "nothing was written" for a Complete
// that had landed. Now a NOSPACE is read back like any ambiguous outcome:
// whatever a caller is told was refused as full must be absent.
func TestNoSpaceAfterApplyIsNotReportedFull(t *testing.T) {
	for round := range 3 {
		srv := etcdtest.StartWith(t, t.TempDir(), func(c *embed.Config) { c.QuotaBackendBytes = 4 << 20 })
		s, err := etcdstore.New(srv.Client(t), etcdstore.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		big := strings.Repeat("x", 60<<10)
		var wg sync.WaitGroup
		var refused atomic.Int64
		for w := range 8 {
			wg.Go(func() {
				for i := 0; i < 200; i++ {
					key := fmt.Sprintf("fill-%d-%d", w, i)
					params, _ := intent.Canonical(map[string]any{"note": big, "n": float64(i)})
					reg := intent.Registration{Tenant: "default", Key: key, Params: params, RequestID: key}
					_, _, err := s.Register(ctx(t), reg)
					if err == nil {
						continue
					}
					if !errors.Is(err, intent.ErrStoreFull) {
						t.Errorf("round %d: Register %s: %v, want success or ErrStoreFull", round, key, err)
						return
					}
					refused.Add(1)
					if _, err := s.Get(ctx(t), "default", key); !errors.Is(err, intent.ErrNotFound) {
						t.Errorf("round %d: Register %s answered ErrStoreFull, yet a read finds it (Get: %v)", round, key, err)
					}
					return
				}
			})
		}
		wg.Wait()
		if refused.Load() == 0 {
			t.Fatalf("round %d: the store never filled", round)
		}
	}
}
