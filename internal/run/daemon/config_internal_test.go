package daemon

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/intentd/intentd/etcdstore"
)

// The store's fields are validated once, by etcdstore.Config.Validate,
// which names Go fields; the daemon renames them to flags. Each field is
// either set by a flag (and listed in storeFlags) or set by the daemon
// itself, so a new store field cannot reach the operator under its Go
// name unnoticed.
func TestEveryStoreFieldHasItsFlagOrIsTheDaemons(t *testing.T) {
	setByDaemon := map[string]bool{"Archive": true, "Now": true, "Logger": true, "TracerProvider": true, "ObserveTxn": true, "ObserveBatch": true, "LocalGet": true}
	typ := reflect.TypeFor[etcdstore.Config]()
	fields := map[string]bool{}
	for f := range typ.Fields() {
		fields[f.Name] = true
		_, flag := storeFlags[f.Name]
		switch {
		case flag && setByDaemon[f.Name]:
			t.Errorf("etcdstore.Config.%s has flag %s and is listed as set by the daemon", f.Name, storeFlags[f.Name])
		case !flag && !setByDaemon[f.Name]:
			t.Errorf("etcdstore.Config.%s: no flag in storeFlags; add its flag, or list it as set by the daemon", f.Name)
		}
	}
	for field := range storeFlags {
		if !fields[field] {
			t.Errorf("storeFlags names %s, which etcdstore.Config does not have", field)
		}
	}
}

// Each store field the operator sets is refused naming its flag (and the
// flag of the field it is compared with), never the Go field.
func TestBadStoreFieldNamesItsFlag(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*etcdstore.Config)
		want   string
	}{
		{"prefix", func(c *etcdstore.Config) { c.Prefix = "" }, `--prefix "": must end with /`},
		{"request timeout", func(c *etcdstore.Config) { c.RequestTimeout = 0 }, "--request-timeout 0s: must be positive"},
		{"operation timeout", func(c *etcdstore.Config) { c.OperationTimeout = -time.Second }, "--operation-timeout -1s: must be positive"},
		{"retention", func(c *etcdstore.Config) { c.DefaultRetention = 0 }, "--retention 0s: must be positive"},
		{"max retention", func(c *etcdstore.Config) { c.MaxRetention = time.Hour }, "--retention 720h0m0s: must be at most --max-retention 1h0m0s"},
		{"tombstone retention", func(c *etcdstore.Config) { c.TombstoneRetention = time.Hour }, "--tombstone-retention 1h0m0s: must be at least --retention 720h0m0s"},
		{"max attempts", func(c *etcdstore.Config) { c.MaxAttempts = 0 }, "--max-attempts 0: want 1 to 1000"},
		{"cache bytes", func(c *etcdstore.Config) { c.CacheBytes = 1000 }, "--cache-bytes 1000: must be at least 1048576 (1 MiB)"},
		{"a field the daemon sets", func(c *etcdstore.Config) { c.Logger = nil }, "store Logger: must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mutate(&cfg.Store)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "etcdstore") {
				t.Errorf("Validate() = %v, names the store's Go fields", err)
			}
		})
	}
}
