package etcdstore

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// describedCases are records whose registration said what they are
// (action, identity, summary), in the format this version writes: the
// fields are new to it, so no earlier format (.pb, .json) holds them.
var describedCases = []struct {
	name   string
	modRev int64
	stored machine.Record
}{
	{
		name:   "pending_described",
		modRev: 9,
		stored: machine.Record{
			Tenant: "default", Key: "3c8fd5ad0e5ec6a1c4e8be4f8b8f7ad53e7c1bb4c8a9f0a9e71f43d35b2a46c0", State: intent.StatePending,
			Params: json.RawMessage(`{"amount_cents":4000,"currency":"USD"}`), Fingerprint: "fp-refund-1",
			History:   []intent.Event{{Time: at(0), Kind: intent.EventRegistered, Accepted: true, Principal: "approver"}},
			CreatedAt: at(0), UpdatedAt: at(0), Retention: 72 * time.Hour, MaxAttempts: 5,
			Action: "refund.issue", Identity: json.RawMessage(`{"order_id":"ORD-88412","return_id":"RA-20931"}`),
			Summary: "Refund 40.00 USD to Alice for ORD-88412 \u202e(RTL)",
		},
	},
	{
		name:   "completed_described",
		modRev: 1000042,
		stored: func() machine.Record {
			r := purchaseCompleted()
			r.Action, r.Identity, r.Summary = "purchase", json.RawMessage(`{"cart":"cart-9","customer":"c-17"}`), "Buy one desk lamp for at most 89 EUR"
			return r
		}(),
	},
}

// TestDescribedRecordsKeepTheirFormat pins the stored form of described
// records both ways (encoding gives the golden bytes, the golden bytes
// decode to the record), and what a commit caches of them (asCommitted)
// is what a reader decodes. A final one is stored compressed and decodes
// the same.
func TestDescribedRecordsKeepTheirFormat(t *testing.T) {
	for _, tc := range describedCases {
		t.Run(tc.name, func(t *testing.T) {
			encoded, err := encodeRecord(&tc.stored)
			if err != nil {
				t.Fatal(err)
			}
			golden := compactGolden(t, tc.name, ".pb2", encoded)
			if !bytes.Equal(encoded, golden) {
				t.Errorf("encodeRecord =\n%x\nwant (testdata)\n%x", encoded, golden)
			}
			want := withLayout(&tc.stored, layoutCompact)
			got, err := decodeRecord(tc.stored.Tenant, tc.stored.Key, golden, tc.modRev)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("decodeRecord =\n%+v\nwant\n%+v", got, want)
			}
			if diff := readerDiff(got, asCommitted(tc.stored.Clone(), tc.modRev)); diff != "" {
				t.Errorf("asCommitted differs from decodeRecord (-decoded +asCommitted):\n%s", diff)
			}
			stored := storedValue(&tc.stored, encoded)
			if tc.stored.State.Final() && stored[0] != formatCompressed {
				t.Errorf("final record stored with format byte %#x, want compressed %#x", stored[0], formatCompressed)
			}
			if back, err := decodeRecord(tc.stored.Tenant, tc.stored.Key, stored, tc.modRev); err != nil || !reflect.DeepEqual(back, want) {
				t.Errorf("decodeRecord(storedValue) = %+v, %v; want %+v", back, err, want)
			}
		})
	}
}

// TestUndescribedRecordsDecodeWithoutDescription: every record stored
// before registrations carried an action, identity and summary, in each
// format earlier versions wrote, decodes with none, and a record without
// them is encoded in exactly the bytes this version wrote before they
// existed (the .pb2 files, which predate them).
func TestUndescribedRecordsDecodeWithoutDescription(t *testing.T) {
	for _, tc := range append(recordCases[:len(recordCases):len(recordCases)], typicalCompleted) {
		for _, ext := range []string{".json", ".pb", ".pb2"} {
			if ext == ".json" && tc.name == typicalCompleted.name {
				continue // captured after the JSON format's time
			}
			got, err := decodeRecord(tc.stored.Tenant, tc.stored.Key, readGolden(t, tc.name, ext), tc.modRev)
			if err != nil {
				t.Fatalf("%s%s: %v", tc.name, ext, err)
			}
			if got.Action != "" || got.Identity != nil || got.Summary != "" {
				t.Errorf("%s%s decodes with action %q, identity %s, summary %q; want none", tc.name, ext, got.Action, got.Identity, got.Summary)
			}
		}
		encoded, err := encodeRecord(&tc.stored)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(encoded, readGolden(t, tc.name, ".pb2")) {
			t.Errorf("%s: encodeRecord differs from the bytes written before descriptions existed", tc.name)
		}
	}
}

// The cache counts a described record's description, and a replayed one's
// memo its converted identity and texts, so that descriptions cannot grow
// the cache past its budget unseen.
func TestCacheCountsTheDescription(t *testing.T) {
	plain := describedCases[1].stored
	plain.Action, plain.Identity, plain.Summary = "", nil, ""
	described := describedCases[1].stored
	size := len(described.Action) + len(described.Identity) + len(described.Summary)
	if got := recordBytes(&described) - recordBytes(&plain); got < int64(size) {
		t.Errorf("recordBytes counts %d bytes for a description of %d", got, size)
	}
	if got := memoBytes(&described) - memoBytes(&plain); got < int64(size) {
		t.Errorf("memoBytes counts %d bytes for a description of %d", got, size)
	}
}
