package intent

import (
	"strings"
	"testing"
)

func TestValidateTenant(t *testing.T) {
	tests := []struct {
		tenant string
		ok     bool
	}{
		{"a", true},
		{"0", true},
		{DefaultTenant, true},
		{"acme-eu_2", true},
		{"9lives", true},
		{"a-", true},
		{strings.Repeat("t", MaxTenantLen), true},
		{"", false},
		{strings.Repeat("t", MaxTenantLen+1), false},
		{"Acme", false},
		{"acmE", false},
		{"-acme", false},
		{"_acme", false},
		{"acme.eu", false},
		{"acme eu", false},
		{"acme/eu", false},
		{"acmé", false},
	}
	for _, tt := range tests {
		err := ValidateTenant(tt.tenant)
		if tt.ok {
			if err != nil {
				t.Errorf("ValidateTenant(%+q) = %v, want nil", tt.tenant, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("ValidateTenant(%+q) = nil, want an error", tt.tenant)
			continue
		}
		if field, _ := invalidReason(t, err); field != "tenant" {
			t.Errorf("ValidateTenant(%+q) field = %q, want %q", tt.tenant, field, "tenant")
		}
	}
}
