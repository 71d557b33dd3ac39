// Package etcdsteer keeps an etcd client's calls away from the members that
// do not answer.
//
// The etcd client spreads calls round robin over every endpoint it was
// given, and it cannot tell a stalled member from a slow one: a member that
// was SIGSTOPped, or whose packets are dropped without a reset, keeps its
// connection open and answers nothing. Every call balanced onto it waits out
// its whole timeout, and so does the read-back after that ambiguous outcome
// if it lands there too, while the two healthy members would have answered
// in a millisecond. gRPC keepalive finds such a connection dead, but not
// before 10 s (gRPC's floor for the ping interval) plus the ping timeout.
//
// A Steerer asks every member for its status, each on a connection of its
// own, every Interval, and gives the client only the members that answered
// within Timeout and know a leader: at most Interval + Timeout after a
// member stalls, no new call is sent to it. A call already sent to it is not
// moved (a write may have been applied): it waits out its own timeout, and
// the store reads back on a member that answers.
//
// What it does not do: it never leaves the client without endpoints (when
// no member knows a leader, those that answer are used; when none answers,
// all of them), and it does not judge a member that answers Status but is
// slow to serve reads and writes; those calls still wait for their timeout.
package etcdsteer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config configures a Steerer.
type Config struct {
	// Endpoints are the members' client URLs, as the client was given them.
	Endpoints []string
	// Interval is how often every member is asked; Timeout is how long each
	// has to answer.
	Interval, Timeout time.Duration
	// Dial builds the client that asks one endpoint (with the TLS of the
	// steered client).
	Dial func(endpoint string) (*clientv3.Client, error)
	// Logger hears when members stop or start answering.
	Logger *slog.Logger
}

// Validate checks the fields and how they relate.
func (c Config) Validate() error {
	switch {
	case len(c.Endpoints) == 0:
		return errors.New("etcdsteer: no endpoints")
	case c.Interval <= 0 || c.Timeout <= 0:
		return fmt.Errorf("etcdsteer: Interval %v and Timeout %v must be positive", c.Interval, c.Timeout)
	case c.Dial == nil || c.Logger == nil:
		return errors.New("etcdsteer: Dial and Logger must be set")
	}
	return nil
}

// Health is what one member's answer to Status said.
type Health int

const (
	// Silent: no answer within the timeout (stopped, black-holed, down).
	Silent Health = iota
	// Leaderless: it answers, but knows no leader (an election, or it is
	// cut off from its peers), or refused the question.
	Leaderless
	// Ready: it answers and knows a leader.
	Ready
)

func (h Health) String() string {
	switch h {
	case Ready:
		return "ready"
	case Leaderless:
		return "leaderless"
	}
	return "silent"
}

// Choose returns the endpoints to use: the ready ones; when none is, the
// leaderless ones (better an election than a call that hangs); when none
// answered, all of them. health[i] is endpoints[i]'s.
func Choose(endpoints []string, health []Health) []string {
	for _, want := range []Health{Ready, Leaderless} {
		var out []string
		for i, ep := range endpoints {
			if health[i] == want {
				out = append(out, ep)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return slices.Clone(endpoints)
}

// Steerer sets a client's endpoints to the members that answer.
type Steerer struct {
	cli    *clientv3.Client
	cfg    Config
	probes []*clientv3.Client
	inUse  []string
}

// New returns a Steerer of cli, with one probing connection per endpoint.
// cli starts out with every endpoint.
func New(cli *clientv3.Client, cfg Config) (*Steerer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Steerer{cli: cli, cfg: cfg, inUse: slices.Clone(cfg.Endpoints)}
	for _, ep := range cfg.Endpoints {
		p, err := cfg.Dial(ep)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("etcdsteer: client for %s: %w", ep, err)
		}
		s.probes = append(s.probes, p)
	}
	return s, nil
}

// Close closes the probing connections.
func (s *Steerer) Close() {
	for _, p := range s.probes {
		_ = p.Close()
	}
}

// Run steers every Interval until ctx ends.
func (s *Steerer) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.Steer(ctx)
	}
}

// Steer asks every member once, at the same time, and sets the client's
// endpoints to those Choose picks, if they changed. It returns them.
func (s *Steerer) Steer(ctx context.Context) []string {
	health := make([]Health, len(s.probes))
	var wg sync.WaitGroup
	for i, p := range s.probes {
		wg.Go(func() { health[i] = s.ask(ctx, p) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return s.inUse
	}
	next := Choose(s.cfg.Endpoints, health)
	if slices.Equal(next, s.inUse) {
		return s.inUse
	}
	var states []string
	for i, ep := range s.cfg.Endpoints {
		states = append(states, ep+"="+health[i].String())
	}
	if len(next) < len(s.cfg.Endpoints) {
		s.cfg.Logger.Warn("etcd members not ready; calls go to the others", "using", next, "members", states)
	} else {
		s.cfg.Logger.Info("etcd members all in use again", "members", states)
	}
	s.cli.SetEndpoints(next...)
	s.inUse = next
	return next
}

// ask asks one member for its status within Timeout.
func (s *Steerer) ask(ctx context.Context, p *clientv3.Client) Health {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := pb.NewMaintenanceClient(p.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
	if err != nil && ctx.Err() != nil {
		return Silent
	}
	switch status.Code(err) {
	case codes.OK:
		if resp.GetLeader() == 0 {
			return Leaderless
		}
		return Ready
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return Silent
	}
	return Leaderless // it answered, with a refusal
}
