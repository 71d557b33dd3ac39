package main

import (
	"testing"

	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
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
