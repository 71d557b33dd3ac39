package etcdstore

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// decodeReplayRecord gives what decodeRecord gives, less the history and
// the submissions, for every stored form of every golden case: this
// version's compact value, compressed or not, and the previous version's
// (.pb). It never changes a value it did not decompress itself.
func TestReplayDecodeIsTheRecordWithoutItsHistory(t *testing.T) {
	submitted := purchaseCompleted()
	submitted.Submissions = []intent.Submission{{Operation: "charge", ID: "sub-1", Token: 1000040, State: intent.SubmissionRecorded,
		HasLookup: true, StartedAt: at(1).UTC()}}
	cases := map[string]machine.Record{"purchase": purchaseCompleted(), "with_submissions": submitted}
	for _, tc := range append(recordCases[:len(recordCases):len(recordCases)], typicalCompleted) {
		cases[tc.name] = tc.stored
	}
	for name, r := range cases {
		plain, err := encodeRecord(&r)
		if err != nil {
			t.Fatal(err)
		}
		values := map[string][]byte{"plain": plain, "stored": storedValue(&r, plain)}
		if golden := readGoldenIfAny(t, name, ".pb"); golden != nil {
			values["previous version"] = golden
		}
		for form, v := range values {
			whole, err := decodeRecord(r.Tenant, r.Key, v, 1000042)
			if err != nil {
				t.Fatalf("%s, %s: %v", name, form, err)
			}
			before := bytes.Clone(v)
			got, err := decodeReplayRecord(r.Tenant, r.Key, v, 1000042)
			if err != nil {
				t.Fatalf("%s, %s: decodeReplayRecord: %v", name, form, err)
			}
			if !bytes.Equal(v, before) {
				t.Errorf("%s, %s: the value read changed", name, form)
			}
			want := *whole
			want.History, want.Submissions = nil, nil
			if !reflect.DeepEqual(got, &want) {
				t.Errorf("%s, %s: decodeReplayRecord =\n%+v\nwant decodeRecord's without history\n%+v", name, form, got, &want)
			}
		}
	}
}

// withoutHistory leaves out fields 13 and 28 wherever they are, keeps the
// others' bytes in their order, and hands back what does not parse.
func TestWithoutHistory(t *testing.T) {
	field := func(num protowire.Number, payload string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), payload)
	}
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	a, h, b, s := field(1, "tenant"), field(historyField, "event"), field(4, "params"), field(submissionsField, "sub")
	for _, tc := range []struct {
		name     string
		in, want []byte
	}{
		{"nothing to leave out", join(a, b), join(a, b)},
		{"history in the middle", join(a, h, h, b), join(a, b)},
		{"history first", join(h, a, b), join(a, b)},
		{"history last", join(a, b, h), join(a, b)},
		{"both, apart", join(h, a, s, b, h), join(a, b)},
		{"only history", join(h, s), []byte{}},
		{"empty", []byte{}, []byte{}},
		{"truncated", join(a, h)[:len(a)+3], join(a, h)[:len(a)+3]},
	} {
		for _, inPlace := range []bool{false, true} {
			in := bytes.Clone(tc.in)
			got := withoutHistory(in, inPlace)
			if !bytes.Equal(got, tc.want) {
				t.Errorf("%s (in place %v): %x, want %x", tc.name, inPlace, got, tc.want)
			}
			if !inPlace && !bytes.Equal(in, tc.in) {
				t.Errorf("%s: changed its input", tc.name)
			}
		}
	}
}

// readGoldenIfAny is the golden file of a case, nil for cases without one.
func readGoldenIfAny(t *testing.T, name, ext string) []byte {
	t.Helper()
	for _, tc := range append(recordCases[:len(recordCases):len(recordCases)], typicalCompleted) {
		if tc.name == name {
			return readGolden(t, name, ext)
		}
	}
	return nil
}

// BenchmarkReplayMiss is a replay of a completed intent the cache does not
// hold, as a retry sends it (with its registration), from the store's side:
// one read of the record from an etcd in the same process, its decode, the
// answer and the compact entry its memo goes to. The share of it that is
// etcd's read alone: BenchmarkReplayMiss/get.
func BenchmarkReplayMiss(b *testing.B) {
	cli := etcdtest.Start(b).Client(b)
	s, sess := storeWithSession(b, cli, DefaultConfig())
	s.KeepsAnswers()
	ctx := context.Background()
	const n = 100
	retries := make([]intent.AcquireRequest, n)
	for i := range retries {
		key := fmt.Sprintf("miss-%d", i)
		happyPath(b, s, cli, key, sess.ID)
		c, _ := s.cachedEntry("default", key)
		retries[i] = intent.AcquireRequest{Tenant: "default", Key: key, SessionID: sess.ID, RequestID: "again",
			Register: &intent.Registration{Tenant: "default", Key: key, Params: c.rec.Params, RequestID: "reg-" + key}}
	}
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := retries[i%n]
			forget(s, "default", r.Key)
			a, err := s.Acquire(ctx, r)
			if err != nil || a.Outcome != intent.OutcomeCompleted {
				b.Fatalf("%s: %+v, %v", r.Key, a, err)
			}
		}
	})
	b.Run("get", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := cli.Get(ctx, s.keys.intent("default", retries[i%n].Key)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
