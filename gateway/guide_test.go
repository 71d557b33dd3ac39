package gateway_test

import (
	"context"
	"encoding/json"
	"go/format"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/intentd/intentd/gateway"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// The addresses docs/GATEWAY.md names; the test runs its blocks on ports
// of its own.
const (
	guideIntentd = "127.0.0.1:7650"
	guideGateway = "127.0.0.1:7660"
	guideCourier = "127.0.0.1:7670"
)

// block is the one fenced block between <!-- name:begin --> and
// <!-- name:end --> of docs/GATEWAY.md, without its fence.
func block(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/GATEWAY.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	if n := strings.Count(text, begin); n != 1 {
		t.Fatalf("docs/GATEWAY.md has %d %s blocks, want 1", n, name)
	}
	_, rest, _ := strings.Cut(text, begin)
	body, _, ok := strings.Cut(rest, end)
	if !ok {
		t.Fatalf("the %s block has no end", name)
	}
	body = strings.TrimSpace(body)
	fence, body, _ := strings.Cut(body, "\n")
	if !strings.HasPrefix(fence, "```") || !strings.HasSuffix(body, "```") {
		t.Fatalf("the %s block is not one fenced code block", name)
	}
	return strings.TrimSuffix(body, "```")
}

// TestGuideDemo runs docs/GATEWAY.md as a reader does: intentd, the
// gateway with the guide's config file, and the guide's program, saved and
// run from the repository root; it must print exactly what the guide shows.
func TestGuideDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	src, want := block(t, "gateway-demo"), block(t, "gateway-demo-output")
	if formatted, err := format.Source([]byte(src)); err != nil || string(formatted) != src {
		t.Fatalf("the guide's program is not gofmt'd Go (%v)", err)
	}
	for _, a := range []string{guideIntentd, guideCourier} {
		if strings.Count(src, a) != 1 {
			t.Fatalf("the guide's program names %s %d times, want once", a, strings.Count(src, a))
		}
	}
	courier := freeport.Addr(t)
	conf := strings.Replace(block(t, "gateway-config"), guideCourier, courier, 1)
	j, err := yaml.YAMLToJSON([]byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]json.RawMessage
	if err := json.Unmarshal(j, &file); err != nil {
		t.Fatal(err)
	}
	ups, err := gateway.ParseUpstreams(file["upstreams"])
	if err != nil {
		t.Fatalf("the guide's config: %v", err)
	}
	in := intentdtest.Start(t, intentdtest.Config(t.TempDir()), slog.New(slog.DiscardHandler))
	g, err := gateway.New(gateway.Config{Upstreams: ups}, in.Dial(t))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })

	prog := strings.NewReplacer(guideIntentd, in.Addr, guideGateway, lis.Addr().String(), guideCourier, courier).Replace(src)
	main := filepath.Join(t.TempDir(), "gateway-demo", "main.go")
	if err := os.MkdirAll(filepath.Dir(main), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(main, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", main)
	cmd.Dir = ".." // the repository root, as the guide says
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the guide's program: %v\n%s", err, out)
	}
	if string(out) != want {
		t.Errorf("the guide's program printed\n%s\nthe guide shows\n%s", out, want)
	}
}
