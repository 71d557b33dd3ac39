package archive_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/intentd/intentd/archive"
	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
)

var (
	sizeIntents    = flag.Int("archive-size-intents", 20000, "intents TestBytesPerRow archives")
	sizeTombstones = flag.Int("archive-size-tombstones", 100000, "tombstones TestBytesPerRow writes")
)

// TestBytesPerRow measures what an archived intent and a tombstone cost
// PostgreSQL: the total relation size (heap, TOAST, every index) ÷ rows,
// after a VACUUM. The intents are intentbench's: a record value of 779
// bytes (params and result of 300 random letters each, in compact
// records 2; see docs/PERFORMANCE.md, "What intentbench's intent is made
// of"), a key of 23 bytes, the default tenant, a SHA-256 fingerprint and
// two labels; the tombstones end on days spread over two years, written
// in random order of hash, as a steady state at a constant rate holds
// them.
func TestBytesPerRow(t *testing.T) {
	a, _, dsn := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	data := func() []byte {
		b := make([]byte, 779)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return b
	}
	start := now.Add(-30 * 24 * time.Hour)
	var batch []archive.Record
	for i := range *sizeIntents {
		reg := start.Add(time.Duration(i) * 100 * time.Millisecond)
		fp := sha256.Sum256(fmt.Appendf(nil, "params %d", i))
		batch = append(batch, archive.Record{
			Tenant: intent.DefaultTenant, Key: fmt.Sprintf("s-%016x-%d", r.Uint64(), i%100000),
			State: intent.StateCompleted, Fingerprint: hex.EncodeToString(fp[:]),
			Labels:       []intent.Label{{Name: "team", Value: "payments"}, {Name: "region", Value: "eu-west"}},
			RegisteredAt: reg, CompletedAt: reg.Add(time.Second), RetainUntil: reg.Add(721 * time.Hour),
			Revision: int64(i + 1), Data: data(),
		})
		if len(batch) == 1000 || i == *sizeIntents-1 {
			if err := a.Put(ctx, batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	var es []tombstones.Entry
	for i := range *sizeTombstones {
		var e tombstones.Entry
		for j := range e.Hash {
			e.Hash[j] = byte(r.IntN(256))
		}
		e.State, e.Completed = intent.StateCompleted, uint32(now.Unix())-uint32(i)
		e.UntilDay = tombstones.Today(now) + uint16(r.IntN(730)) + 1
		es = append(es, e)
		if len(es) == 5000 || i == *sizeTombstones-1 {
			if err := a.PutTombstones(ctx, es); err != nil {
				t.Fatal(err)
			}
			es = es[:0]
		}
	}
	// Every month but the last is one no new tombstone falls in: Expire
	// packs their indexes, as it does once a month in a steady state.
	xst, err := a.Expire(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("expire: %+v", xst)
	c := connect(t, dsn)
	if _, err := c.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		t.Fatal(err)
	}
	st, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var exactIntents, exactTombstones int64
	if err := c.QueryRow(ctx, "SELECT (SELECT count(*) FROM intents), (SELECT count(*) FROM tombstones)").Scan(&exactIntents, &exactTombstones); err != nil {
		t.Fatal(err)
	}
	if exactIntents != int64(*sizeIntents) || exactTombstones != int64(*sizeTombstones) {
		t.Fatalf("%d intents and %d tombstones stored, want %d and %d", exactIntents, exactTombstones, *sizeIntents, *sizeTombstones)
	}
	if st.Intents != exactIntents || st.Tombstones != exactTombstones {
		t.Errorf("Stats counts %d intents and %d tombstones after VACUUM, want %d and %d", st.Intents, st.Tombstones, exactIntents, exactTombstones)
	}
	perIntent := float64(st.IntentBytes) / float64(exactIntents)
	perTombstone := float64(st.TombstoneBytes) / float64(exactTombstones)
	t.Logf("%d intents: %d bytes, %.0f bytes per intent", exactIntents, st.IntentBytes, perIntent)
	t.Logf("%d tombstones in %d partitions: %d bytes, %.1f bytes per tombstone", exactTombstones, st.TombstonePartitions, st.TombstoneBytes, perTombstone)
	rows, err := c.Query(ctx, `SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c
WHERE c.relname LIKE 'intents%' AND c.relkind IN ('r', 'i') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		t.Logf("  %-22s %10d bytes, %6.1f per intent", name, n, float64(n)/float64(exactIntents))
	}
	var heap, idx int64
	if err := c.QueryRow(ctx, `SELECT sum(pg_relation_size(relid)), sum(pg_indexes_size(relid)) FROM pg_partition_tree('tombstones') WHERE isleaf`).Scan(&heap, &idx); err != nil {
		t.Fatal(err)
	}
	t.Logf("  tombstones: heap %.1f, indexes %.1f bytes per tombstone", float64(heap)/float64(exactTombstones), float64(idx)/float64(exactTombstones))
	// The targets (docs/PERFORMANCE.md has the measured figures).
	if perIntent > 1200 {
		t.Errorf("%.0f bytes per archived intent, want at most 1,200", perIntent)
	}
	if perTombstone > 100 {
		t.Errorf("%.1f bytes per tombstone, want at most 100", perTombstone)
	}
}
