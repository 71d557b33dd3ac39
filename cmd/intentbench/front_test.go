package main

import (
	"bytes"
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/embedetcd"
	"github.com/intentd/intentd/internal/testing/etcdtest"
)

// TestAcquireKey: the front finds the key of an encoded AcquireRequest
// wherever its fields fall, and says so when there is none.
func TestAcquireKey(t *testing.T) {
	full, err := proto.Marshal((&bench{}).acquireRequest("orders/o-1", "s-1", "p-1"))
	if err != nil {
		t.Fatal(err)
	}
	tenantFirst, err := proto.Marshal(&intentv1.AcquireRequest{Tenant: "acme", Key: "refunds/r-9"})
	if err != nil {
		t.Fatal(err)
	}
	noKey, err := proto.Marshal(&intentv1.AcquireRequest{SessionId: "s-1"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		in     []byte
		want   string
		wantOK bool
	}{
		{"the benchmark's request", full, "orders/o-1", true},
		{"after the tenant", tenantFirst, "refunds/r-9", true},
		{"no key", noKey, "", false},
		{"empty", nil, "", false},
		{"truncated", full[:3], "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := acquireKey(tc.in)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("acquireKey = %q, %v; want %q, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// The front answers an Acquire with the answer stored under its key, read
// from its member's store as intentd's miss reads its embedded etcd, and
// NOT_FOUND for a key it holds no answer for.
func TestFrontAnswersWhatItsEtcdHolds(t *testing.T) {
	etcd := etcdtest.Start(t)
	ctx := context.Background()
	answer, err := proto.Marshal(&intentv1.AcquireResponse{Outcome: intentv1.Outcome_OUTCOME_COMPLETED, Statement: &intentv1.Statement{Text: "already_completed"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Client(t).Put(ctx, frontPrefix+"orders/o-1", string(answer)); err != nil {
		t.Fatal(err)
	}
	front := etcdFront{get: embedetcd.LocalGet(etcd.Etcd)}
	for _, tc := range []struct {
		key  string
		want []byte
		code codes.Code
	}{
		{"orders/o-1", answer, codes.OK},
		{"orders/o-2", nil, codes.NotFound},
	} {
		req, err := proto.Marshal((&bench{}).acquireRequest(tc.key, "s-1", "p-1"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := front.Acquire(ctx, req)
		if status.Code(err) != tc.code {
			t.Fatalf("%s: %v, want %v", tc.key, err, tc.code)
		}
		if err == nil && !bytes.Equal(*got, tc.want) {
			t.Errorf("%s: answered %q, want %q", tc.key, *got, tc.want)
		}
	}
}
