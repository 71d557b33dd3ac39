package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the import path of intentd's module.
const module = "github.com/intentd/intentd"

// pkg is what the rules read of one package in `go list -json` output.
type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string // non-test imports, as go list resolves them
	Error      *struct{ Err string }
}

// graph is an import graph by import path.
type graph map[string]*pkg

// local returns the module-relative path of p ("server", "gen/intent/v1"),
// and whether p is in the module at all.
func local(p string) (string, bool) {
	if p == module {
		return "", true
	}
	rest, ok := strings.CutPrefix(p, module+"/")
	return rest, ok
}

// under reports whether the module package p is dir or below it.
func under(p, dir string) bool {
	rel, ok := local(p)
	return ok && (rel == dir || strings.HasPrefix(rel, dir+"/"))
}

// rule is one forbidden edge: no package the rule covers may depend on (or,
// when direct, import itself) a package forbid matches.
type rule struct {
	name string
	// covers selects the module packages the rule is about.
	covers func(p string) bool
	// forbid tells whether depending on q is forbidden.
	forbid func(g graph, q string) bool
	// direct restricts the rule to the package's own imports.
	direct bool
	// optional rules may cover no package yet (client); the others
	// must cover one, or the rule has stopped checking anything.
	optional bool
}

// isMain reports whether p is one of intentd's commands: cmd/..., and the
// mains the e2e module builds for its suites (e2e/cmd/..., intentd with a
// test's fault injected), which are compositions as cmd/intentd is.
func isMain(p string) bool { return under(p, "cmd") || under(p, "e2e/cmd") }

func within(dir string) func(string) bool {
	return func(p string) bool { return under(p, dir) }
}

func nonStandard(g graph, q string) bool {
	p, ok := g[q]
	return !ok || !p.Standard
}

func anyOf(fs ...func(graph, string) bool) func(graph, string) bool {
	return func(g graph, q string) bool {
		return slices.ContainsFunc(fs, func(f func(graph, string) bool) bool { return f(g, q) })
	}
}

func pkgUnder(dir string) func(graph, string) bool {
	return func(_ graph, q string) bool { return under(q, dir) }
}

func pathPrefix(prefix string) func(graph, string) bool {
	return func(_ graph, q string) bool { return q == prefix || strings.HasPrefix(q, prefix+"/") }
}

func exactly(paths ...string) func(graph, string) bool {
	return func(_ graph, q string) bool { return slices.Contains(paths, q) }
}

// rules are the layering of docs/DESIGN.md ("Layering"), one forbidden edge each.
var rules = []rule{
	{
		name:   "fencing depends on the standard library only",
		covers: within("fencing"),
		forbid: nonStandard,
	},
	{
		name:   "intent depends on the standard library and fencing only",
		covers: within("intent"),
		forbid: func(g graph, q string) bool { return nonStandard(g, q) && !under(q, "fencing") },
	},
	{
		name:   "machine depends on intent, fencing and the standard library only",
		covers: within("internal/core/machine"),
		forbid: func(g graph, q string) bool {
			return nonStandard(g, q) && !under(q, "intent") && !under(q, "fencing") && !under(q, "internal/core/machine")
		},
	},
	{
		name:   "server depends on no etcd package",
		covers: within("server"),
		forbid: pathPrefix("go.etcd.io"),
	},
	{
		name:   "server does not depend on etcdstore",
		covers: within("server"),
		forbid: pkgUnder("etcdstore"),
	},
	{
		name:   "etcdstore does not import gRPC codes or status",
		covers: within("etcdstore"),
		forbid: exactly("google.golang.org/grpc/codes", "google.golang.org/grpc/status"),
		direct: true,
	},
	{
		name:   "etcdstore depends neither on server nor on gen",
		covers: within("etcdstore"),
		forbid: anyOf(pkgUnder("server"), pkgUnder("gen")),
	},
	{
		name:   "gen depends on nothing of intentd outside gen",
		covers: within("gen"),
		forbid: func(_ graph, q string) bool {
			_, mine := local(q)
			return mine && !under(q, "gen")
		},
	},
	{
		name:     "client depends neither on server nor on etcdstore",
		covers:   within("client"),
		forbid:   anyOf(pkgUnder("server"), pkgUnder("etcdstore")),
		optional: true,
	},
	{
		name:   "intentctl talks to intentd through client only",
		covers: within("cmd/intentctl"),
		forbid: anyOf(pkgUnder("server"), pkgUnder("etcdstore"), pkgUnder("internal/run/daemon"), pathPrefix("go.etcd.io")),
	},
	{
		name:   "the review console calls the API only: no server, no store",
		covers: within("internal/run/console"),
		forbid: anyOf(pkgUnder("server"), pkgUnder("etcdstore"), pkgUnder("internal/run/daemon"), pathPrefix("go.etcd.io")),
	},
	{
		name:   "the fencing gateway talks to intentd over gRPC only: no server, no store, no etcd",
		covers: within("gateway"),
		forbid: anyOf(pkgUnder("server"), pkgUnder("etcdstore"), pkgUnder("internal/run/daemon"), pathPrefix("go.etcd.io")),
	},
	{
		name:   "the MCP guard talks to intentd through client only: no server, no store, no etcd",
		covers: within("mcpguard"),
		forbid: anyOf(pkgUnder("server"), pkgUnder("etcdstore"), pkgUnder("internal/run"), pkgUnder("archive"), pathPrefix("go.etcd.io")),
	},
	{
		name:   "access depends on no gRPC and no etcd",
		covers: within("access"),
		forbid: anyOf(pathPrefix("google.golang.org/grpc"), pathPrefix("go.etcd.io")),
	},
	{
		name: "only commands, internal/run/daemon, internal/run/intentdcmd and internal/testing/intentdtest depend on etcdstore",
		covers: func(p string) bool {
			_, mine := local(p)
			return mine && !under(p, "etcdstore") && !isMain(p) && !under(p, "internal/run/daemon") && !under(p, "internal/run/intentdcmd") && !under(p, "internal/testing/intentdtest")
		},
		// The archive keeps tombstones in package etcdstore/tombstones'
		// format, and nothing else of etcdstore.
		forbid: func(_ graph, q string) bool { return under(q, "etcdstore") && !under(q, "etcdstore/tombstones") },
	},
	{
		name:   "the archive depends on intent, etcdstore/tombstones and PostgreSQL's client only: no etcd, no server, no gRPC",
		covers: within("archive"),
		forbid: anyOf(pathPrefix("go.etcd.io"), pathPrefix("google.golang.org/grpc"), pkgUnder("server"), pkgUnder("gen"),
			pkgUnder("client"), pkgUnder("internal/run"), pkgUnder("access"),
			func(_ graph, q string) bool { return under(q, "etcdstore") && !under(q, "etcdstore/tombstones") }),
	},
	{
		name:   "etcdstore/tombstones depends on intent and the standard library only",
		covers: within("etcdstore/tombstones"),
		forbid: func(g graph, q string) bool { return nonStandard(g, q) && !under(q, "intent") && !under(q, "fencing") },
	},
	{
		name: "internal/ holds four floors: core, run, testing and checks",
		covers: func(p string) bool {
			return under(p, "internal") && !slices.ContainsFunc(floors, func(f string) bool { return under(p, "internal/"+f) })
		},
		forbid:   func(graph, string) bool { return true },
		optional: true,
	},
	{
		name:   "internal/core is the ground floor: no other floor, no store, no server, no client",
		covers: within("internal/core"),
		forbid: anyOf(pkgUnder("internal/run"), pkgUnder("internal/testing"), pkgUnder("internal/checks"),
			pkgUnder("etcdstore"), pkgUnder("server"), pkgUnder("client"), pkgUnder("access"), pathPrefix("go.etcd.io")),
	},
	{
		name: "only commands and the test helpers depend on the composition root internal/run",
		covers: func(p string) bool {
			_, mine := local(p)
			return mine && !isMain(p) && !under(p, "internal/run") && !under(p, "internal/testing")
		},
		forbid: pkgUnder("internal/run"),
	},
	{
		name: "no product package depends on the test helpers of internal/testing",
		covers: func(p string) bool {
			_, mine := local(p)
			return mine && !under(p, "e2e") && !under(p, "internal/testing")
		},
		forbid: pkgUnder("internal/testing"),
	},
	{
		name: "nothing depends on internal/checks, which holds tests only",
		covers: func(p string) bool {
			_, mine := local(p)
			return mine && !under(p, "internal/checks")
		},
		forbid: pkgUnder("internal/checks"),
	},
	{
		name:   "e2e is a black box",
		covers: func(p string) bool { return under(p, "e2e") && !isMain(p) },
		forbid: anyOf(pkgUnder("server"), pkgUnder("etcdstore"), pkgUnder("internal/run/daemon")),
	},
}

// floors are the directories of internal/: the ground floor the product's
// libraries stand on (core), the composition root the commands share (run),
// the helpers that start etcd and intentd in tests (testing), and packages
// that hold a test and nothing else (checks).
var floors = []string{"core", "run", "testing", "checks"}

// violations returns, for each forbidden package that root reaches under
// r, the shortest chain of imports from root to it. A chain stops at its
// first forbidden package, so one bad edge is reported once, not once per
// package behind it, and at the standard library, whose insides are not
// ours to layer.
func violations(g graph, root string, r rule) [][]string {
	var out [][]string
	if r.direct {
		for _, q := range g[root].imports() {
			if r.forbid(g, q) {
				out = append(out, []string{root, q})
			}
		}
		return out
	}
	parent := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range g[p].imports() {
			if _, seen := parent[q]; seen {
				continue
			}
			parent[q] = p
			if r.forbid(g, q) {
				out = append(out, chain(parent, q))
				continue
			}
			if g[q] != nil && g[q].Standard {
				// The standard library's own imports (cgo's "C" in
				// net, say) are not intentd's layering.
				continue
			}
			queue = append(queue, q)
		}
	}
	return out
}

func (p *pkg) imports() []string {
	if p == nil {
		return nil
	}
	return p.Imports
}

// chain follows parent links from q back to the root.
func chain(parent map[string]string, q string) []string {
	var c []string
	for ; q != ""; q = parent[q] {
		c = append(c, q)
	}
	slices.Reverse(c)
	return c
}

// short writes a chain with module packages relative to the module.
func short(c []string) string {
	s := make([]string, len(c))
	for i, p := range c {
		if rel, ok := local(p); ok && rel != "" {
			p = rel
		}
		s[i] = p
	}
	return strings.Join(s, " → ")
}

// modules are the directories, relative to this package, of the modules
// whose packages the rules cover: intentd's own and e2e's, whose import
// paths lie under intentd's (github.com/intentd/intentd/e2e/...), so that
// it may import intentd's internal packages and the rules about "e2e" reach
// it.
var modules = []string{"../../..", "../../../e2e"}

// load reads the import graph of every package of the modules, and of every
// package those depend on, from `go list -deps -json`.
func load(t *testing.T) graph {
	t.Helper()
	g := graph{}
	for _, dir := range modules {
		loadModule(t, g, dir)
	}
	for path, p := range g {
		if _, mine := local(path); mine && p.Error != nil {
			t.Errorf("go list cannot read %s, so its imports go unchecked: %s", path, p.Error.Err)
		}
	}
	return g
}

// loadModule adds the import graph of the module in dir to g.
func loadModule(t *testing.T, g graph, dir string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json", "-e", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", dir, err, stderr.Bytes())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := &pkg{}
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		g[p.ImportPath] = p
	}
}

// TestLayering checks every rule against the module's real import graph.
func TestLayering(t *testing.T) {
	g := load(t)
	var mine []string
	for path := range g {
		if _, ok := local(path); ok {
			mine = append(mine, path)
		}
	}
	slices.Sort(mine)
	if len(mine) == 0 {
		t.Fatalf("go list found no package of %s", module)
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			covered := 0
			for _, p := range mine {
				if !r.covers(p) {
					continue
				}
				covered++
				for _, c := range violations(g, p, r) {
					t.Errorf("forbidden: %s", short(c))
				}
			}
			if covered == 0 && !r.optional {
				t.Errorf("the rule covers no package of %v", mine)
			}
		})
	}
}

// fake builds a graph from edges; the packages named in std are standard.
func fake(edges map[string][]string, std ...string) graph {
	g := graph{}
	add := func(p string) {
		if g[p] == nil {
			g[p] = &pkg{ImportPath: p, Standard: slices.Contains(std, p)}
		}
	}
	for p, imps := range edges {
		add(p)
		g[p].Imports = imps
		for _, q := range imps {
			add(q)
		}
	}
	return g
}

// ruleNamed returns the rule of that name, so that the self-test below
// exercises the very rules TestLayering applies.
func ruleNamed(t *testing.T, name string) rule {
	t.Helper()
	for _, r := range rules {
		if r.name == name {
			return r
		}
	}
	t.Fatalf("no rule %q", name)
	return rule{}
}

// TestRulesCatchForbiddenEdges feeds the rules made-up import graphs with a
// known bad edge, and clean ones: a rule that cannot fail guards nothing.
func TestRulesCatchForbiddenEdges(t *testing.T) {
	const m = module + "/"
	tests := []struct {
		name  string
		rule  string
		root  string
		edges map[string][]string
		std   []string
		want  []string // chains, as short writes them
	}{
		{
			name: "fencing importing etcd",
			rule: "fencing depends on the standard library only",
			root: m + "fencing",
			edges: map[string][]string{
				m + "fencing":               {"strconv", "go.etcd.io/etcd/client/v3"},
				"go.etcd.io/etcd/client/v3": {"google.golang.org/grpc"},
				"google.golang.org/grpc":    {"strconv"},
				"strconv":                   {},
			},
			std:  []string{"strconv"},
			want: []string{"fencing → go.etcd.io/etcd/client/v3"},
		},
		{
			name:  "fencing on the standard library",
			rule:  "fencing depends on the standard library only",
			root:  m + "fencing",
			edges: map[string][]string{m + "fencing": {"strconv", "errors"}},
			std:   []string{"strconv", "errors"},
		},
		{
			name: "fencing on net, which uses cgo",
			rule: "fencing depends on the standard library only",
			root: m + "fencing",
			edges: map[string][]string{
				m + "fencing": {"net/http"},
				"net/http":    {"net"},
				"net":         {"C"},
			},
			std: []string{"net/http", "net"},
		},
		{
			name:  "fencing using cgo itself",
			rule:  "fencing depends on the standard library only",
			root:  m + "fencing",
			edges: map[string][]string{m + "fencing": {"C", "errors"}},
			std:   []string{"errors"},
			want:  []string{"fencing → C"},
		},
		{
			name: "intent reaching gRPC through fencing",
			rule: "intent depends on the standard library and fencing only",
			root: m + "intent",
			edges: map[string][]string{
				m + "intent":  {m + "fencing", "errors"},
				m + "fencing": {"google.golang.org/grpc/metadata"},
			},
			std:  []string{"errors"},
			want: []string{"intent → fencing → google.golang.org/grpc/metadata"},
		},
		{
			name: "machine reaching etcd through a helper",
			rule: "machine depends on intent, fencing and the standard library only",
			root: m + "internal/core/machine",
			edges: map[string][]string{
				m + "internal/core/machine":   {m + "intent", m + "internal/core/traceattr", "time"},
				m + "intent":                  {m + "fencing"},
				m + "internal/core/traceattr": {"go.etcd.io/etcd/client/v3"},
				"go.etcd.io/etcd/client/v3":   {"time"},
			},
			std:  []string{"time"},
			want: []string{"internal/core/machine → internal/core/traceattr"},
		},
		{
			name:  "machine importing gRPC",
			rule:  "machine depends on intent, fencing and the standard library only",
			root:  m + "internal/core/machine",
			edges: map[string][]string{m + "internal/core/machine": {m + "intent", "google.golang.org/grpc/status"}},
			want:  []string{"internal/core/machine → google.golang.org/grpc/status"},
		},
		{
			name:  "machine on intent and fencing",
			rule:  "machine depends on intent, fencing and the standard library only",
			root:  m + "internal/core/machine",
			edges: map[string][]string{m + "internal/core/machine": {m + "intent", m + "fencing", "time"}, m + "intent": {m + "fencing"}},
			std:   []string{"time"},
		},
		{
			name: "server reaching etcd through a helper",
			rule: "server depends on no etcd package",
			root: m + "server",
			edges: map[string][]string{
				m + "server":                {m + "gen/intent/v1", m + "internal/health"},
				m + "internal/health":       {"go.etcd.io/etcd/client/v3"},
				"go.etcd.io/etcd/client/v3": {"go.etcd.io/etcd/api/v3/mvccpb"},
			},
			want: []string{"server → internal/health → go.etcd.io/etcd/client/v3"},
		},
		{
			name:  "server importing etcdstore",
			rule:  "server does not depend on etcdstore",
			root:  m + "server",
			edges: map[string][]string{m + "server": {m + "etcdstore"}},
			want:  []string{"server → etcdstore"},
		},
		{
			name:  "etcdstore importing status",
			rule:  "etcdstore does not import gRPC codes or status",
			root:  m + "etcdstore",
			edges: map[string][]string{m + "etcdstore": {"go.etcd.io/etcd/client/v3", "google.golang.org/grpc/status"}},
			want:  []string{"etcdstore → google.golang.org/grpc/status"},
		},
		{
			name: "etcdstore reaching codes only through the etcd client",
			rule: "etcdstore does not import gRPC codes or status",
			root: m + "etcdstore",
			edges: map[string][]string{
				m + "etcdstore":             {"go.etcd.io/etcd/client/v3"},
				"go.etcd.io/etcd/client/v3": {"google.golang.org/grpc/codes"},
			},
		},
		{
			name: "etcdstore reaching gen",
			rule: "etcdstore depends neither on server nor on gen",
			root: m + "etcdstore/etcdfence",
			edges: map[string][]string{
				m + "etcdstore/etcdfence": {m + "intent"},
				m + "intent":              {m + "gen/intent/v1"},
			},
			want: []string{"etcdstore/etcdfence → intent → gen/intent/v1"},
		},
		{
			name: "client importing server and etcdstore",
			rule: "client depends neither on server nor on etcdstore",
			root: m + "client",
			edges: map[string][]string{
				m + "client": {m + "gen/intent/v1", m + "server", m + "etcdstore"},
				m + "server": {m + "etcdstore"},
			},
			want: []string{"client → server", "client → etcdstore"},
		},
		{
			name:  "gen importing the domain",
			rule:  "gen depends on nothing of intentd outside gen",
			root:  m + "gen/intent/v1",
			edges: map[string][]string{m + "gen/intent/v1": {"google.golang.org/protobuf/proto", m + "intent"}},
			want:  []string{"gen/intent/v1 → intent"},
		},
		{
			name:  "the e2e harness importing the daemon",
			rule:  "e2e is a black box",
			root:  m + "e2e/harness",
			edges: map[string][]string{m + "e2e/harness": {m + "internal/run/daemon"}},
			want:  []string{"e2e/harness → internal/run/daemon"},
		},
		{
			name:  "a CLI importing etcdstore",
			rule:  "only commands, internal/run/daemon, internal/run/intentdcmd and internal/testing/intentdtest depend on etcdstore",
			root:  m + "internal/admin",
			edges: map[string][]string{m + "internal/admin": {m + "etcdstore"}},
			want:  []string{"internal/admin → etcdstore"},
		},
		{
			name:  "the daemon starting intentd as a test does",
			rule:  "no product package depends on the test helpers of internal/testing",
			root:  m + "internal/run/daemon",
			edges: map[string][]string{m + "internal/run/daemon": {m + "internal/testing/intentdtest"}, m + "internal/testing/intentdtest": {m + "internal/testing/etcdtest"}},
			want:  []string{"internal/run/daemon → internal/testing/intentdtest"},
		},
		{
			name:  "the store reaching the composition root does",
			rule:  "only commands and the test helpers depend on the composition root internal/run",
			root:  m + "etcdstore",
			edges: map[string][]string{m + "etcdstore": {m + "internal/core/bytelru", m + "internal/run/embedetcd"}},
			want:  []string{"etcdstore → internal/run/embedetcd"},
		},
		{
			name:  "the core reaching the store does",
			rule:  "internal/core is the ground floor: no other floor, no store, no server, no client",
			root:  m + "internal/core/vocab",
			edges: map[string][]string{m + "internal/core/vocab": {m + "etcdstore"}},
			want:  []string{"internal/core/vocab → etcdstore"},
		},
		{
			name:  "a package outside the four floors is refused",
			rule:  "internal/ holds four floors: core, run, testing and checks",
			root:  m + "internal/misc",
			edges: map[string][]string{m + "internal/misc": {"fmt"}},
			std:   []string{"fmt"},
			want:  []string{"internal/misc → fmt"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ruleNamed(t, tc.rule)
			if !r.covers(tc.root) {
				t.Fatalf("rule %q does not cover %s", tc.rule, tc.root)
			}
			var got []string
			for _, c := range violations(fake(tc.edges, tc.std...), tc.root, r) {
				got = append(got, short(c))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("violations = %q, want %q", got, tc.want)
			}
		})
	}
}
