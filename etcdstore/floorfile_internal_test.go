package etcdstore

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The floor file is merged with max on every write, since two processes
// may share a data directory: a write never lowers an installation's
// floor, nor drops another installation's.
func TestFloorFileMergesWithMax(t *testing.T) {
	tests := []struct {
		name    string
		before  string // file content; "" means no file
		id      string
		rev     int64
		want    map[string]int64
		wantErr string // substring; then the file must be left as it was
	}{
		{name: "no file yet", id: "a", rev: 10, want: map[string]int64{"a": 10}},
		{name: "higher replaces", before: `{"a":5}`, id: "a", rev: 10, want: map[string]int64{"a": 10}},
		{name: "lower keeps the higher", before: `{"a":20}`, id: "a", rev: 10, want: map[string]int64{"a": 20}},
		{name: "equal is kept", before: `{"a":10}`, id: "a", rev: 10, want: map[string]int64{"a": 10}},
		{name: "other installations are kept", before: `{"b":7}`, id: "a", rev: 10, want: map[string]int64{"a": 10, "b": 7}},
		{name: "empty object", before: `{}`, id: "a", rev: 3, want: map[string]int64{"a": 3}},
		{name: "corrupt file is not overwritten", before: `{"a":`, id: "a", rev: 10, wantErr: "revision floor"},
		{name: "trailing data is refused", before: `{"a":1}{"b":2}`, id: "a", rev: 10, wantErr: "data after"},
		{name: "wrong type is refused", before: `{"a":"ten"}`, id: "a", rev: 10, wantErr: "revision floor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FloorFileName)
			if tc.before != "" {
				if err := os.WriteFile(path, []byte(tc.before), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := writeFloor(path, tc.id, tc.rev)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("writeFloor = %v, want an error containing %q", err, tc.wantErr)
				}
				if b, _ := os.ReadFile(path); string(b) != tc.before {
					t.Fatalf("file became %q, want it left as %q", b, tc.before)
				}
				if _, err := readFloors(path); err == nil {
					t.Fatal("readFloors accepted it: intentd would start without its floor")
				}
				return
			}
			if err != nil {
				t.Fatalf("writeFloor: %v", err)
			}
			got, err := readFloors(path)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("floors = %v, want %v", got, tc.want)
			}
			// Nothing is left behind but the file itself.
			entries, _ := os.ReadDir(filepath.Dir(path))
			if len(entries) != 1 {
				t.Fatalf("data dir holds %d entries, want only %s", len(entries), FloorFileName)
			}
		})
	}
}

// Two processes writing one floor file at once never leave it torn or
// unreadable (each write is a rename of a complete file), and a process's
// next write restores its own highest revision.
func TestFloorFileTwoWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), FloorFileName)
	done := make(chan error, 2)
	for _, id := range []string{"a", "b"} {
		go func() {
			for rev := int64(1); rev <= 50; rev++ {
				if err := writeFloor(path, id, rev); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// The last writer of each id wrote 50 after reading the file; an
	// interleaving can keep the other's older value (documented), which a
	// further write by that process raises again.
	for _, id := range []string{"a", "b"} {
		if err := writeFloor(path, id, 50); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	var got map[string]int64
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got["a"] != 50 || got["b"] != 50 {
		t.Fatalf("floors = %v, want a and b at 50", got)
	}
}
