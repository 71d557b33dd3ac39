package reliability

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// RestartWithFlags restarts the members one at a time with flags appended
// to their command lines (e.g. "--quota-backend-bytes", "16777216"), each
// on its data directory and ports, waiting until each serves again and the
// cluster agrees on a leader before the next: a rolling restart, as an
// operator changes a member's configuration. Call it before the load
// starts.
func (c *Cluster) RestartWithFlags(ctx context.Context, flags ...string) error {
	for _, m := range c.Members {
		m.Kill()
		m.mu.Lock()
		m.args = append(m.args, flags...)
		m.mu.Unlock()
		if err := m.start(); err != nil {
			return err
		}
		for {
			if _, err := m.status(ctx); err == nil {
				if _, err := c.Leader(ctx); err == nil {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("etcd %s restarted with %s: %w", m.Name, strings.Join(flags, " "), ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// Admin is an etcd client on the members' own client URLs (around the
// proxies), for what an operator does: compact, defragment, disarm alarms.
// It is closed when the test ends.
func (c *Cluster) Admin() (*clientv3.Client, error) {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.ClientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli, nil
}
