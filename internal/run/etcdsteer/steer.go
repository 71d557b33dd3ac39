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
// within Timeout, know a leader and are caught up: at most Interval +
// Timeout after a member stalls, no new call is sent to it. A call already
// sent to it is not moved (a write may have been applied): it waits out its
// own timeout, and the store reads back on a member that answers.
//
// Caught up means having applied at least what the most advanced member
// had applied one round earlier. A member that comes back from a stall
// knows the leader at once but is seconds of writes behind; a linearizable
// read on it waits until it has applied them, so calls sent to it would
// stall as before, only later.
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

	"github.com/intentd/intentd/internal/core/periodic"
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
	// Lagging: it knows a leader, but has applied less than the most
	// advanced member had one round earlier (it is catching up).
	Lagging
	// Ready: it knows a leader and is caught up.
	Ready
)

func (h Health) String() string {
	switch h {
	case Ready:
		return "ready"
	case Lagging:
		return "lagging"
	case Leaderless:
		return "leaderless"
	}
	return "silent"
}

// Choose returns the endpoints to use: the ready ones; when none is, the
// lagging ones, then the leaderless ones (better a wait for an election
// than a call that hangs); when none answered, all of them. health[i] is
// endpoints[i]'s.
func Choose(endpoints []string, health []Health) []string {
	for _, want := range []Health{Ready, Lagging, Leaderless} {
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
	// floor is the highest applied index a member reported in the last
	// round: what a member must have applied to be caught up.
	floor uint64
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
	periodic.Every(ctx, s.cfg.Interval, func() { s.Steer(ctx) })
}

// Steer asks every member once, at the same time, and sets the client's
// endpoints to those Choose picks, if they changed. It returns them.
func (s *Steerer) Steer(ctx context.Context) []string {
	answers := make([]answer, len(s.probes))
	var wg sync.WaitGroup
	for i, p := range s.probes {
		wg.Go(func() { answers[i] = s.ask(ctx, p) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return s.inUse
	}
	var health []Health
	health, s.floor = judge(answers, s.floor)
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

// answer is one member's reply to Status: Silent, Leaderless, or Ready
// (it knows a leader) with the index it has applied.
type answer struct {
	health  Health
	applied uint64
}

// judge demotes the ready members that have applied less than floor to
// Lagging; it returns every member's health, and the next round's floor.
func judge(answers []answer, floor uint64) ([]Health, uint64) {
	health := make([]Health, len(answers))
	var next uint64
	for i, a := range answers {
		health[i] = a.health
		if a.health == Ready && a.applied < floor {
			health[i] = Lagging
		}
		next = max(next, a.applied)
	}
	return health, next
}

// ask asks one member for its status within Timeout.
func (s *Steerer) ask(ctx context.Context, p *clientv3.Client) answer {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := pb.NewMaintenanceClient(p.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
	if err != nil && ctx.Err() != nil {
		return answer{health: Silent}
	}
	switch status.Code(err) {
	case codes.OK:
		if resp.GetLeader() == 0 {
			return answer{health: Leaderless, applied: resp.GetRaftAppliedIndex()}
		}
		return answer{health: Ready, applied: resp.GetRaftAppliedIndex()}
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return answer{health: Silent}
	}
	return answer{health: Leaderless} // it answered, with a refusal
}
