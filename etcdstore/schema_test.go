package etcdstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/etcdtest"
	"github.com/intentd/intentd/internal/machine"
)

// updateGolden rewrites testdata/records from the cases below. The files
// were captured once from the format intentd has always written; rewriting
// them is only right together with a migration of existing data dirs.
var updateGolden = flag.Bool("update-golden", false, "rewrite etcdstore/testdata/records (only with a storage migration)")

func at(minute int) time.Time {
	return time.Date(2026, 3, 1, 10, minute, 0, 123456789, time.UTC)
}

// recordCases are stored records covering every state, a lease issued by
// the very version (token stored as 0) and an older one, results with
// external refs, failures, parent and children, history entries of every
// kind, attempts, limits and retention. modRev is the version's mod
// revision; want is the record decodeRecord must give back (the stored one
// unless the lease's token is materialized from modRev).
var recordCases = []struct {
	name   string
	modRev int64
	stored machine.Record
	want   *machine.Record
}{
	{
		name:   "pending",
		modRev: 7,
		stored: machine.Record{
			Tenant: "default", Key: "order-1", State: intent.StatePending,
			Params: json.RawMessage(`{"item":"desk lamp","quantity":1}`), ParamsVersion: "v2",
			Fingerprint: "fp-order-1", Labels: map[string]string{"merchant": "M", "team": "shop"},
			History:   []intent.Event{{Time: at(0), Kind: intent.EventRegistered, Accepted: true, Principal: "approver", Reason: "approved"}},
			CreatedAt: at(0), UpdatedAt: at(0), Retention: 72 * time.Hour, MaxAttempts: 5,
		},
	},
	{
		name:   "in_progress_issued_by_this_version",
		modRev: 42,
		stored: machine.Record{
			Tenant: "default", Key: "order-2", State: intent.StateInProgress,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-order-2",
			Lease: &machine.Lease{Mode: intent.ModeExecute, SessionID: "s-1", SessionRev: 40, Worker: "w-1", RequestID: "req-1", AcquiredAt: at(1)},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventAcquired, Mode: intent.ModeExecute, SessionID: "s-1", Worker: "w-1", Accepted: true, RequestID: "req-1", Issued: true},
			},
			CreatedAt: at(0), UpdatedAt: at(1), Retention: time.Hour, MaxAttempts: 3,
		},
		want: &machine.Record{
			Tenant: "default", Key: "order-2", State: intent.StateInProgress,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-order-2",
			Lease: &machine.Lease{Token: 42, Mode: intent.ModeExecute, SessionID: "s-1", SessionRev: 40, Worker: "w-1", RequestID: "req-1", AcquiredAt: at(1)},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventAcquired, Token: 42, Mode: intent.ModeExecute, SessionID: "s-1", Worker: "w-1", Accepted: true, RequestID: "req-1", Issued: true},
			},
			CreatedAt: at(0), UpdatedAt: at(1), Retention: time.Hour, MaxAttempts: 3,
		},
	},
	{
		name:   "in_progress_reconcile_with_evidence",
		modRev: 60,
		stored: machine.Record{
			Tenant: "acme", Key: "order-3", State: intent.StateInProgress,
			Params: json.RawMessage(`{"n":3}`), Fingerprint: "fp-order-3",
			Lease: &machine.Lease{Token: 55, Mode: intent.ModeReconcile, SessionID: "s-2", SessionRev: 50, Worker: "w-2", AcquiredAt: at(5)},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventAcquired, Token: 20, Mode: intent.ModeExecute, SessionID: "s-1", Worker: "w-1", Accepted: true, Issued: true},
				{Time: at(2), Kind: intent.EventHeartbeat, Token: 20, SessionID: "s-1", Accepted: true},
				{Time: at(3), Kind: intent.EventLeaseLapsed, Token: 20, SessionID: "s-1", Accepted: true},
				{Time: at(5), Kind: intent.EventAcquired, Token: 55, Mode: intent.ModeReconcile, SessionID: "s-2", Worker: "w-2", Accepted: true, Issued: true},
				{Time: at(6), Kind: intent.EventCompleted, Token: 20, Accepted: false,
					Result: &intent.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-9"}}, PayloadSHA256: "5d41402abc4b2a76b9719d911017c592"},
			},
			CreatedAt: at(0), UpdatedAt: at(6), Retention: time.Hour, MaxAttempts: 4, Attempts: 1, EndedToken: 20,
		},
	},
	{
		name:   "unknown",
		modRev: 80,
		stored: machine.Record{
			Tenant: "default", Key: "order-4", State: intent.StateUnknown,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-order-4",
			Lease: &machine.Lease{Token: 70, Mode: intent.ModeExecute, SessionID: "s-3", SessionRev: 66, Worker: "w-3", AcquiredAt: at(1)},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventAcquired, Token: 70, Mode: intent.ModeExecute, SessionID: "s-3", Worker: "w-3", Accepted: true, Issued: true},
				{Time: at(2), Kind: intent.EventMarkedUnknown, Token: 70, Accepted: true, Reason: "supplier timed out"},
			},
			CreatedAt: at(0), UpdatedAt: at(2), Retention: time.Hour, MaxAttempts: 3, Attempts: 1, EndedToken: 70,
		},
	},
	{
		name:   "completed_parent_with_child",
		modRev: 99,
		stored: machine.Record{
			Tenant: "default", Key: "order-5", State: intent.StateCompleted,
			Params: json.RawMessage(`{"item":"chair"}`), Fingerprint: "fp-order-5", Labels: map[string]string{"merchant": "M"},
			Lease:  &machine.Lease{Token: 90, Mode: intent.ModeExecute, SessionID: "s-4", SessionRev: 88, Worker: "w-4", AcquiredAt: at(1)},
			Result: &intent.Result{Payload: []byte(`{"order":"SO-1"}`), ExternalRefs: map[string]string{"supplier_order_id": "SO-1", "invoice": "INV-7"}},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventAcquired, Token: 90, Mode: intent.ModeExecute, SessionID: "s-4", Worker: "w-4", Accepted: true, Issued: true},
				{Time: at(2), Kind: intent.EventReleased, Token: 90, Accepted: false, Reason: "late release"},
				{Time: at(3), Kind: intent.EventCompleted, Token: 90, Accepted: true,
					Result: &intent.Result{ExternalRefs: map[string]string{"supplier_order_id": "SO-1", "invoice": "INV-7"}}, PayloadSHA256: "0f1e2d"},
				{Time: at(3), Kind: intent.EventChildRegistered, Accepted: true, Reason: "order-5/ship"},
			},
			CreatedAt: at(0), UpdatedAt: at(3), CompletedAt: at(3), Retention: 24 * time.Hour, RetainUntil: at(3).Add(24 * time.Hour),
			MaxAttempts: 3, EndedToken: 90,
		},
	},
	{
		name:   "pending_child",
		modRev: 99,
		stored: machine.Record{
			Tenant: "default", Key: "order-5/ship", State: intent.StatePending,
			Params: json.RawMessage(`{"carrier":"X"}`), Fingerprint: "fp-ship", ParentKey: "order-5",
			History:   []intent.Event{{Time: at(3), Kind: intent.EventRegistered, Accepted: true, Reason: "registered by the completion of order-5"}},
			CreatedAt: at(3), UpdatedAt: at(3), Retention: 24 * time.Hour, MaxAttempts: 3,
		},
	},
	{
		name:   "failed",
		modRev: 120,
		stored: machine.Record{
			Tenant: "default", Key: "order-6", State: intent.StateFailed,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-order-6",
			Lease:   &machine.Lease{Token: 110, Mode: intent.ModeExecute, SessionID: "s-5", SessionRev: 100, AcquiredAt: at(1)},
			Failure: &intent.Failure{Code: "OUT_OF_STOCK", Message: "no lamps left"},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventAcquired, Token: 110, Mode: intent.ModeExecute, SessionID: "s-5", Accepted: true, Issued: true},
				{Time: at(2), Kind: intent.EventFailed, Token: 110, Accepted: true, Failure: &intent.Failure{Code: "OUT_OF_STOCK", Message: "no lamps left"}},
			},
			CreatedAt: at(0), UpdatedAt: at(2), CompletedAt: at(2), Retention: time.Hour, RetainUntil: at(2).Add(time.Hour),
			MaxAttempts: 3, EndedToken: 110,
		},
	},
	{
		name:   "needs_review_escalated",
		modRev: 140,
		stored: machine.Record{
			Tenant: "default", Key: "order-7", State: intent.StateNeedsReview,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-order-7",
			Lease: &machine.Lease{Token: 130, Mode: intent.ModeReview, Worker: "alice", AcquiredAt: at(4)},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventAcquired, Token: 125, Mode: intent.ModeExecute, SessionID: "s-6", Accepted: true, Issued: true},
				{Time: at(2), Kind: intent.EventLeaseLapsed, Token: 125, SessionID: "s-6", Accepted: true},
				{Time: at(4), Kind: intent.EventEscalated, Token: 130, Mode: intent.ModeReview, Worker: "alice", Accepted: true, Reason: "too many attempts", Principal: "alice@example.com", Issued: true},
			},
			CreatedAt: at(0), UpdatedAt: at(4), Retention: time.Hour, MaxAttempts: 2, Attempts: 2, EndedToken: 125,
		},
	},
	{
		name:   "completed_by_review",
		modRev: 160,
		stored: machine.Record{
			Tenant: "default", Key: "order-8", State: intent.StateCompleted,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-order-8",
			Lease:  &machine.Lease{Token: 150, Mode: intent.ModeReview, Worker: "bob", AcquiredAt: at(5)},
			Result: &intent.Result{Payload: []byte(`"done by hand"`)},
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(5), Kind: intent.EventResolved, Token: 150, Mode: intent.ModeReview, Worker: "bob", Accepted: true, Result: &intent.Result{}, PayloadSHA256: "abcd",
					Reason: "checked with supplier", Principal: "bob@example.com", ResolvedState: intent.StateCompleted, RequestID: "rq-9", Issued: true},
			},
			CreatedAt: at(0), UpdatedAt: at(5), CompletedAt: at(5), Retention: time.Hour, RetainUntil: at(5).Add(time.Hour), MaxAttempts: 3,
		},
	},
	{
		name:   "cancelled",
		modRev: 170,
		stored: machine.Record{
			Tenant: "default", Key: "order-9", State: intent.StateCancelled,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-order-9",
			History: []intent.Event{
				{Time: at(0), Kind: intent.EventRegistered, Accepted: true},
				{Time: at(1), Kind: intent.EventCancelled, Accepted: true, Reason: "customer withdrew", Principal: "carol"},
			},
			CreatedAt: at(0), UpdatedAt: at(1), CompletedAt: at(1), Retention: time.Hour, RetainUntil: at(1).Add(time.Hour), MaxAttempts: 3,
		},
	},
	{
		// Stored before intentd had an attempts limit: no max_attempts.
		name:   "pending_without_attempts_limit",
		modRev: 3,
		stored: machine.Record{
			Tenant: "default", Key: "old", State: intent.StatePending,
			Params: json.RawMessage(`{}`), Fingerprint: "fp-old",
			History:   []intent.Event{{Time: at(0), Kind: intent.EventRegistered, Accepted: true}},
			CreatedAt: at(0), UpdatedAt: at(0), Retention: time.Hour,
		},
	},
}

var tombstoneCases = []struct {
	name string
	tomb machine.Tombstone
}{
	{"tombstone_completed", machine.Tombstone{Key: "order-5", State: intent.StateCompleted, Fingerprint: "fp-order-5", CompletedAt: at(3), RemovedAt: at(50), Until: at(59)}},
	{"tombstone_without_completion", machine.Tombstone{Key: "old", State: intent.StateCancelled, Fingerprint: "fp-old", RemovedAt: at(50), Until: at(59)}},
}

var sessionCases = []struct {
	name string
	sess sessionRecord
}{
	{"session", sessionRecord{Worker: "w-1", TTL: 30 * time.Second}},
}

func goldenPath(name string) string { return filepath.Join("testdata", "records", name+".json") }

// goldenFile is the stored value of a case, rewritten first from encoded
// under -update-golden.
func goldenFile(t *testing.T, name string, encoded []byte) []byte {
	t.Helper()
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(goldenPath(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenPath(name), encoded, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return readGolden(t, name)
}

func readGolden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(goldenPath(name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStoredRecordsKeepTheirFormat decodes records in the format intentd
// has always written (an existing data dir, or a replica of the other
// version during a rolling upgrade) and checks both directions: the
// decoded values, and that encoding gives back the stored bytes exactly.
func TestStoredRecordsKeepTheirFormat(t *testing.T) {
	for _, tc := range recordCases {
		t.Run(tc.name, func(t *testing.T) {
			encoded, err := encodeRecord(&tc.stored)
			if err != nil {
				t.Fatal(err)
			}
			golden := goldenFile(t, tc.name, encoded)
			if !bytes.Equal(encoded, golden) {
				t.Errorf("encodeRecord =\n%s\nwant (testdata)\n%s", encoded, golden)
			}
			got, err := decodeRecord(golden, tc.modRev)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == nil {
				want = &tc.stored
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("decodeRecord =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
	for _, tc := range tombstoneCases {
		t.Run(tc.name, func(t *testing.T) {
			encoded, err := encodeTombstone(&tc.tomb)
			if err != nil {
				t.Fatal(err)
			}
			golden := goldenFile(t, tc.name, encoded)
			if !bytes.Equal(encoded, golden) {
				t.Errorf("encodeTombstone =\n%s\nwant (testdata)\n%s", encoded, golden)
			}
			got, err := decodeTombstone(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.tomb) {
				t.Errorf("decodeTombstone = %+v, want %+v", *got, tc.tomb)
			}
		})
	}
	for _, tc := range sessionCases {
		t.Run(tc.name, func(t *testing.T) {
			encoded, err := encodeSession(tc.sess)
			if err != nil {
				t.Fatal(err)
			}
			golden := goldenFile(t, tc.name, encoded)
			if !bytes.Equal(encoded, golden) {
				t.Errorf("encodeSession =\n%s\nwant (testdata)\n%s", encoded, golden)
			}
			got, err := decodeSession(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.sess {
				t.Errorf("decodeSession = %+v, want %+v", got, tc.sess)
			}
		})
	}
}

// BenchmarkRecordCodec is the cost of writing and reading one record of a
// happy path's size, without etcd.
func BenchmarkRecordCodec(b *testing.B) {
	rec := &recordCases[4].stored
	for b.Loop() {
		enc, err := encodeRecord(rec)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := decodeRecord(enc, 99); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStorageSchemaRoundTrip: fromStored undoes toStored for every case,
// nil and empty parts included, so the two conversions lose nothing.
func TestStorageSchemaRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		rec  machine.Record
	}{
		{"zero", machine.Record{}},
		{"empty history", machine.Record{Key: "k", History: []intent.Event{}}},
		{"empty result in an event", machine.Record{Key: "k", History: []intent.Event{{Kind: intent.EventResolved, Result: &intent.Result{}, Failure: &intent.Failure{}}}}},
	}
	for _, tc := range recordCases {
		cases = append(cases, struct {
			name string
			rec  machine.Record
		}{tc.name, tc.stored})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromStored(toStored(&tc.rec)); !reflect.DeepEqual(got, &tc.rec) {
				t.Errorf("fromStored(toStored(r)) =\n%+v\nwant\n%+v", got, &tc.rec)
			}
		})
	}
}

// TestStoredRecordsServeFromEtcd: records and tombstones in the stored
// format, put into etcd as an existing data dir holds them, are what the
// store's Get answers.
func TestStoredRecordsServeFromEtcd(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	s, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range recordCases {
		t.Run(tc.name, func(t *testing.T) {
			golden := readGolden(t, tc.name)
			resp, err := cli.Put(ctx, s.keys.intent(tc.stored.Tenant, tc.stored.Key), string(golden))
			if err != nil {
				t.Fatal(err)
			}
			rev := resp.Header.Revision
			got, err := s.Get(ctx, tc.stored.Tenant, tc.stored.Key)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.stored.Clone()
			if l := want.Lease; l != nil && l.Token == 0 { // issued by the version just put
				l.Token = fencing.Token(rev)
				for i := range want.History {
					if want.History[i].Issued && want.History[i].Token == 0 {
						want.History[i].Token = l.Token
					}
				}
			}
			// No session key exists: an IN_PROGRESS record reads as lapsed.
			if w := want.ToIntentWithHistory(rev, machine.HolderGone); !reflect.DeepEqual(got, w) {
				t.Errorf("Get =\n%+v\nwant\n%+v", got, w)
			}
		})
	}
	for _, tc := range tombstoneCases {
		t.Run(tc.name, func(t *testing.T) {
			golden := readGolden(t, tc.name)
			if _, err := cli.Put(ctx, s.keys.tombstone("removed", tc.tomb.Key), string(golden)); err != nil {
				t.Fatal(err)
			}
			_, err := s.Get(ctx, "removed", tc.tomb.Key)
			var expired *intent.ExpiredError
			if !errors.As(err, &expired) {
				t.Fatalf("Get error = %v, want an ExpiredError", err)
			}
			want := intent.ExpiredError{Key: tc.tomb.Key, State: tc.tomb.State, Fingerprint: tc.tomb.Fingerprint, CompletedAt: tc.tomb.CompletedAt}
			if *expired != want {
				t.Errorf("Get error = %+v, want %+v", *expired, want)
			}
		})
	}
}
