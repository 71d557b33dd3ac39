package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Session is a worker's session: the unit of liveness of every lease it
// holds. It heartbeats in the background every TTL/3, naming the leases it
// tracks; a lease found superseded is reported lost at once, and when the
// session itself is gone (expired, closed, or no heartbeat confirmed for a
// whole TTL) every lease is lost and Done is closed.
type Session struct {
	c      *Client
	id     string
	tenant string
	ttl    time.Duration

	mu      sync.Mutex
	held    map[string]*heldLease
	lastOK  time.Time
	err     error
	done    chan struct{}
	stop    context.CancelFunc
	stopped chan struct{}
}

type heldLease struct {
	token fencing.Token
	lost  chan struct{}
}

// OpenSession starts a session for worker with the given TTL (zero: the
// server's default) and its heartbeat goroutine, which exits when the
// session ends or Close is called.
func (c *Client) OpenSession(ctx context.Context, worker string, ttl time.Duration) (*Session, error) {
	req := &intentv1.OpenSessionRequest{Tenant: c.opts.tenant, Worker: worker}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := call(ctx, c, c.rpc.OpenSession, req)
	if err != nil {
		return nil, err
	}
	hctx, stop := context.WithCancel(context.Background())
	s := &Session{
		c: c, id: resp.GetSessionId(), tenant: c.opts.tenant, ttl: resp.GetTtl().AsDuration(),
		held: map[string]*heldLease{}, lastOK: time.Now(),
		done: make(chan struct{}), stop: stop, stopped: make(chan struct{}),
	}
	go s.heartbeat(hctx)
	return s, nil
}

// ID is the session id the server knows it by.
func (s *Session) ID() string { return s.id }

// TTL is the session's time to live without a heartbeat.
func (s *Session) TTL() time.Duration { return s.ttl }

// Done is closed when the session is lost: every lease it held may have
// lapsed, and work under them must stop.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err says why Done was closed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the session on the server (every lease it still holds becomes
// UNKNOWN there) and stops heartbeating.
func (s *Session) Close(ctx context.Context) error {
	s.stop()
	<-s.stopped
	s.lose(errors.New("client: session closed"))
	_, err := call(ctx, s.c, s.c.rpc.CloseSession, &intentv1.CloseSessionRequest{Tenant: s.tenant, SessionId: s.id})
	return err
}

// track starts naming a lease in heartbeats; the returned channel is
// closed when the lease is lost (superseded, or the session lost).
func (s *Session) track(key string, t fencing.Token) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &heldLease{token: t, lost: make(chan struct{})}
	if s.err != nil {
		close(h.lost)
		return h.lost
	}
	if old := s.held[key]; old != nil {
		close(old.lost)
	}
	s.held[key] = h
	return h.lost
}

// untrack stops naming a lease (it was reported on).
func (s *Session) untrack(key string, t fencing.Token) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[key]; h != nil && h.token == t {
		delete(s.held, key)
	}
}

// lose ends the session locally: every lease is lost.
func (s *Session) lose(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	s.err = err
	for k, h := range s.held {
		close(h.lost)
		delete(s.held, k)
	}
	close(s.done)
}

// heartbeat keeps the session alive until it is lost or stopped. The
// session counts as alive for one TTL after the *sending* of the last
// heartbeat intentd confirmed (etcd restarts the TTL later than that, never
// earlier), so the worker gives up its leases no later than etcd could
// expire them.
func (s *Session) heartbeat(ctx context.Context) {
	defer close(s.stopped)
	every := max(s.ttl/3, 100*time.Millisecond)
	beat := time.NewTicker(every)
	defer beat.Stop()
	expire := time.NewTimer(s.ttl)
	defer expire.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case <-expire.C:
		case <-beat.C:
			s.beat(ctx, every)
		}
		left := time.Until(s.expiry())
		if left <= 0 {
			s.lose(errors.New("client: no heartbeat confirmed within the session TTL"))
			return
		}
		expire.Reset(left)
	}
}

func (s *Session) expiry() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastOK.Add(s.ttl)
}

// beat sends one heartbeat naming the tracked leases, giving up when the
// session would expire before the answer.
func (s *Session) beat(ctx context.Context, every time.Duration) {
	s.mu.Lock()
	req := &intentv1.HeartbeatRequest{Tenant: s.tenant, SessionId: s.id}
	for k, h := range s.held {
		req.Leases = append(req.Leases, &intentv1.HeldLease{Key: k, Token: uint64(h.token)})
	}
	expiry := s.lastOK.Add(s.ttl)
	s.mu.Unlock()

	sent := time.Now()
	deadline := sent.Add(every)
	if expiry.Before(deadline) {
		deadline = expiry
	}
	actx, cancel := context.WithDeadline(ctx, deadline)
	_, err := s.c.rpc.Heartbeat(actx, req)
	cancel()
	err = convert(err)
	var e *Error
	switch {
	case err == nil:
		s.mu.Lock()
		s.lastOK = sent
		s.mu.Unlock()
	case errors.Is(err, ErrStaleToken) && errors.As(err, &e):
		// The session is alive (intentd keeps it so before checking), but
		// one lease was superseded: that attempt must stop.
		s.mu.Lock()
		s.lastOK = sent
		for k, h := range s.held {
			if h.token < e.CurrentToken() && (e.Statement == nil || e.Statement.GetIntentKey() == k) {
				close(h.lost)
				delete(s.held, k)
			}
		}
		s.mu.Unlock()
	case errors.Is(err, ErrSessionNotFound):
		s.lose(err)
	}
}
