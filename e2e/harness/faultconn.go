package harness

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FaultyConn is a worker's connection to intentd, in the test process, with
// the two faults a process has: it stops (SIGSTOP: every call waits until
// it continues, whatever its deadline, as a stopped process's timers do not
// fire) and it dies (every call fails at once and sends nothing); and the
// network's: an answer lost after intentd acted (UNAVAILABLE, as after a
// reset connection), chosen call by call. For faults of the bytes on a link
// (delay, blackhole, replies dropped, cut) put a Proxy in front of intentd
// instead; for a worker that really is a process, see ChildCommand.
type FaultyConn struct {
	// CC carries the calls.
	CC *grpc.ClientConn
	// LoseAnswer, when set, chooses the calls whose answer is lost.
	LoseAnswer func(method string, req any) bool

	mu      sync.Mutex
	stopped chan struct{} // closed by cont; nil while running
	killed  bool
}

var _ grpc.ClientConnInterface = (*FaultyConn)(nil)

// Stop holds every call from now on until Cont.
func (f *FaultyConn) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped == nil {
		f.stopped = make(chan struct{})
	}
}

// Cont lets the calls Stop held go.
func (f *FaultyConn) Cont() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped != nil {
		close(f.stopped)
		f.stopped = nil
	}
}

// Kill fails every call from now on at once.
func (f *FaultyConn) Kill() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killed = true
}

// Dead reports whether Kill was called.
func (f *FaultyConn) Dead() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.killed
}

// gate holds a call while the process is stopped and refuses it once the
// process is dead.
func (f *FaultyConn) gate() error {
	f.mu.Lock()
	stopped := f.stopped
	f.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
	if f.Dead() {
		return status.Error(codes.Canceled, "harness: the worker process died")
	}
	return nil
}

// Invoke sends a unary call unless the process is stopped (it waits) or
// dead, and loses its answer if LoseAnswer says so.
func (f *FaultyConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if err := f.gate(); err != nil {
		return err
	}
	err := f.CC.Invoke(ctx, method, args, reply, opts...)
	if err == nil && f.LoseAnswer != nil && f.LoseAnswer(method, args) {
		return status.Error(codes.Unavailable, "harness: connection reset before the answer arrived")
	}
	return err
}

// NewStream opens a stream unless the process is stopped (it waits) or
// dead.
func (f *FaultyConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := f.gate(); err != nil {
		return nil, err
	}
	return f.CC.NewStream(ctx, desc, method, opts...)
}
