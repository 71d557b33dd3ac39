package etcdstore_test

import (
	"testing"

	"github.com/intentd/intentd/etcdstore"
)

// Regression (found by the reliability suite, TestEtcdRepliesLost and the
// soak): a Register whose etcd write committed but whose reply was lost
// read back, found the record and answered created=false, as if another
// approver had registered it. The read-back now knows its own write by the
// request id; another approver's registration of the same intent still
// answers created=false.
func TestRegisterReplyLostStillReportsCreated(t *testing.T) {
	c := newCluster(t)
	var dropped int
	s, err := etcdstore.NewWithKV(c.cli, lossyKV(c.cli.KV, &dropped), etcdstore.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg := lamp(t, "register-lost-reply", 1)
	reg.RequestID = "approver-a-1"
	if _, created, err := s.Register(ctx(t), reg); err != nil || !created {
		t.Fatalf("Register with its reply lost = created %t, %v; want created true", created, err)
	}
	if dropped == 0 {
		t.Fatal("no reply was dropped: the test did not exercise the fault")
	}
	other := reg
	other.RequestID = "approver-b-1"
	if _, created, err := c.store(t).Register(ctx(t), other); err != nil || created {
		t.Fatalf("another approver's Register = created %t, %v; want created false", created, err)
	}
}
