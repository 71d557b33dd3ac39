package intent_test

import (
	"testing"

	"github.com/intentd/intentd/intent"
)

func TestKeyHash(t *testing.T) {
	tests := []struct {
		name, tenant, key, want string
	}{
		// printf 'default\0order-1' | sha256sum | cut -c1-16
		{"documented shell recipe", "default", "order-1", "2a2d1d62a541ca29"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := intent.KeyHash(tt.tenant, tt.key); got != tt.want {
				t.Errorf("KeyHash(%q, %q) = %q, want %q", tt.tenant, tt.key, got, tt.want)
			}
		})
	}
	if intent.KeyHash("a", "bc") == intent.KeyHash("ab", "c") {
		t.Error("KeyHash does not separate tenant from key")
	}
}
