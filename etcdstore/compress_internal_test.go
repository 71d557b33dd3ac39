package etcdstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// purchaseCompleted is a completed record with the params and result of
// internal/run/fill's purchase: JSON that compresses as params usually do
// (563 bytes, 474 stored).
func purchaseCompleted() machine.Record {
	r := typicalCompleted.stored
	r.Params = json.RawMessage(`{"currency":"EUR","item":"desk lamp, brushed steel","max_amount":"89.00","merchant":"merchant-17","quantity":2,` +
		`"ship_to":{"city":"London","country":"GB","name":"Ada Lovelace","postcode":"SW1Y 4JH","street":"12 St James's Square"},"sku":"LMP-000042"}`)
	r.Result = &intent.Result{Payload: []byte(`{"order_id":"SO-42","amount":"84.90","currency":"EUR"}`), ExternalRefs: r.Result.ExternalRefs}
	// The digests the store computes: the record leaves them out.
	fp := sha256.Sum256(r.Params)
	r.Fingerprint = hex.EncodeToString(fp[:])
	r.History = slices.Clone(r.History)
	digest := sha256.Sum256(r.Result.Payload)
	r.History[2].PayloadSHA256 = hex.EncodeToString(digest[:])
	return r
}

// encodedPurchase is purchaseCompleted and its encodeRecord.
func encodedPurchase(tb testing.TB) (machine.Record, []byte) {
	tb.Helper()
	r := purchaseCompleted()
	plain, err := encodeRecord(&r)
	if err != nil {
		tb.Fatal(err)
	}
	return r, plain
}

// TestFinalRecordsAreStoredCompressed: a final record is stored compressed
// when that saves a sixteenth of it, anything else as encodeRecord has it,
// and what is stored decodes to the record either way.
func TestFinalRecordsAreStoredCompressed(t *testing.T) {
	purchase := purchaseCompleted()
	held := purchase
	held.State, held.CompletedAt, held.RetainUntil, held.EndedToken = intent.StateInProgress, time.Time{}, time.Time{}, 0
	incompressible := purchase
	incompressible.Params = nil
	incompressible.Result = &intent.Result{Payload: make([]byte, 600)}
	if _, err := rand.Read(incompressible.Result.Payload); err != nil {
		t.Fatal(err)
	}
	type testCase struct {
		name       string
		rec        machine.Record
		compressed bool
		either     bool // a final golden case: compressed or not, by its size
	}
	oversized := purchase
	oversized.Result = &intent.Result{Payload: bytes.Repeat([]byte("x"), maxTxnBytes)}
	cases := []testCase{
		{name: "completed purchase", rec: purchase, compressed: true},
		{name: "the same purchase, held", rec: held},
		{name: "completed, random payload", rec: incompressible},
		{name: "completed, larger than a transaction", rec: oversized},
	}
	for _, tc := range recordCases {
		cases = append(cases, testCase{name: tc.name, rec: tc.stored, either: tc.stored.State.Final()})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plain, err := encodeRecord(&tc.rec)
			if err != nil {
				t.Fatal(err)
			}
			stored := storedValue(&tc.rec, plain)
			if got := stored[0] == formatCompressed; got != tc.compressed && !tc.either {
				t.Fatalf("stored compressed = %v (%d of %d bytes), want %v", got, len(stored), len(plain), tc.compressed)
			}
			if stored[0] == formatCompressed && len(stored) > len(plain)-len(plain)/16 {
				t.Errorf("stored %d bytes of %d: less than a sixteenth saved", len(stored), len(plain))
			}
			if stored[0] != formatCompressed && !bytes.Equal(stored, plain) {
				t.Errorf("stored value differs from encodeRecord's, uncompressed")
			}
			want, err := decodeRecord(tc.rec.Tenant, tc.rec.Key, plain, 1000042)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeRecord(tc.rec.Tenant, tc.rec.Key, stored, 1000042)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("stored value decodes to\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// TestCompressedRecordsKeepDecoding: the compressed value this version
// wrote for the purchase (testdata/records/completed_purchase.pb3) decodes
// to it. The file is decoded, not compared with a fresh encoding: another
// version of the compressor may choose other bytes for the same record,
// and every version must read what this one wrote.
func TestCompressedRecordsKeepDecoding(t *testing.T) {
	purchase, plain := encodedPurchase(t)
	golden := compactGolden(t, "completed_purchase", ".pb3", storedValue(&purchase, plain))
	if len(golden) == 0 || golden[0] != formatCompressed {
		t.Fatalf("completed_purchase.pb3 starts %x, want the compressed format byte %#x", golden[:min(len(golden), 1)], formatCompressed)
	}
	got, err := decodeRecord(purchase.Tenant, purchase.Key, golden, 1000042)
	if err != nil {
		t.Fatal(err)
	}
	want := withLayout(&purchase, layoutCompact)
	want.Materialize(1000042)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decodeRecord =\n%+v\nwant\n%+v", got, want)
	}
}

// TestCorruptCompressedRecordsAreCorrupt: a compressed value that does not
// decompress, or decompresses to more than a transaction can carry, is
// reported corrupt, as any unreadable value is.
func TestCorruptCompressedRecordsAreCorrupt(t *testing.T) {
	purchase, plain := encodedPurchase(t)
	stored := storedValue(&purchase, plain)
	huge := zstdEncoder.EncodeAll(make([]byte, 2*maxTxnBytes), []byte{formatCompressed})
	for name, b := range map[string][]byte{
		"truncated":    stored[:len(stored)/2],
		"not a frame":  append([]byte{formatCompressed}, "not zstd at all"...),
		"only a byte":  {formatCompressed},
		"beyond a txn": huge,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeRecord(purchase.Tenant, purchase.Key, b, 7); !errors.Is(err, errCorrupt) {
				t.Errorf("decodeRecord = %v, want errCorrupt", err)
			}
		})
	}
}

// TestCompletedRecordsReachEtcdCompressed: through the store, a completed
// intent's record is compressed in etcd (TestCompletedRecordIsCompact
// checks its size), and a replica with an empty cache reads it back as the
// one that wrote it has it.
func TestCompletedRecordsReachEtcdCompressed(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	writer, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sess, err := writer.OpenSession(ctx, "default", "fill-worker-3", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const key = "purchase-000000000042"
	if v := happyPath(t, writer, cli, key, sess.ID); v[0] != formatCompressed {
		t.Fatalf("completed record stored with format byte %#x, want %#x (compressed)", v[0], formatCompressed)
	}
	written, err := writer.Get(ctx, "default", key)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	read, err := fresh.Get(ctx, "default", key)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(read, written) {
		t.Errorf("a fresh replica reads\n%+v\nthe writer has\n%+v", read, written)
	}
	if want := `{"order_id":"SO-42","amount":"84.90","currency":"EUR"}`; string(read.Result.Payload) != want {
		t.Errorf("result payload read back = %s, want %s", read.Result.Payload, want)
	}
}

// BenchmarkFinalRecordValue: what a final record's stored value costs at
// Complete (encode and compress) and at a cache miss (decompress and
// decode), for the purchase.
func BenchmarkFinalRecordValue(b *testing.B) {
	purchase, plain := encodedPurchase(b)
	stored := storedValue(&purchase, plain)
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := encodeRecord(&purchase); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode+compress", func(b *testing.B) {
		for b.Loop() {
			p, err := encodeRecord(&purchase)
			if err != nil {
				b.Fatal(err)
			}
			storedValue(&purchase, p)
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeRecord(purchase.Tenant, purchase.Key, plain, 7); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decompress+decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeRecord(purchase.Tenant, purchase.Key, stored, 7); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decompress+decode for a replay", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeReplayRecord(purchase.Tenant, purchase.Key, stored, 7); err != nil {
				b.Fatal(err)
			}
		}
	})
}
