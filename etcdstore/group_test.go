package etcdstore_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// acquireAll runs one Acquire with register per key, all at once, each on
// its own session, and returns the tokens issued, by key.
func acquireAll(t *testing.T, s *etcdstore.Store, sessions []string, keys []string) map[string]fencing.Token {
	t.Helper()
	var (
		mu     sync.Mutex
		tokens = map[string]fencing.Token{}
		wg     sync.WaitGroup
		start  = make(chan struct{})
	)
	for i, key := range keys {
		wg.Go(func() {
			<-start
			reg := lamp(t, key, 1)
			a, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sessions[i], RequestID: "r-" + key, Register: &reg})
			if err != nil {
				t.Errorf("Acquire(%s): %v", key, err)
				return
			}
			if a.Outcome != intent.OutcomeExecute || a.Lease == nil {
				t.Errorf("Acquire(%s) = %v lease %v, want EXECUTE with a lease", key, a.Outcome, a.Lease)
				return
			}
			mu.Lock()
			tokens[key] = a.Lease.Token
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return tokens
}

// mustDistinct fails unless every token differs, and returns how many
// share their revision with another.
func mustDistinct(t *testing.T, tokens map[string]fencing.Token) (shared int) {
	t.Helper()
	seen := map[fencing.Token]string{}
	perRev := map[fencing.Token]int{}
	for key, tok := range tokens {
		if other, dup := seen[tok]; dup {
			t.Errorf("token %d issued to both %s and %s", tok, key, other)
		}
		seen[tok] = key
		perRev[tok/machine.TokenSlots]++
	}
	for _, n := range perRev {
		if n > 1 {
			shared += n
		}
	}
	return shared
}

// Concurrent transitions on distinct intents go to etcd as a few shared
// transactions, not one each, and the leases issued in one transaction
// (one etcd revision) still get distinct tokens, which fence as before:
// each intent completes under its own token. Config.ObserveBatch is told
// each transaction's transitions.
func TestConcurrentTransitionsShareTransactions(t *testing.T) {
	c := newCluster(t)
	var writes, reads int
	counting := countingKV(c.cli.KV, &writes, &reads)
	var batches []int // guarded by counting.mu, like writes
	cfg := etcdstore.DefaultConfig()
	cfg.ObserveBatch = func(transitions int) {
		counting.mu.Lock()
		defer counting.mu.Unlock()
		batches = append(batches, transitions)
	}
	s, err := etcdstore.NewWithKV(c.cli, counting, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	sessions, keys := make([]string, n), make([]string, n)
	for i := range n {
		sessions[i] = openSession(t, s, fmt.Sprintf("w-%d", i), time.Minute)
		keys[i] = fmt.Sprintf("group-%d", i)
	}
	counting.mu.Lock()
	writes, batches = 0, nil
	counting.mu.Unlock()

	tokens := acquireAll(t, s, sessions, keys)
	counting.mu.Lock()
	acquireWrites, acquireBatches := writes, slices.Clone(batches)
	counting.mu.Unlock()
	if len(tokens) != n {
		t.Fatalf("%d of %d Acquires issued a lease", len(tokens), n)
	}
	if acquireWrites >= n {
		t.Errorf("%d Acquires took %d write transactions, want fewer: concurrent writes share one", n, acquireWrites)
	}
	// Every Acquire is one transition here (none conflicts): the batches
	// observed are the write transactions, and carry them all.
	if sum := sumOf(acquireBatches); len(acquireBatches) != acquireWrites || sum != n || slices.Max(acquireBatches) < 2 {
		t.Errorf("ObserveBatch saw %v (%d transitions in %d transactions), want the %d write transactions carrying all %d, some more than one", acquireBatches, sum, len(acquireBatches), acquireWrites, n)
	}
	if shared := mustDistinct(t, tokens); shared == 0 {
		t.Errorf("no two of %d leases were issued at one revision; the shared transactions issued one lease each", n)
	}
	var wg sync.WaitGroup
	for key, tok := range tokens {
		wg.Go(func() {
			if _, err := s.Report(ctx(t), intent.Report{Tenant: "default", Key: key, Kind: intent.ReportComplete, Token: tok, Result: &intent.Result{Payload: []byte(`{}`)}}); err != nil {
				t.Errorf("Complete(%s, %d): %v", key, tok, err)
			}
		})
	}
	wg.Wait()
	fresh := c.store(t)
	for key, tok := range tokens {
		if in := get(t, fresh, key); in.State != intent.StateCompleted || in.Lease.Token != tok {
			t.Errorf("%s: %v under token %d, want COMPLETED under %d", key, in.State, in.Lease.Token, tok)
		}
	}
	t.Logf("%d Acquires in %d write transactions", n, acquireWrites)
}

func sumOf(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// A shared transaction whose reply is lost leaves every member's outcome
// unknown: each reads back and recognizes its own lease by the token the
// stored record materializes, and no lease is issued twice.
func TestSharedTransactionReplyLostReadBack(t *testing.T) {
	c := newCluster(t)
	var dropped int
	lossy := lossyKV(c.cli.KV, &dropped)
	s, err := etcdstore.NewWithKV(c.cli, lossy, etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reliable := c.store(t)
	const n = 32
	sessions, keys := make([]string, n), make([]string, n)
	for i := range n {
		sessions[i] = openSession(t, reliable, fmt.Sprintf("w-%d", i), time.Minute)
		keys[i] = fmt.Sprintf("lost-%d", i)
	}
	tokens := acquireAll(t, s, sessions, keys)
	if len(tokens) != n {
		t.Fatalf("%d of %d Acquires issued a lease", len(tokens), n)
	}
	mustDistinct(t, tokens)
	lossy.mu.Lock()
	lost := dropped
	lossy.mu.Unlock()
	if lost == 0 {
		t.Fatal("no reply was dropped; the test did not exercise the fault")
	}
	for key, tok := range tokens {
		in := get(t, reliable, key)
		if in.State != intent.StateInProgress || in.Lease.Token != tok || countEvents(in, intent.EventAcquired) != 1 {
			t.Errorf("%s: %v under token %d with %d acquisitions, want IN_PROGRESS under %d, acquired once", key, in.State, in.Lease.Token, countEvents(in, intent.EventAcquired), tok)
		}
	}
	t.Logf("%d Acquires, %d replies dropped", n, lost)
}
