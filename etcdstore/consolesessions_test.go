package etcdstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/intentd/intentd/etcdstore"
)

// consoleID is a session id as the console makes them: the hex SHA-256 of
// a cookie's secret.
func consoleID(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

const consolePrefix = "/intentd/v1/console/s/"

// TestConsoleSessionsAreSharedByReplicas: what one store (replica) writes,
// another reads at once; a session deleted on one is gone on the other,
// and a later Put or Refresh there does not bring it back.
func TestConsoleSessionsAreSharedByReplicas(t *testing.T) {
	c := newCluster(t)
	a, b := c.store(t).ConsoleSessions(), c.store(t).ConsoleSessions()
	id := consoleID("browser-1")
	if err := a.Create(ctx(t), id, []byte("sealed-1"), time.Minute); err != nil {
		t.Fatalf("Create: %v", err)
	}
	for _, tc := range []struct {
		name string
		do   func() (bool, error)
		want []byte // what both replicas then read; nil: gone
		ok   bool
	}{
		{"B reads A's session", func() (bool, error) { return true, nil }, []byte("sealed-1"), true},
		{"B replaces it", func() (bool, error) { return b.Put(ctx(t), id, []byte("sealed-2")) }, []byte("sealed-2"), true},
		{"A refreshes it", func() (bool, error) { return a.Refresh(ctx(t), id, []byte("sealed-3")) }, []byte("sealed-3"), true},
		{"A deletes it", func() (bool, error) { return true, a.Delete(ctx(t), id) }, nil, true},
		{"B's Put finds it gone", func() (bool, error) { return b.Put(ctx(t), id, []byte("sealed-4")) }, nil, false},
		{"B's Refresh finds it gone", func() (bool, error) { return b.Refresh(ctx(t), id, []byte("sealed-5")) }, nil, false},
		{"deleting again is no error", func() (bool, error) { return true, b.Delete(ctx(t), id) }, nil, true},
	} {
		ok, err := tc.do()
		if err != nil || ok != tc.ok {
			t.Fatalf("%s: ok %v, err %v; want ok %v", tc.name, ok, err, tc.ok)
		}
		for name, s := range map[string]*etcdstore.ConsoleSessions{"A": a, "B": b} {
			got, err := s.Get(ctx(t), id)
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Errorf("%s: %s reads %q (err %v), want %q", tc.name, name, got, err, tc.want)
			}
		}
	}
	if err := a.Create(ctx(t), consoleID("browser-2"), []byte("x"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Create(ctx(t), consoleID("browser-2"), []byte("y"), time.Minute); err == nil {
		t.Errorf("Create of a taken id succeeded")
	}
	if got, _ := a.Get(ctx(t), consoleID("browser-2")); string(got) != "x" {
		t.Errorf("a second Create replaced the session: %q", got)
	}
	if err := b.Create(ctx(t), consoleID("browser-3"), []byte("z"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Count(ctx(t)); err != nil || n != 2 {
		t.Errorf("Count: %d, %v; want 2 (one from each replica, the deleted one not)", n, err)
	}
}

// TestConsoleSessionLeases: a session lives on its etcd lease, which
// Refresh restarts; without one, etcd removes it after its ttl; Delete
// revokes the lease rather than leave it to expire.
func TestConsoleSessionLeases(t *testing.T) {
	c := newCluster(t)
	s := c.store(t).ConsoleSessions()
	const ttl = 2 * time.Second
	lease := func(id string) clientv3.LeaseID {
		t.Helper()
		resp, err := c.cli.Get(ctx(t), consolePrefix+id)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("session key %s: %v %v", id, resp, err)
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	remaining := func(l clientv3.LeaseID) int64 {
		t.Helper()
		resp, err := c.cli.TimeToLive(ctx(t), l)
		if err != nil {
			t.Fatal(err)
		}
		return resp.TTL
	}

	kept, idle := consoleID("kept"), consoleID("idle")
	for _, id := range []string{kept, idle} {
		if err := s.Create(ctx(t), id, []byte(id), ttl); err != nil {
			t.Fatal(err)
		}
	}
	if l := lease(kept); l == 0 || remaining(l) > int64(ttl/time.Second) {
		t.Fatalf("session lease %x with %ds left, want one of at most %v", l, remaining(l), ttl)
	}
	// Refreshed every second for three: past the ttl, still there.
	for range 3 {
		time.Sleep(time.Second)
		if ok, err := s.Refresh(ctx(t), kept, []byte("refreshed")); !ok || err != nil {
			t.Fatalf("Refresh: %v %v", ok, err)
		}
	}
	if got, _ := s.Get(ctx(t), kept); string(got) != "refreshed" {
		t.Errorf("refreshed session reads %q", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := s.Get(ctx(t), idle)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session without a refresh still exists 10s after its %v ttl", ttl)
		}
		time.Sleep(200 * time.Millisecond)
	}

	l := lease(kept)
	if err := s.Delete(ctx(t), kept); err != nil {
		t.Fatal(err)
	}
	if left := remaining(l); left != -1 {
		t.Errorf("the deleted session's lease has %ds left, want it revoked (-1)", left)
	}
}

// TestConsoleSessionIDsAreChecked: only what the console names sessions
// with becomes a key; nothing else is written or read.
func TestConsoleSessionIDsAreChecked(t *testing.T) {
	c := newCluster(t)
	s := c.store(t).ConsoleSessions()
	for _, id := range []string{"", "../../t/acme/i/x", strings.ToUpper(consoleID("a")), consoleID("a")[:63], consoleID("a") + "0", "g" + consoleID("a")[1:]} {
		if err := s.Create(ctx(t), id, []byte("v"), time.Minute); err == nil {
			t.Errorf("Create(%q) succeeded", id)
		}
		if _, err := s.Get(ctx(t), id); err == nil {
			t.Errorf("Get(%q) succeeded", id)
		}
		if _, err := s.Put(ctx(t), id, []byte("v")); err == nil {
			t.Errorf("Put(%q) succeeded", id)
		}
		if _, err := s.Refresh(ctx(t), id, []byte("v")); err == nil {
			t.Errorf("Refresh(%q) succeeded", id)
		}
		if err := s.Delete(ctx(t), id); err == nil {
			t.Errorf("Delete(%q) succeeded", id)
		}
	}
	resp, err := c.cli.Get(ctx(t), "/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("%d keys written (%v), want none", resp.Count, err)
	}
	// A good id is stored under the console's own prefix, its value as given.
	id := consoleID("b")
	if err := s.Create(ctx(t), id, []byte{0, 1, 2, 0xff}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := c.cli.Get(ctx(t), consolePrefix+id); err != nil || len(got.Kvs) != 1 || !bytes.Equal(got.Kvs[0].Value, []byte{0, 1, 2, 0xff}) {
		t.Errorf("key %s%s: %v %v, want the bytes given", consolePrefix, id, got, err)
	}
}
