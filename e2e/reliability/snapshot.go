package reliability

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Snapshot saves a snapshot of the cluster's data, taken from member m on
// its own client URL as an operator's `etcdctl snapshot save` does, to path;
// it returns the revision the snapshot holds.
func (c *Cluster) Snapshot(ctx context.Context, m *Member, path string) (int64, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	// The revision first: the snapshot holds at least this one.
	st, err := cli.Status(ctx, m.ClientURL)
	if err != nil {
		return 0, fmt.Errorf("etcd %s status: %w", m.Name, err)
	}
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return 0, fmt.Errorf("etcd %s snapshot: %w", m.Name, err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	if _, err := io.Copy(f, rc); err != nil {
		_ = f.Close()
		return 0, fmt.Errorf("etcd %s snapshot: %w", m.Name, err)
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	return st.Header.Revision, nil
}

// Restore replaces the whole cluster with the data of a snapshot, the way
// an operator recovers from a disaster: every member is killed, restored
// from the snapshot with etcdutl into a new data directory (same names,
// peer URLs and cluster token), and started again; it waits for a leader.
// bump > 0 raises the revision by bump (--bump-revision, with
// --mark-compacted, as the documented procedure says); 0 restores the
// snapshot's own revision, which is what intentd must refuse.
func (c *Cluster) Restore(ctx context.Context, etcdutl, snapshot string, bump uint64) error {
	var initial []string
	for _, m := range c.Members {
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		m.Kill()
		dir := filepath.Join(c.t.TempDir(), "restored")
		args := []string{"snapshot", "restore", snapshot,
			"--data-dir", dir,
			"--name", m.Name,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster-token", "reliability",
		}
		if bump > 0 {
			args = append(args, "--bump-revision", fmt.Sprint(bump), "--mark-compacted")
		}
		if out, err := exec.CommandContext(ctx, etcdutl, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("etcdutl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		m.mu.Lock()
		for i := range m.args {
			if m.args[i] == "--data-dir" {
				m.args[i+1] = dir
			}
		}
		m.DataDir = dir
		m.mu.Unlock()
	}
	for _, m := range c.Members {
		if err := m.start(); err != nil {
			return err
		}
	}
	_, err := c.WaitLeader(ctx)
	return err
}
