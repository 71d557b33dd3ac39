package daemon

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// Each failed probe becomes one line saying why the replica is not ready.
func TestNotReadyReason(t *testing.T) {
	back := fmt.Errorf("%w", &etcdstore.RolledBackError{Revision: 812, Floor: 4096})
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"ready", nil, ""},
		{"revision went back", back, "etcd revision went back: answered at 812, below 4096 already seen (restored from an older snapshot?)"},
		{"deadline", fmt.Errorf("%w: %w", intent.ErrUnavailable, context.DeadlineExceeded), "etcd: no answer within 3s"},
		{"deadline as text", fmt.Errorf("%w: %v", intent.ErrUnavailable, context.DeadlineExceeded), "etcd: no answer within 3s"},
		{"other, on one line", errors.New("etcdclient: no\n  endpoints\tavailable"), "etcd: etcdclient: no endpoints available"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := notReadyReason(tc.err, 3*time.Second); got != tc.want {
				t.Errorf("notReadyReason(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}
