package etcdstore

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// storeWithSession is a store on cli with cfg, and the session of a
// worker "w-1" on the default tenant, for a minute.
func storeWithSession(t testing.TB, cli *clientv3.Client, cfg Config) (*Store, *intent.Session) {
	t.Helper()
	s, err := New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.OpenSession(context.Background(), "default", "w-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return s, sess
}

// happyPath registers, acquires and completes one intent the way a shop's
// worker does (the fill's params, labels and result), and returns the
// record's stored value.
func happyPath(t testing.TB, s *Store, cli *clientv3.Client, key, session string) []byte {
	t.Helper()
	ctx := context.Background()
	params, err := intent.Canonical(map[string]any{
		"item": "desk lamp, brushed steel", "sku": "LMP-000042", "quantity": 2.0, "merchant": "merchant-17",
		"max_amount": "89.00", "currency": "EUR",
		"ship_to": map[string]any{"name": "Ada Lovelace", "street": "12 St James's Square", "city": "London", "postcode": "SW1Y 4JH", "country": "GB"},
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := intent.Registration{Tenant: "default", Key: key, Params: params, RequestID: "reg-" + key,
		Labels: map[string]string{"customer": "c-42", "channel": "agent"}}
	if _, _, err := s.Register(ctx, reg); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: "default", Key: key, SessionID: session, RequestID: "acq-" + key})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Report(ctx, intent.Report{Tenant: "default", Key: key, Kind: intent.ReportComplete, Token: a.Lease.Token,
		Result: &intent.Result{Payload: []byte(`{"order_id":"SO-42","amount":"84.90","currency":"EUR"}`), ExternalRefs: map[string]string{"supplier_order_id": "SO-42"}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, s.keys.intent("default", key))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading the record back: %v", err)
	}
	return resp.Kvs[0].Value
}

// TestCompletedRecordIsCompact: the record a happy path leaves is stored in
// the compact format, compressed, under a third of its JSON and within 500
// bytes (what each format takes: see docs/PERFORMANCE.md, "Record size" and
// "Compressed final records").
func TestCompletedRecordIsCompact(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	s, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.OpenSession(context.Background(), "default", "fill-worker-3", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b := happyPath(t, s, cli, "purchase-000000000042", sess.ID)
	rec, err := decodeRecord("default", "purchase-000000000042", b, 1)
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(toStored(rec))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("completed record: %d bytes stored, %d bytes as JSON", len(b), len(js))
	if len(b) == 0 || b[0] != formatCompressed {
		t.Fatalf("stored value starts %q, want the compressed format byte %#x", b[:min(len(b), 8)], formatCompressed)
	}
	if len(b) > 500 || 3*len(b) >= len(js) {
		t.Errorf("completed record: %d bytes stored, want at most 500 and under a third of its %d bytes of JSON", len(b), len(js))
	}
}

// TestJSONRecordsAreRewrittenCompactOnTheirNextWrite: a record in the JSON
// format an existing data dir holds is served as it is, and its next
// transition writes it in the compact format, history and all: data dirs
// migrate record by record, as records change, with no migration step.
func TestJSONRecordsAreRewrittenCompactOnTheirNextWrite(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	s, err := New(cli, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tc := recordCases[0] // pending
	if tc.stored.State != intent.StatePending {
		t.Fatalf("recordCases[0] is %v, want a PENDING record", tc.stored.State)
	}
	key := s.keys.intent(tc.stored.Tenant, tc.stored.Key)
	if _, err := cli.Put(ctx, key, string(readGolden(t, tc.name, ".json"))); err != nil {
		t.Fatal(err)
	}
	sess, err := s.OpenSession(ctx, tc.stored.Tenant, "w-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, intent.AcquireRequest{Tenant: tc.stored.Tenant, Key: tc.stored.Key, SessionID: sess.ID, RequestID: "r-1",
		ExpectedFingerprint: tc.stored.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	if a.Outcome != intent.OutcomeExecute {
		t.Fatalf("Acquire of the JSON record: outcome %v, want EXECUTE", a.Outcome)
	}
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if v := resp.Kvs[0].Value; v[0] != formatCompact {
		t.Fatalf("after Acquire the record starts %q, want the compact format byte %#x", v[:min(len(v), 8)], formatCompact)
	}
	in, err := s.Get(ctx, tc.stored.Tenant, tc.stored.Key)
	if err != nil {
		t.Fatal(err)
	}
	if in.State != intent.StateInProgress || in.Lease.Token != a.Lease.Token || in.Fingerprint != tc.stored.Fingerprint ||
		in.Labels["merchant"] != "M" || string(in.Params) != string(tc.stored.Params) {
		t.Errorf("Get after the rewrite = %+v, want IN_PROGRESS under token %d with the JSON record's fingerprint, params and labels", in, a.Lease.Token)
	}
	if len(in.History) != 2 || in.History[0] != tc.stored.History[0] || in.History[1].Token != a.Lease.Token {
		t.Errorf("history after the rewrite = %+v, want the JSON record's registration, then the lease under token %d", in.History, a.Lease.Token)
	}
}
