package server

import (
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// A replay's answer depends on its version of the final record alone, so
// it is made once per version and kept in the version's memo
// (intent.Memo) as its encoding: the bytes every replay of that version
// sends, and all the memo holds for as long as the store remembers the
// version (the store counts them; see etcdstore, "cache.go").
//
// A handler must still return the answer as a message. A replay's message
// is a stand-in (kept.response): its outcome decoded, because the
// interceptors that count answers read it, and every other field carried
// as the kept bytes it was encoded to, in the message's unknown fields.
// Encoding the stand-in writes its outcome and then those bytes, which is
// the kept encoding to the byte (known fields go first, in field-number
// order, and the outcome is field 1), so the answer on the wire is the
// full one; but a caller in the same process that reads the stand-in's
// intent, lease or statement finds them empty. Decoding the whole answer
// from the bytes on each replay, as intentd did before, was 11 % of its
// CPU when it replayed 10,000 intents (docs/PERFORMANCE.md, "Replays
// beyond the cache").

// kept is what a memo keeps of a replay answer: its encoding, and the
// outcome read from the encoding's first field.
type kept struct {
	wire    []byte
	outcome intentv1.Outcome
	head    int // the outcome field's bytes at the start of wire
}

// keep stores r, the replay answer of the version m belongs to, in m as
// its encoding, and returns what the memo keeps. Two first replays of a
// version may both keep theirs: both are the same answer, to the byte.
func keep(m *intent.Memo, r *intentv1.AcquireResponse) (*kept, bool) {
	// Deterministic, so that every replay of the version sends the same
	// bytes: a map's entries (params, labels, external refs) are in key
	// order, where a plain encoding orders them at random on each call.
	wire, err := (proto.MarshalOptions{Deterministic: true}).Marshal(r)
	if err != nil {
		return nil, false // answered as made; the next replay tries again
	}
	k := &kept{wire: wire}
	if num, typ, n := protowire.ConsumeTag(wire); num == outcomeField && typ == protowire.VarintType {
		v, m := protowire.ConsumeVarint(wire[n:])
		if m < 0 {
			return nil, false // cannot happen: the bytes are an encoding of r
		}
		k.outcome, k.head = intentv1.Outcome(v), n+m
	}
	m.Store(k)
	return k, true
}

// outcomeField is AcquireResponse.outcome's number.
const outcomeField = 1

// keptResponse is a stand-in for the replay answer kept in m, if any.
func keptResponse(m *intent.Memo) (*intentv1.AcquireResponse, bool) {
	k, ok := m.Load().(*kept)
	if !ok {
		return nil, false
	}
	return k.response(), true
}

// response is a stand-in for k's answer: its outcome, and the rest of its
// encoding as unknown fields. The stand-in shares the kept bytes (capped,
// so that nothing appended to its unknown fields can reach them); nothing
// may modify it.
func (k *kept) response() *intentv1.AcquireResponse {
	r := &intentv1.AcquireResponse{Outcome: k.outcome}
	r.ProtoReflect().SetUnknown(k.wire[k.head:len(k.wire):len(k.wire)])
	return r
}

// keptEncoding returns the encoding of v if v is an Acquire answer,
// deterministic: a stand-in for a kept replay answer encodes to the kept
// bytes, and any other answer as the replay that kept it did. So a replay
// that had to read etcd (its version not remembered, or remembered without
// a memo) sends the very bytes a replay from memory sends.
func keptEncoding(v any) (mem.BufferSlice, bool) {
	r, ok := v.(*intentv1.AcquireResponse)
	if !ok {
		return nil, false
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

// HeapBytes is the heap k holds for as long as its memo: the bytes and
// its struct (a store counts it: see etcdstore, "cache.go").
func (k *kept) HeapBytes() int64 {
	return int64(cap(k.wire)) + int64(unsafe.Sizeof(*k))
}
