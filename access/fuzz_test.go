package access

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"slices"
	"testing"
)

// FuzzParse feeds Parse arbitrary bytes. It must never panic, and a file it
// accepts must round-trip: every principal of the file is in the directory,
// found by each of its token hashes and certificate names with its tenants
// and roles, and nothing else is. The committed corpus is in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte(goodFile()))
	f.Add([]byte(`{"principals": []}`))
	f.Add([]byte(`{"principals": [{"name": "w", "tenants": ["acme"], "roles": ["worker"], "token": "plain"}]}`))
	f.Add([]byte(`{"principals": [{"name": "ops", "tenants": ["*"], "roles": ["admin"], "cert_names": ["intentd://principal/ops", "ops"]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Parse(b)
		if err != nil {
			if d != nil {
				t.Fatalf("Parse returned a directory and the error %v", err)
			}
			return
		}
		// Read the file as Parse did: its first JSON value.
		var file File
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(&file); err != nil {
			t.Fatalf("Parse accepted %q, but it does not decode: %v", b, err)
		}
		if d.Len() != len(file.Principals) {
			t.Fatalf("Len() = %d, want the file's %d principals", d.Len(), len(file.Principals))
		}
		tokens, certs := 0, 0
		for _, e := range file.Principals {
			same := func(p *Principal) bool {
				return p != nil && p.Name == e.Name && slices.Equal(p.Tenants, e.Tenants) && slices.Equal(p.Roles, e.Roles)
			}
			for _, h := range e.TokenSHA256 {
				raw, err := hex.DecodeString(h)
				if err != nil || len(raw) != 32 || hex.EncodeToString(raw) != h {
					t.Fatalf("accepted token_sha256 %q of %q is not 64 lowercase hex digits", h, e.Name)
				}
				if p := d.byToken[[32]byte(raw)]; !same(p) {
					t.Fatalf("token hash %s finds %+v, want %+v", h, p, e)
				}
				tokens++
			}
			for _, n := range e.CertNames {
				if p := d.byCert[n]; !same(p) {
					t.Fatalf("cert name %q finds %+v, want %+v", n, p, e)
				}
				certs++
			}
			if len(e.TokenSHA256)+len(e.CertNames) == 0 {
				t.Fatalf("accepted principal %q that could never authenticate", e.Name)
			}
			for _, r := range e.Roles {
				if !slices.Contains(Roles, r) {
					t.Fatalf("accepted unknown role %q", r)
				}
			}
		}
		if len(d.byToken) != tokens || len(d.byCert) != certs {
			t.Fatalf("directory holds %d token hashes and %d cert names, want the file's %d and %d (none shared)", len(d.byToken), len(d.byCert), tokens, certs)
		}
		// Writing the file back gives the same directory.
		again, err := json.Marshal(file)
		if err != nil {
			t.Fatal(err)
		}
		d2, err := Parse(again)
		if err != nil {
			t.Fatalf("Parse(re-encoded %s) = %v, want it accepted as the original was", again, err)
		}
		if d2.Len() != d.Len() || len(d2.byToken) != len(d.byToken) || len(d2.byCert) != len(d.byCert) {
			t.Fatalf("re-encoded file gives %d/%d/%d principals/tokens/certs, want %d/%d/%d",
				d2.Len(), len(d2.byToken), len(d2.byCert), d.Len(), len(d.byToken), len(d.byCert))
		}
	})
}
