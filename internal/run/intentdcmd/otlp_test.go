package intentdcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOTLPEndpointFromOpenTelemetryVariables: --otlp-endpoint falls back on
// OpenTelemetry's standard variables, the traces-only one first, after the
// command line, INTENTD_OTLP_ENDPOINT and the config file; a bad value
// names the variable it came from.
func TestOTLPEndpointFromOpenTelemetryVariables(t *testing.T) {
	file := filepath.Join(t.TempDir(), "intentd.yaml")
	if err := os.WriteFile(file, []byte("otlp-endpoint: http://from-file:4317\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"none", nil, nil, "", ""},
		{"generic variable", nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317"}, "http://generic:4317", ""},
		{"traces variable first", nil, map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces:4317",
		}, "https://traces:4317", ""},
		{"INTENTD_ wins", nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317", "INTENTD_OTLP_ENDPOINT": "http://intentd:4317"}, "http://intentd:4317", ""},
		{"config file wins", []string{"--config", file}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317"}, "http://from-file:4317", ""},
		{"empty flag turns it off", []string{"--otlp-endpoint="}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317"}, "", ""},
		{"bad variable named", nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, "", `OTEL_EXPORTER_OTLP_ENDPOINT (--otlp-endpoint) "collector:4317": want an http://`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "INTENTD_OTLP_ENDPOINT"} {
				t.Setenv(k, tt.env[k])
				if tt.env[k] == "" {
					os.Unsetenv(k)
				}
			}
			cmd := newCommand(&bytes.Buffer{}, nil)
			if err := cmd.ParseFlags(tt.args); err != nil {
				t.Fatal(err)
			}
			err := settle(cmd.Flags())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("settle() = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cmd.Flags().Lookup("otlp-endpoint").Value.String(); got != tt.want {
				t.Errorf("--otlp-endpoint = %q, want %q", got, tt.want)
			}
		})
	}
}
