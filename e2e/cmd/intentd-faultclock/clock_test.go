package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestReadOffset(t *testing.T) {
	tests := []struct {
		name    string
		content *string // nil: no file
		want    time.Duration
		wantErr bool
	}{
		{name: "missing file", want: 0},
		{name: "empty", content: new(""), want: 0},
		{name: "ahead", content: new("5m\n"), want: 5 * time.Minute},
		{name: "behind", content: new(" -5m "), want: -5 * time.Minute},
		{name: "garbage", content: new("five minutes"), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "offset")
			if tc.content != nil {
				if err := os.WriteFile(path, []byte(*tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := readOffset(path)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("readOffset = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
