package server_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/server"
)

// TestKeyRule: an intent key is 1 to 256 bytes of ASCII letters, digits
// and "-_.:/=@+", as the key rule of intent.proto says and the handlers
// check (this table was intent.ValidateKey's). A derived key is a valid key.
func TestKeyRule(t *testing.T) {
	for _, tt := range []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"Z", true},
		{"0", true},
		{strings.Repeat("k", server.MaxKeyLen), true},
		{"order-1001_v2.final:refund/RMA=7@acme+eu", true},
		{"fb51b6bc6b219d7083afc5cc16d54909f051cdd6b8210f31a5da81384163d340", true},
		{"", false},
		{strings.Repeat("k", server.MaxKeyLen+1), false},
		{"has space", false},
		{"tab\t", false},
		{"nul\x00", false},
		{"é", false},
		{"hash#", false},
		{"query?", false},
		{"star*", false},
		{"back\\slash", false},
		{"percent%20", false},
		{"comma,", false},
	} {
		err := server.CheckRequest(&intentv1.GetRequest{Key: tt.key})
		if tt.ok {
			if err != nil {
				t.Errorf("key %+q: %v, want it accepted", tt.key, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("key %+q accepted, want it refused", tt.key)
			continue
		}
		checkError(t, err, codes.InvalidArgument, "INVALID_FIELD", "key")
	}
}

// requestFields calls visit with every field of every IntentService
// request, and of the messages requests carry.
func requestFields(visit func(fd protoreflect.FieldDescriptor, rules *validate.FieldRules)) {
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] || md.ParentFile().Package() != "intent.v1" {
			return
		}
		seen[md.FullName()] = true
		for i := range md.Fields().Len() {
			fd := md.Fields().Get(i)
			rules, _ := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
			visit(fd, rules)
			if fd.Message() != nil && !fd.IsMap() {
				walk(fd.Message())
			}
			if fd.IsMap() && fd.MapValue().Message() != nil {
				walk(fd.MapValue().Message())
			}
		}
	}
	methods := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods()
	for i := range methods.Len() {
		walk(methods.Get(i).Input())
	}
}

// Where no request is at hand the limits of request fields are needed in
// Go: a tokens file names tenants (intent.ValidateTenant), a client derives
// keys (intent.DeriveKey checks the action), the store bounds a
// registration's attempts and a page. Those constants must say what the
// rules say.
func TestDomainLimitsMatchRules(t *testing.T) {
	rules := func(message, field string) *validate.FieldRules { return server.FieldRules(message, field) }
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"intent.MaxTenantLen", intent.MaxTenantLen, int64(server.MaxTenantLen)},
		{"intent.MaxActionLen", intent.MaxActionLen, int64(server.MaxActionLen)},
		{"intent.MaxAttemptsLimit", intent.MaxAttemptsLimit, int64(rules("RegisterRequest", "max_attempts").GetUint32().GetLte())},
		{"etcdstore.MaxPageSize", etcdstore.MaxPageSize, int64(rules("ListRequest", "page_size").GetInt32().GetLte())},
		{"intent.MaxKeptRequestBody", intent.MaxKeptRequestBody, int64(rules("SubmittedRequest", "body_kept").GetBytes().GetMaxLen())},
		{"intent.MaxKeptResponseBody", intent.MaxKeptResponseBody, int64(rules("UpstreamResponse", "body").GetBytes().GetMaxLen())},
		{"intent.MaxKeptHeaders", intent.MaxKeptHeaders, int64(rules("UpstreamResponse", "headers").GetRepeated().GetMaxItems())},
	} {
		if tc.got != tc.want || tc.want == 0 {
			t.Errorf("%s = %d, intent.proto says %d", tc.name, tc.got, tc.want)
		}
	}
	// The alphabets, byte by byte and at the lengths that matter.
	var samples []string
	for c := range 256 {
		samples = append(samples, string(rune(c)), "a"+string(rune(c)), string([]byte{byte(c)}), "a"+string([]byte{byte(c)}))
	}
	for _, n := range []int{intent.MaxTenantLen, intent.MaxTenantLen + 1, intent.MaxActionLen, intent.MaxActionLen + 1} {
		samples = append(samples, strings.Repeat("a", n))
	}
	for _, s := range samples {
		ruleOK := server.CheckRequest(&intentv1.GetRequest{Tenant: s, Key: "k"}) == nil
		if goOK := intent.ValidateTenant(s) == nil; goOK != ruleOK && s != "" {
			t.Errorf("tenant %+q: intent.ValidateTenant accepts it %v, the rule %v", s, goOK, ruleOK)
		}
		ruleOK = server.CheckRequest(&intentv1.DeriveKeyRequest{Action: s}) == nil
		_, _, err := intent.DeriveKey(s, map[string]any{"cart": "c-1"})
		if goOK := err == nil; goOK != ruleOK && s != "" {
			t.Errorf("action %+q: intent.DeriveKey accepts it %v, the rule %v", s, goOK, ruleOK)
		}
	}
}

// Package server writes no limit of a request field: those are the rules
// of intent.proto, read from there when a hand check needs one. A Max or
// Min declared in server's own code is a second place for a limit, and
// drifts, unless it bounds what no field's rule can.
func TestServerWritesNoFieldLimit(t *testing.T) {
	own := map[string]string{
		"MaxOutboxBytes":     "a whole outbox",
		"maxLabelValueBytes": "read from RegisterRequest.labels' rule",
		"maxSubscriptLen":    "how much of a refused map key an error repeats",
		"maxPathLen":         "how much of a decoding error's field path an error repeats",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
				continue
			}
			for _, spec := range g.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					n := strings.ToLower(id.Name)
					if (strings.HasPrefix(n, "max") || strings.HasPrefix(n, "min")) && own[id.Name] == "" {
						t.Errorf("%s: %s declares a limit in package server; a field's limit is a rule in intent.proto", fset.Position(id.Pos()), id.Name)
					}
				}
			}
		}
	}
}

// The list of limits of docs/SECURITY.md (once the README's) says what the
// rules say: each phrase is built from the compiled rules (and, for params,
// from package intent's canonical limits), so changing a rule without the
// list fails here.
func TestReadmeLimitsAreTheRules(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	for _, phrase := range []string{
		fmt.Sprintf("key 1–%d bytes", server.MaxKeyLen),
		fmt.Sprintf("tenant 1–%d of", intent.MaxTenantLen),
		fmt.Sprintf("params ≤ %d KiB canonical, nesting ≤ %d", intent.MaxParamsBytes>>10, intent.MaxDepth),
		fmt.Sprintf("≤ %d labels (name ≤ %d, value ≤ %d bytes)", server.MaxLabels, server.MaxLabelKeyLen, server.MaxLabelValueLen),
		fmt.Sprintf("result payload ≤ %d KiB, ≤ %d external refs", server.MaxPayloadBytes>>10, server.MaxExternalRefs),
		fmt.Sprintf("≤ %d outbox children", server.MaxChildren),
		fmt.Sprintf("session TTL %d s–%d min", int(server.MinSessionTTL.Seconds()), int(server.MaxSessionTTL.Minutes())),
		fmt.Sprintf("page size ≤ %d", server.FieldRules("ListRequest", "page_size").GetInt32().GetLte()),
		fmt.Sprintf("reasons ≤ %d bytes", server.MaxReasonLen),
	} {
		if !strings.Contains(readme, phrase) {
			t.Errorf("docs/SECURITY.md does not say %q, which is what intent.proto's rules say", phrase)
		}
	}
}
