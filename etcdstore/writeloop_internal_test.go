package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// asClientReturns is a gRPC status error of etcd's server as the etcd
// client hands it to the store (clientv3.ContextError: an error etcd
// names becomes an rpctypes.EtcdError, and a cancelled or timed-out call
// becomes its context's error).
func asClientReturns(ctx context.Context, err error) error { return clientv3.ContextError(ctx, err) }

// want is what classify must make of an error: its class when it came
// from a read and from the write loop's commit, what the caller is told
// (the sentinel its answer must match, and not), and the flags.
type want struct {
	read, write class
	is          error
	isNot       error
	full, whole bool
}

var (
	transient  = want{read: retry, write: readBack, is: intent.ErrUnavailable}
	unproposed = want{read: retry, write: retry, is: intent.ErrUnavailable}
	refused    = want{read: refuse, write: refuse, is: intent.ErrUnavailable}
)

func checkVerdicts(t *testing.T, err error, w want) {
	t.Helper()
	for _, write := range []bool{false, true} {
		got := classify(err, write)
		wantClass := w.read
		if write {
			wantClass = w.write
		}
		if got.class != wantClass {
			t.Errorf("classify(%v, write=%v) = class %d, want %d", err, write, got.class, wantClass)
		}
		if got.full != w.full || got.whole != w.whole {
			t.Errorf("classify(%v, write=%v): full %v whole %v, want %v %v", err, write, got.full, got.whole, w.full, w.whole)
		}
		if w.is != nil && !errors.Is(got.err, w.is) {
			t.Errorf("classify(%v, write=%v) answers %v, want it to match %v", err, write, got.err, w.is)
		}
		if w.isNot != nil && errors.Is(got.err, w.isNot) {
			t.Errorf("classify(%v, write=%v) answers %v, which must not match %v", err, write, got.err, w.isNot)
		}
	}
}

// Every error of an etcd call falls in exactly one class, with the answer
// the caller gives: errors as the etcd client returns them (etcd's named
// errors, gRPC statuses it passes on, context errors), and the store's
// own refusals.
func TestClassify(t *testing.T) {
	bg := context.Background()
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	expired, cancelExpired := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancelExpired()

	tests := []struct {
		name string
		err  error
		want want
	}{
		{"no error", nil, want{read: succeeded, write: succeeded}},

		// Context errors: the caller gave up, or one attempt's deadline
		// passed (a write may have applied).
		{"caller cancelled", asClientReturns(cancelled, status.Error(codes.Canceled, "context canceled")),
			want{read: refuse, write: refuse, is: context.Canceled, isNot: intent.ErrUnavailable}},
		{"caller cancelled, wrapped", fmt.Errorf("commit: %w", context.Canceled),
			want{read: refuse, write: refuse, is: context.Canceled}},
		{"attempt deadline", asClientReturns(expired, status.Error(codes.DeadlineExceeded, "context deadline exceeded")), transient},
		{"attempt deadline, bare", context.DeadlineExceeded, transient},

		// Outcome unknown: a member that cannot answer now.
		{"leader changed", asClientReturns(bg, rpctypes.ErrGRPCLeaderChanged), transient},
		{"request timed out", asClientReturns(bg, rpctypes.ErrGRPCTimeout), transient},
		{"timed out, leader failed", asClientReturns(bg, rpctypes.ErrGRPCTimeoutDueToLeaderFail), transient},
		{"timed out, connection lost", asClientReturns(bg, rpctypes.ErrGRPCTimeoutDueToConnectionLost), transient},
		{"timed out waiting for the applied index", asClientReturns(bg, rpctypes.ErrGRPCTimeoutWaitAppliedIndex), transient},
		{"server stopped", asClientReturns(bg, rpctypes.ErrGRPCStopped), transient},
		{"unhealthy cluster", asClientReturns(bg, rpctypes.ErrGRPCUnhealthy), transient},
		{"connection refused (a gRPC status)", asClientReturns(bg, status.Error(codes.Unavailable, "connection error: dial tcp 127.0.0.1:2379: connect: connection refused")), transient},
		{"deadline exceeded status, context alive", asClientReturns(bg, status.Error(codes.DeadlineExceeded, "deadline exceeded")), transient},
		{"server-side cancel", asClientReturns(bg, rpctypes.ErrGRPCCanceled), transient},
		{"reply lost (the tests' lossyKV)", status.Error(codes.Unavailable, "lossyKV: reply dropped after commit"), transient},
		{"an error nobody names", errors.New("something broke"), transient},

		// Turned away before it was proposed: nothing was written.
		{"no leader", asClientReturns(bg, rpctypes.ErrGRPCNoLeader), unproposed},
		{"not leader", asClientReturns(bg, rpctypes.ErrGRPCNotLeader), unproposed},
		{"too many requests", asClientReturns(bg, rpctypes.ErrGRPCRequestTooManyRequests), unproposed},
		{"no endpoint", clientv3.ErrNoAvailableEndpoints, unproposed},

		// A full backend: read back after a commit (etcd applied the
		// write that crossed the quota); refused elsewhere.
		{"NOSPACE", asClientReturns(bg, rpctypes.ErrGRPCNoSpace),
			want{read: refuse, write: readBack, is: intent.ErrStoreFull, isNot: intent.ErrUnavailable, full: true}},

		// Refused whole for what the request holds.
		{"request too large", asClientReturns(bg, rpctypes.ErrGRPCRequestTooLarge),
			want{read: refuse, write: refuse, is: intent.ErrTooLarge, isNot: intent.ErrUnavailable, whole: true}},
		{"too many operations", asClientReturns(bg, rpctypes.ErrGRPCTooManyOps),
			want{read: refuse, write: refuse, is: intent.ErrTooLarge, whole: true}},
		{"a key twice", asClientReturns(bg, rpctypes.ErrGRPCDuplicateKey),
			want{read: refuse, write: refuse, is: rpctypes.ErrDuplicateKey, isNot: intent.ErrUnavailable, whole: true}},

		// Permanent.
		{"lease not found", asClientReturns(bg, rpctypes.ErrGRPCLeaseNotFound),
			want{read: refuse, write: refuse, is: intent.ErrSessionNotFound, isNot: intent.ErrUnavailable}},
		{"compacted", asClientReturns(bg, rpctypes.ErrGRPCCompacted),
			want{read: refuse, write: refuse, is: intent.ErrCompacted, isNot: intent.ErrUnavailable}},
		{"permission denied", asClientReturns(bg, rpctypes.ErrGRPCPermissionDenied), refused},
		{"invalid auth token", asClientReturns(bg, rpctypes.ErrGRPCInvalidAuthToken), refused},
		{"authentication failed", asClientReturns(bg, rpctypes.ErrGRPCAuthFailed), refused},
		{"corrupt cluster", asClientReturns(bg, rpctypes.ErrGRPCCorrupt), refused},
		{"future revision", asClientReturns(bg, rpctypes.ErrGRPCFutureRev), refused},
		{"lease TTL too large", asClientReturns(bg, rpctypes.ErrGRPCLeaseTTLTooLarge), refused},

		// The store's own refusals.
		{"revision went back", fmt.Errorf("%w", &RolledBackError{Revision: 5, Floor: 9}),
			want{read: refuse, write: refuse, is: intent.ErrStoreRolledBack}},
		{"transaction too large", fmt.Errorf("%w: 130 operations", intent.ErrTooLarge),
			want{read: refuse, write: refuse, is: intent.ErrTooLarge, isNot: intent.ErrUnavailable}},
		{"corrupt record", fmt.Errorf("%w: %q", errCorrupt, "k"),
			want{read: refuse, write: refuse, is: errCorrupt, isNot: intent.ErrUnavailable}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkVerdicts(t, tc.err, tc.want) })
	}
}

// The errors a real etcd gives the store's calls are classed as the
// table says, as the client returns them; and a read answers a
// compacted revision naming the one it asked for.
func TestClassifyRealEtcdErrors(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return c
	}
	var rev int64
	for i := range 3 {
		resp, err := cli.Put(ctx(), fmt.Sprintf("k%d", i), "v")
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := cli.Compact(ctx(), rev); err != nil {
		t.Fatal(err)
	}
	manyOps := make([]clientv3.Op, maxTxnOps+1)
	for i := range manyOps {
		manyOps[i] = clientv3.OpPut(fmt.Sprintf("op%d", i), "v")
	}
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()

	tests := []struct {
		name string
		call func() error
		want want
	}{
		{"too many operations", func() error {
			_, err := cli.Txn(ctx()).Then(manyOps...).Commit()
			return err
		}, want{read: refuse, write: refuse, is: intent.ErrTooLarge, whole: true}},
		{"request too large for etcd", func() error {
			_, err := cli.Put(ctx(), "big", strings.Repeat("x", 1600<<10))
			return err
		}, want{read: refuse, write: refuse, is: intent.ErrTooLarge, whole: true}},
		{"request too large for the client", func() error {
			_, err := cli.Put(ctx(), "big", strings.Repeat("x", 2<<20))
			return err
		}, want{read: refuse, write: refuse, is: intent.ErrTooLarge, whole: true}},
		{"a key twice", func() error {
			_, err := cli.Txn(ctx()).Then(clientv3.OpPut("twice", "a"), clientv3.OpPut("twice", "b")).Commit()
			return err
		}, want{read: refuse, write: refuse, is: rpctypes.ErrDuplicateKey, whole: true}},
		{"lease not found", func() error {
			_, err := cli.Put(ctx(), "leased", "v", clientv3.WithLease(0x1234))
			return err
		}, want{read: refuse, write: refuse, is: intent.ErrSessionNotFound}},
		{"keep-alive of a lease not found", func() error {
			_, err := cli.KeepAliveOnce(ctx(), 0x1234)
			return err
		}, want{read: refuse, write: refuse, is: intent.ErrSessionNotFound}},
		{"compacted", func() error {
			_, err := cli.Get(ctx(), "k0", clientv3.WithRev(rev-1))
			return err
		}, want{read: refuse, write: refuse, is: intent.ErrCompacted}},
		{"future revision", func() error {
			_, err := cli.Get(ctx(), "k0", clientv3.WithRev(rev+1000))
			return err
		}, refused},
		{"deadline passed", func() error {
			_, err := cli.Get(expired, "k0")
			return err
		}, transient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatal("etcd accepted the call; the test needs it refused")
			}
			checkVerdicts(t, err, tc.want)
		})
	}

	_, err := cli.Get(ctx(), "k0", clientv3.WithRev(rev-1))
	var c *intent.CompactedError
	if got := readErr(err, rev-1); !errors.As(got, &c) || c.Requested != rev-1 {
		t.Errorf("readErr(%v) = %v, want a *intent.CompactedError for revision %d", err, got, rev-1)
	}
}
