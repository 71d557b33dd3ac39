package server

import (
	"runtime"
	"sync"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// keptWire holds the encoding of every replay answer kept in a memo, keyed
// by the answer, so that the server's codec (RequestCodec) sends those
// bytes instead of encoding the same answer again on every replay. An entry
// lives as long as the memo that keeps its answer: a cleanup removes it once
// the memo is unreachable (its record's version left the store's cache or
// was superseded). The answer itself never changes once kept, so neither
// can its encoding.
var keptWire sync.Map // *intentv1.AcquireResponse → []byte

// keep stores r, the replay answer of the version m belongs to, in m, with
// its encoding. Two first replays of a version may both keep theirs: both
// are the same answer, and the loser's encoding goes with m.
func keep(m *intent.Memo, r *intentv1.AcquireResponse) {
	// Deterministic, so that every replay of the version sends the same
	// bytes: a map's entries (params, labels, external refs) are in key
	// order, where a plain encoding orders them at random on each call.
	if wire, err := (proto.MarshalOptions{Deterministic: true}).Marshal(r); err == nil {
		keptWire.Store(r, wire)
		runtime.AddCleanup(m, func(r *intentv1.AcquireResponse) { keptWire.Delete(r) }, r)
	}
	m.Store(r)
}

// keptEncoding returns the encoding of v if v is an Acquire answer: a kept
// replay answer's kept bytes, any other answer encoded as they were made,
// deterministically. So a replay that had to read etcd (its version not
// remembered, or remembered without a memo) sends the very bytes a replay
// from memory sends.
func keptEncoding(v any) (mem.BufferSlice, bool) {
	r, ok := v.(*intentv1.AcquireResponse)
	if !ok {
		return nil, false
	}
	if wire, ok := keptBytes(r); ok {
		// A SliceBuffer's Free does nothing: the transport's release of
		// the message after sending leaves the kept bytes as they are.
		return mem.BufferSlice{mem.SliceBuffer(wire)}, true
	}
	// As grpc-go's codec encodes, deterministically: a large answer in a
	// buffer of the transport's pool, which it frees once sent.
	opts := proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
	size := opts.Size(r)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(r)
		if err != nil {
			return nil, false // grpc-go's codec says what is wrong
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, true
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], r); err != nil {
		pool.Put(buf)
		return nil, false
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, true
}

// keptBytes is the encoding kept with r, if r is a kept replay answer.
func keptBytes(r *intentv1.AcquireResponse) ([]byte, bool) {
	wire, ok := keptWire.Load(r)
	if !ok {
		return nil, false
	}
	return wire.([]byte), true
}
