package archive_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/archive"
	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
)

var benchIntents = flag.Int("archive-bench-intents", 20000, "intents BenchmarkLookups seeds")

// BenchmarkLookups measures one Get of an archived intent (a replay's
// read) and one Tombstone lookup (a registration that misses both tiers
// probes every month) at C = 1, against a local PostgreSQL holding 20,000
// intents (-archive-bench-intents) of intentbench's size and 200,000
// tombstones over 25 months; it reports p50 and p99.
//
//	go test -run '^$' -bench Lookups -benchtime 5000x ./archive
func BenchmarkLookups(b *testing.B) {
	a, _, _ := openB(b)
	ctx := b.Context()
	var recs []archive.Record
	n := *benchIntents
	for i := range n {
		r := rec("default", fmt.Sprintf("key-%08d", i), 1, strings.Repeat("d", 779))
		r.RegisteredAt = now.Add(time.Duration(i) * time.Millisecond)
		r.RetainUntil = r.RegisteredAt.Add(721 * time.Hour)
		recs = append(recs, r)
		if len(recs) == 10000 || i == n-1 {
			if err := a.Seed(ctx, recs); err != nil {
				b.Fatal(err)
			}
			recs = recs[:0]
		}
	}
	var es []tombstones.Entry
	for i := range 200000 {
		es = append(es, tombstones.NewEntry("default", fmt.Sprintf("gone-%d", i), intent.StateCompleted, now, now.Add(time.Duration(i%730)*24*time.Hour)))
		if len(es) == 10000 {
			if err := a.PutTombstones(ctx, es); err != nil {
				b.Fatal(err)
			}
			es = es[:0]
		}
	}
	if _, err := a.Expire(ctx, now); err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		name string
		call func() (bool, error)
	}{
		{"Get", func() (bool, error) {
			_, ok, err := a.Get(ctx, "default", fmt.Sprintf("key-%08d", r.IntN(n)))
			return ok, err
		}},
		{"Tombstone", func() (bool, error) {
			_, ok, err := a.Tombstone(ctx, "default", fmt.Sprintf("gone-%d", r.IntN(200000)))
			return ok, err
		}},
		{"Tombstone of a key never archived", func() (bool, error) {
			_, ok, err := a.Tombstone(ctx, "default", fmt.Sprintf("new-%d", r.IntN(200000)))
			return !ok, err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				ok, err := c.call()
				lat = append(lat, time.Since(start))
				if err != nil || !ok {
					b.Fatalf("%v, %v", ok, err)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
