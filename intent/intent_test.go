package intent_test

import (
	"reflect"
	"testing"

	"github.com/intentd/intentd/intent"
)

// TestDomainTypesCarryNoStorageTags: the domain types are not a storage or
// wire format. etcdstore stores its own schema and the API its protos, so a
// JSON tag here could only look as if renaming a field were unsafe, or
// quietly become a format again.
func TestDomainTypesCarryNoStorageTags(t *testing.T) {
	for _, v := range []any{intent.Intent{}, intent.Lease{}, intent.Result{}, intent.Failure{}, intent.Event{}, intent.Child{}, intent.Session{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			if f := typ.Field(i); f.Tag.Get("json") != "" {
				t.Errorf("%s.%s has tag %q, want no json tag", typ, f.Name, f.Tag)
			}
		}
	}
}
