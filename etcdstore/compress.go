package etcdstore

import (
	"errors"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/intentd/intentd/internal/core/machine"
)

// Final records are what the store keeps longest (their retention, 30 days
// by default) and reads least (replays are mostly served from the cache), so
// they are the ones worth storing small: a final record's value goes to
// etcd compressed, as formatCompressed, when that saves at least a
// sixteenth of it. Params and results are mostly JSON, which compresses
// for a few microseconds at Complete and at a cache miss
// (BenchmarkFinalRecordValue; what it saves and costs: see
// docs/PERFORMANCE.md, "Compressed final records"); random text or payloads
// compressed already gain nothing and are stored as they are. Records still in flight are written as they are: their
// values are replaced within seconds, and compressing them would cost
// every Acquire.
//
// zstd at its fastest level, without a checksum (etcd keeps the value
// intact, and a damaged frame fails to decode all the same), from one
// encoder and one decoder that every call shares (their EncodeAll and
// DecodeAll are safe for concurrent use). The frames are zstd's standard
// format, which every later version of the library decodes, whatever
// bytes its encoder would choose: the golden .pb3 file is decoded, never
// compared with a fresh encoding.

// minCompressed is the smallest value worth trying: below it, a frame's
// header and zstd's literal tables leave no sixteenth to save.
const minCompressed = 128

var (
	zstdEncoder = must(zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderCRC(false),
		zstd.WithLowerEncoderMem(true),
		zstd.WithWindowSize(maxTxnBytes)))
	// zstdDecoder refuses to decode more than a transaction can carry: no
	// record is larger, so a frame that claims more is corrupt.
	zstdDecoder = must(zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxMemory(maxTxnBytes)))
)

func must[T any](v T, err error) T {
	if err != nil {
		panic("etcdstore: " + err.Error())
	}
	return v
}

// storedValue is what goes to etcd for r, whose encodeRecord is plain:
// plain itself, or, for a final record, plain compressed if that is at
// least a sixteenth smaller. A record larger than a transaction can carry
// stays plain, to be refused as too large as it would be uncompressed:
// compressed, it could be written, and then not read back within the
// decoder's bound.
func storedValue(r *machine.Record, plain []byte) []byte {
	if !r.State.Final() || len(plain) < minCompressed || len(plain) > maxTxnBytes {
		return plain
	}
	most := len(plain) - len(plain)/16
	out := make([]byte, 1, most)
	out[0] = formatCompressed
	out = zstdEncoder.EncodeAll(plain[1:], out)
	if len(out) > most {
		return plain
	}
	return out
}

// errEmptyFrame is a compressed value that holds nothing: no record is
// stored as one.
var errEmptyFrame = errors.New("compressed value holds no record")

// decompressRecord appends to dst[:0] the plain (formatCompact) value of
// b, a compressed one.
func decompressRecord(dst, b []byte) ([]byte, error) {
	out := append(dst[:0], formatCompact)
	out, err := zstdDecoder.DecodeAll(b[1:], out)
	if err == nil && len(out) == 1 {
		err = errEmptyFrame
	}
	return out, err
}

// plainBuffers holds the buffers compressed records are decoded into. A
// decoded record keeps nothing of its plain value (proto.Unmarshal copies
// what it reads), so the buffer goes back once the record is decoded:
// allocating it was a seventh of what a replay that missed the cache
// allocated in intentd's own code.
var plainBuffers = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledPlain is the largest buffer kept for reuse: a rare large record
// is not worth keeping its buffer for the many small ones.
const maxPooledPlain = 64 << 10

func putPlainBuffer(b *[]byte) {
	if cap(*b) <= maxPooledPlain {
		plainBuffers.Put(b)
	}
}
