// Package rawrpc sends bytes as a gRPC request message, unencoded, so that
// tests can put on the wire what no generated client would: strings that
// are not UTF-8, messages that break off, bytes that are no protobuf at all.
package rawrpc

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// codec sends a *[]byte as the message itself and receives one likewise.
type codec struct{}

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (codec) Name() string { return "proto" }

// StreamWait is how long Call waits for a stream's first message: an
// accepted watch may send nothing until a change.
const StreamWait = 200 * time.Millisecond

// Call sends b as the request of fullMethod ("/pkg.Service/Method") and
// returns the call's error. With stream set the call is a server stream:
// b is its one request, and the stream is read until its first message or
// error, or for StreamWait (an accepted stream that stays quiet is no
// error).
func Call(ctx context.Context, conn grpc.ClientConnInterface, fullMethod string, stream bool, b []byte) error {
	if !stream {
		var out []byte
		return conn.Invoke(ctx, fullMethod, &b, &out, grpc.ForceCodecV2(codec{}))
	}
	ctx, cancel := context.WithTimeout(ctx, StreamWait)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, fullMethod, grpc.ForceCodecV2(codec{}))
	if err != nil {
		return err
	}
	if err := st.SendMsg(&b); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	var out []byte
	// The wait ends as DEADLINE_EXCEEDED, which may arrive a moment before
	// ctx's timer says so: only an end well before the wait is an error.
	deadline, _ := ctx.Deadline()
	if err := st.RecvMsg(&out); err != nil && !(status.Code(err) == codes.DeadlineExceeded && time.Until(deadline) < 50*time.Millisecond) {
		return err
	}
	return nil
}
