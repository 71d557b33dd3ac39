package server

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
	"weak"

	"google.golang.org/grpc/mem"
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
// A handler must still return the answer as a message, for the
// interceptors that read it and for in-process callers: keptResponse
// decodes it from the kept bytes and hands the same message to every
// replay while one is in use (a weak pointer: a message nothing uses any
// more is garbage at the next collection, not a second copy held with
// the bytes). The server's codec (RequestCodec) sends a kept message as
// its kept bytes, without encoding it again (keptEncoding).

// kept is what a memo keeps of a replay answer: its encoding, and the
// decoded message while something uses it.
type kept struct {
	wire   []byte
	answer atomic.Pointer[weak.Pointer[intentv1.AcquireResponse]]
}

// keptMessage is a message decoded from kept bytes, by its address: the
// codec's way back from a message to its bytes (keptBytes). It does not
// keep the message alive: a cleanup removes it once the message is
// garbage, and the weak pointer tells a message from a later one that
// took its address before the cleanup ran.
type keptMessage struct {
	msg  weak.Pointer[intentv1.AcquireResponse]
	wire []byte
}

var keptWire sync.Map // uintptr (a message's address) → *keptMessage

// keep stores r, the replay answer of the version m belongs to, in m as
// its encoding. Two first replays of a version may both keep theirs: both
// are the same answer, to the byte.
func keep(m *intent.Memo, r *intentv1.AcquireResponse) {
	// Deterministic, so that every replay of the version sends the same
	// bytes: a map's entries (params, labels, external refs) are in key
	// order, where a plain encoding orders them at random on each call.
	wire, err := (proto.MarshalOptions{Deterministic: true}).Marshal(r)
	if err != nil {
		return // answered as made; the next replay tries again
	}
	k := &kept{wire: wire}
	k.hold(r)
	m.Store(k)
}

// keptResponse is the replay answer kept in m, if any: the message in use
// by another replay, or one decoded from the kept bytes.
func keptResponse(m *intent.Memo) (*intentv1.AcquireResponse, bool) {
	k, ok := m.Load().(*kept)
	if !ok {
		return nil, false
	}
	if p := k.answer.Load(); p != nil {
		if r := p.Value(); r != nil {
			return r, true
		}
	}
	r := new(intentv1.AcquireResponse)
	if err := proto.Unmarshal(k.wire, r); err != nil {
		return nil, false // cannot happen: the bytes are an encoding of one
	}
	k.hold(r)
	return r, true
}

// hold makes r the message of k's bytes: shared by the replays while in
// use, and sent as those bytes.
func (k *kept) hold(r *intentv1.AcquireResponse) {
	w := weak.Make(r)
	km := &keptMessage{msg: w, wire: k.wire}
	addr := uintptr(unsafe.Pointer(r))
	keptWire.Store(addr, km)
	runtime.AddCleanup(r, func(addr uintptr) { keptWire.CompareAndDelete(addr, km) }, addr)
	k.answer.Store(&w)
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
	v, ok := keptWire.Load(uintptr(unsafe.Pointer(r)))
	if !ok {
		return nil, false
	}
	km := v.(*keptMessage)
	if km.msg.Value() != r {
		return nil, false // an earlier message's, at the same address
	}
	return km.wire, true
}

// HeapBytes is the heap k holds for as long as its memo: the bytes, its
// struct and the weak pointer's box (a store counts it: see etcdstore,
// "cache.go"). A message decoded from the bytes is held only while a
// replay uses it.
func (k *kept) HeapBytes() int64 {
	return int64(cap(k.wire)) + int64(unsafe.Sizeof(*k)) + int64(unsafe.Sizeof(weak.Pointer[intentv1.AcquireResponse]{}))
}
