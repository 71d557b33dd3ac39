package archive_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/archive"
	"github.com/intentd/intentd/etcdstore/tombstones"
	"github.com/intentd/intentd/intent"
)

// TestQueriesUseTheirIndexes reads PostgreSQL's plans of the archive's
// queries on tables large enough for the planner to care: each is the
// index probe or walk the schema was made for, none reads a whole table.
func TestQueriesUseTheirIndexes(t *testing.T) {
	a, _, dsn := open(t)
	ctx := ctxT(t)
	var recs []archive.Record
	for i := range 20000 {
		r := rec(fmt.Sprintf("tenant-%d", i%10), fmt.Sprintf("key-%05d", i), 1, strings.Repeat("d", 700))
		r.RegisteredAt = now.Add(time.Duration(i) * time.Millisecond)
		if i%50 == 0 {
			r.State = intent.StateFailed
		}
		if i%100 == 0 {
			r.Parent = fmt.Sprintf("parent-%d", i%7)
		}
		if i%200 == 0 {
			r.Labels = []intent.Label{{Name: "rare", Value: fmt.Sprint(i % 3)}}
		}
		recs = append(recs, r)
		if len(recs) == 1000 {
			if err := a.Put(ctx, recs); err != nil {
				t.Fatal(err)
			}
			recs = recs[:0]
		}
	}
	var es []tombstones.Entry
	for i := range 100000 {
		es = append(es, tombstones.NewEntry("t", fmt.Sprint(i), intent.StateCompleted, now, now.Add(time.Duration(i%730)*24*time.Hour)))
	}
	if err := a.PutTombstones(ctx, es); err != nil {
		t.Fatal(err)
	}
	c := connect(t, dsn)
	if _, err := c.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		t.Fatal(err)
	}
	failed := intent.StateFailed
	completed := intent.StateCompleted
	after := &archive.Cursor{RegisteredAt: now.Add(10 * time.Second), Key: "key-10000"}
	list := func(q archive.Query) (string, []any) {
		q.Tenant = "tenant-3"
		sql, args, err := archive.ListSQL(q)
		if err != nil {
			t.Fatal(err)
		}
		return sql, args
	}
	type query struct {
		name string
		sql  string
		args []any
		uses []string // every one of these in the plan
	}
	queries := []query{
		{name: "Get", sql: "SELECT * FROM intents WHERE tenant = $1 AND key = $2", args: []any{"tenant-3", "key-00003"}, uses: []string{"intents_pkey"}},
		{name: "Tombstone", sql: "SELECT completed, until_day, state FROM tombstones WHERE hash = $1 ORDER BY until_day DESC LIMIT 1",
			args: []any{[16]byte(tombstones.HashOf("t", "7"))}, uses: []string{"_hash"}},
		{name: "Expire", sql: "SELECT tenant, key FROM intents WHERE retain_until <= $1 ORDER BY retain_until LIMIT 1000 FOR UPDATE SKIP LOCKED",
			args: []any{now.UnixNano()}, uses: []string{"intents_by_retention"}},
	}
	for _, c := range []struct {
		name string
		q    archive.Query
		uses string
	}{
		{"List", archive.Query{Limit: 100}, "intents_by_time"},
		{"List after a cursor", archive.Query{Limit: 100, After: after}, "intents_by_time"},
		{"List completed", archive.Query{Limit: 100, State: &completed, After: after}, "intents_by_time"},
		{"List failed", archive.Query{Limit: 100, State: &failed, After: after}, "intents_by_state"},
		{"List a parent's children", archive.Query{Limit: 100, Parent: "parent-3", After: after}, "intents_by_parent"},
		{"List a rare label", archive.Query{Limit: 100, Label: &intent.Label{Name: "rare", Value: "1"}}, "intents_by_label"},
	} {
		sql, args := list(c.q)
		queries = append(queries, query{name: c.name, sql: sql, args: args, uses: []string{c.uses}})
	}
	for _, q := range queries {
		t.Run(q.name, func(t *testing.T) {
			rows, err := c.Query(ctx, "EXPLAIN "+q.sql, q.args...)
			if err != nil {
				t.Fatal(err)
			}
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			text := strings.Join(plan, "\n")
			for _, u := range q.uses {
				if !strings.Contains(text, u) {
					t.Errorf("the plan does not use %s:\n%s", u, text)
				}
			}
			for _, line := range plan {
				// An empty partition (created ahead) costs nothing to read.
				if strings.Contains(line, "Seq Scan") && !strings.Contains(line, "cost=0.00..0.00") {
					t.Errorf("the plan reads a whole table:\n%s", text)
				}
			}
		})
	}
}
