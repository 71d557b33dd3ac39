package server

import (
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// A replay's answer depends on its version of the final record alone, so
// it is converted once per version and kept in the version's memo
// (intent.Memo), for as long as the store remembers the version (the
// store counts it; see etcdstore's cache.go). Its encoding is kept beside
// it while in use: the bytes are made once, deterministically, and sent by
// every replay until a garbage collection finds no replay sending them (a
// weak pointer), then made again by the next replay. So a version replayed
// often is encoded about once per collection, and one replayed seldom
// holds no second copy of its answer between its replays.

// keptAnswer is what the codec knows of a kept answer: its encoding, while
// in use.
type keptAnswer struct {
	wire atomic.Pointer[weak.Pointer[encoded]]
}

// encoded is a kept answer's encoding, as the weak pointer's target.
type encoded struct{ b []byte }

// keptWire holds every answer kept in a memo, keyed by the answer, so that
// the server's codec (RequestCodec) sends its encoding instead of encoding
// the same answer on every replay. An entry lives as long as the memo that
// keeps its answer: a cleanup removes it once the memo is unreachable (its
// record's version left the store's cache or was superseded). The answer
// itself never changes once kept, so neither can its encoding.
var keptWire sync.Map // *intentv1.AcquireResponse → *keptAnswer

// keep stores r, the replay answer of the version m belongs to, in m. Two
// first replays of a version may both keep theirs: both are the same
// answer, and the loser's goes with m.
func keep(m *intent.Memo, r *intentv1.AcquireResponse) {
	keptWire.Store(r, new(keptAnswer))
	runtime.AddCleanup(m, func(r *intentv1.AcquireResponse) { keptWire.Delete(r) }, r)
	m.Store(r)
}

// keptEncoding returns the encoding of v if v is an Acquire answer: a kept
// replay answer's kept encoding (made now if none is in use), any other
// answer encoded as it was made, deterministically. So a replay that had
// to read etcd (its version not remembered, or remembered without a memo)
// sends the very bytes a replay from memory sends.
func keptEncoding(v any) (mem.BufferSlice, bool) {
	r, ok := v.(*intentv1.AcquireResponse)
	if !ok {
		return nil, false
	}
	// Deterministic, so that every replay of a version sends the same
	// bytes: a map's entries (params, labels, external refs) in key order,
	// where a plain encoding orders them at random on each call.
	opts := proto.MarshalOptions{Deterministic: true}
	if k, ok := keptWire.Load(r); ok {
		ka := k.(*keptAnswer)
		if w := ka.wire.Load(); w != nil {
			if e := w.Value(); e != nil {
				// A SliceBuffer's Free does nothing: the transport's
				// release of the message after sending leaves the kept
				// bytes as they are.
				return mem.BufferSlice{mem.SliceBuffer(e.b)}, true
			}
		}
		b, err := opts.Marshal(r)
		if err != nil {
			return nil, false // grpc-go's codec says what is wrong
		}
		w := weak.Make(&encoded{b})
		ka.wire.Store(&w)
		return mem.BufferSlice{mem.SliceBuffer(b)}, true
	}
	// As grpc-go's codec encodes: a large answer in a buffer of the
	// transport's pool, which it frees once sent.
	opts.UseCachedSize = true
	size := opts.Size(r)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(r)
		if err != nil {
			return nil, false
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

// kept reports whether r is a kept replay answer.
func kept(r *intentv1.AcquireResponse) bool {
	_, ok := keptWire.Load(r)
	return ok
}
