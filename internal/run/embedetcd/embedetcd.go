// Package embedetcd holds what every embedded etcd of intentd's shares,
// the daemon's own (internal/run/daemon) and the tests' (internal/testing/etcdtest): a
// single member that logs nothing of its own, and the wait for it to serve.
// Where it listens, and how much it keeps, is each caller's.
package embedetcd

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config returns the configuration of a single etcd member named name with
// its data in dir, registered in its one-member cluster under peer, its own
// logging silenced (its failures reach the caller as errors). The caller
// sets the listeners.
func Config(name, dir string, peer url.URL) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = name + "=" + peer.String()
	return cfg
}

// WaitReady waits until e serves clients, and returns an error, after
// closing e, if it fails first or is not ready within the given time.
func WaitReady(e *embed.Etcd, within time.Duration) error {
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		e.Close()
		return err
	case <-time.After(within):
		e.Close()
		return fmt.Errorf("etcd did not become ready within %v", within)
	}
}
