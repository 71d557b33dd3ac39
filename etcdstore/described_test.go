package etcdstore_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/intentd/intentd/etcdstore"
	"github.com/intentd/intentd/intent"
)

// description is what a registration says an intent is.
type description struct {
	action   string
	identity json.RawMessage
	summary  string
}

func descriptionOf(in *intent.Intent) description {
	return description{in.Action, in.Identity, in.Summary}
}

func (d description) equal(o description) bool {
	return d.action == o.action && bytes.Equal(d.identity, o.identity) && d.summary == o.summary
}

// described is lamp registered with d.
func described(t *testing.T, key string, d description) intent.Registration {
	t.Helper()
	reg := lamp(t, key, 1)
	reg.Action, reg.Identity, reg.Summary = d.action, d.identity, d.summary
	reg.Labels = map[string]string{"run": "described"}
	return reg
}

// TestDescriptionRoundTrips: the action, identity and summary a
// registration carries are stored with the intent and come back on every
// read, in every state, from the replica that wrote them and from one that
// reads etcd afresh (another Store: its own caches), including the final
// record, stored compressed, and its replay from memory; children
// registered by a completion keep theirs.
func TestDescriptionRoundTrips(t *testing.T) {
	c := newCluster(t)
	s, other := c.store(t), c.store(t)
	d := description{"refund.issue", json.RawMessage(`{"order_id":"ORD-88412","return_id":"RA-20931"}`), "Refund 40.00 USD to Alice for ORD-88412"}
	child := description{"notify.customer", json.RawMessage(`{"order_id":"ORD-88412","template":"refund-issued"}`), "Tell Alice her refund is on its way"}
	check := func(what string, in *intent.Intent, want description) {
		t.Helper()
		if got := descriptionOf(in); !got.equal(want) {
			t.Errorf("%s: action %q, identity %s, summary %q; want %q, %s, %q", what, got.action, got.identity, got.summary, want.action, want.identity, want.summary)
		}
	}
	checkEverywhere := func(state string) {
		t.Helper()
		check(state+": Get", get(t, s, "refund-1"), d)
		check(state+": Get on another replica", get(t, other, "refund-1"), d)
		page, err := other.List(ctx(t), intent.ListQuery{Filter: intent.Filter{Tenant: "default", Label: &intent.Label{Name: "run", Value: "described"}}})
		if err != nil || len(page.Intents) != 1 {
			t.Fatalf("%s: List: %v, %v", state, page, err)
		}
		check(state+": List", page.Intents[0], d)
		evs := watchUntil(t, other, intent.WatchQuery{Key: "refund-1", StartRevision: page.Revision}, func(intent.WatchEvent) bool { return true })
		check(state+": Watch", evs[0].Intent, d)
	}

	in, created, err := s.Register(ctx(t), described(t, "refund-1", d))
	if err != nil || !created {
		t.Fatalf("Register: %v, created %v", err, created)
	}
	check("Register", in, d)
	checkEverywhere("pending")

	sess := openSession(t, s, "w-1", 0)
	a := acquire(t, s, "refund-1", sess)
	mustOutcome(t, a, intent.OutcomeExecute)
	check("Acquire", a.Intent, d)
	checkEverywhere("in progress")

	r := complete("refund-1", a.Lease.Token, "RF-1")
	notify := described(t, "refund-1-notify", child)
	notify.Labels, notify.ParentKey = nil, "refund-1"
	r.Children = []intent.Registration{notify}
	out, err := report(t, s, r)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	check("Complete", out.Intent, d)
	checkEverywhere("completed")
	check("the child", get(t, other, "refund-1-notify"), child)

	// Final: replayed from the writer's memory, and read from etcd (where
	// it is compressed) by the other replica, then from its memory.
	for _, replica := range []struct {
		name string
		sess string
		s    *etcdstore.Store
	}{{"writer", sess, s}, {"other replica", openSession(t, other, "w-2", 0), other}} {
		for range 2 {
			a, err := replica.s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "refund-1", SessionID: replica.sess, RequestID: "replay"})
			if err != nil {
				t.Fatal(err)
			}
			mustOutcome(t, a, intent.OutcomeCompleted)
			check("replay by the "+replica.name, a.Intent, d)
		}
	}
}

// TestRegisteringAgainKeepsTheFirstDescription: a description is not part
// of the fingerprint. Registering an existing intent again, by Register or
// by Acquire's registration, with the same params and another description
// (or none), answers the intent as first registered and changes nothing.
func TestRegisteringAgainKeepsTheFirstDescription(t *testing.T) {
	c := newCluster(t)
	s := c.store(t)
	first := description{"refund.issue", json.RawMessage(`{"order_id":"ORD-1"}`), "Refund 40.00 USD to Alice"}
	in := register(t, s, described(t, "refund-2", first))
	for _, again := range []description{
		{"refund.issue", json.RawMessage(`{"order_id":"ORD-1"}`), "Refund 4000.00 USD to Mallory"},
		{},
		{"refund.reverse", json.RawMessage(`{"order_id":"ORD-2"}`), ""},
	} {
		got, created, err := s.Register(ctx(t), described(t, "refund-2", again))
		if err != nil || created {
			t.Fatalf("Register again with %+v: created %v, %v", again, created, err)
		}
		if !descriptionOf(got).equal(first) || got.Revision != in.Revision {
			t.Errorf("Register again with %+v: %+v at revision %d, want the first %+v at %d", again, descriptionOf(got), got.Revision, first, in.Revision)
		}
	}
	reg := described(t, "refund-2", description{"other", json.RawMessage(`{"x":1}`), "other"})
	a, err := s.Acquire(ctx(t), intent.AcquireRequest{Tenant: "default", Key: "refund-2", SessionID: openSession(t, s, "w", 0), RequestID: "r", Register: &reg})
	if err != nil {
		t.Fatal(err)
	}
	mustOutcome(t, a, intent.OutcomeExecute)
	if !descriptionOf(a.Intent).equal(first) {
		t.Errorf("Acquire registering again: %+v, want the first %+v", descriptionOf(a.Intent), first)
	}
	if got := get(t, c.store(t), "refund-2"); !descriptionOf(got).equal(first) {
		t.Errorf("Get from etcd: %+v, want the first %+v", descriptionOf(got), first)
	}
}
