package pgtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBinPicksTheNewestCompleteServer(t *testing.T) {
	root := t.TempDir()
	mk := func(major string, files ...string) {
		dir := filepath.Join(root, major, "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	glob := filepath.Join(root, "*", "bin")
	steps := []struct {
		name    string
		add     func()
		want    string // the major chosen; "" an error
		mention string // in the error
	}{
		{"none installed", func() {}, "", "install-postgres.sh"},
		{"a client only (no initdb)", func() { mk("17", "psql", "postgres") }, "", "initdb"},
		{"one server", func() { mk("15", "initdb", "postgres") }, "15", ""},
		{"an older one beside it", func() { mk("9", "initdb", "postgres") }, "15", ""},
		{"a newer one", func() { mk("16", "initdb", "postgres") }, "16", ""},
		{"a directory that is no major", func() { mk("latest", "initdb", "postgres") }, "16", ""},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.add()
			dir, err := binIn(glob)
			if st.want == "" {
				if err == nil || !strings.Contains(err.Error(), st.mention) {
					t.Fatalf("%q, %v: want an error that says %q", dir, err, st.mention)
				}
				return
			}
			if err != nil || dir != filepath.Join(root, st.want, "bin") {
				t.Fatalf("%q, %v: want %s's", dir, err, st.want)
			}
		})
	}
}
