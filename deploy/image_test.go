package deploy

import (
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// stages parses deploy/Dockerfile as BuildKit does.
func stages(t *testing.T) []instructions.Stage {
	t.Helper()
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ast, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("parse Dockerfile: %v", err)
	}
	st, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		t.Fatalf("Dockerfile instructions: %v", err)
	}
	if len(st) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a runtime stage", len(st))
	}
	return st
}

// pinnedRef is an image reference a rebuild cannot silently move: a digest,
// or an exact three-part version tag (golang:1.26.8-trixie, not golang:1.26
// or :latest).
var pinnedRef = regexp.MustCompile(`^[a-z0-9./-]+(:[0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9._-]*)?(@sha256:[0-9a-f]{64})?$`)

func TestDockerfileBasesArePinned(t *testing.T) {
	st := stages(t)
	var names []string
	for _, s := range st {
		base := s.BaseName
		switch {
		case base == "scratch", slices.Contains(names, base):
		case !pinnedRef.MatchString(base) || !strings.ContainsAny(base, ":@"):
			t.Errorf("stage %q: FROM %s is not pinned (want an exact x.y.z tag or a @sha256 digest)", s.Name, base)
		}
		names = append(names, s.Name)
	}
}

// The runtime stage: static binaries FROM scratch, a numeric non-root user
// (Kubernetes' runAsNonRoot cannot check a user name without /etc/passwd),
// intentd as the entrypoint.
func TestDockerfileRuntimeIsNonRootAndStatic(t *testing.T) {
	st := stages(t)
	build, final := st[0], st[len(st)-1]
	if final.BaseName != "scratch" {
		t.Errorf("runtime stage FROM %s, want scratch (the binaries are static)", final.BaseName)
	}
	var user string
	var entrypoint []string
	var copied []string
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			entrypoint = c.CmdLine
			if c.PrependShell {
				t.Errorf("ENTRYPOINT %v is shell form; scratch has no shell", c.CmdLine)
			}
		case *instructions.CopyCommand:
			if c.From == build.Name {
				copied = append(copied, c.SourcePaths...)
			}
		case *instructions.RunCommand:
			t.Errorf("runtime stage RUN %v: scratch has no shell to run it", c.CmdLine)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("runtime USER %q, want a numeric non-zero uid", user)
	}
	for _, bin := range []string{"/out/intentd", "/out/intentctl"} {
		if !slices.Contains(copied, bin) {
			t.Errorf("runtime stage copies %v from %q, want %s among them", copied, build.Name, bin)
		}
	}
	if len(entrypoint) != 1 || entrypoint[0] != "/usr/local/bin/intentd" {
		t.Errorf("ENTRYPOINT %v, want [/usr/local/bin/intentd]", entrypoint)
	}

	// What CI checks (deploy/build.sh: CGO_ENABLED=0, no ELF interpreter,
	// version stamped) is what the build stage runs.
	var runsBuildScript bool
	for _, c := range build.Commands {
		if r, ok := c.(*instructions.RunCommand); ok && strings.Contains(strings.Join(r.CmdLine, " "), "./deploy/build.sh") {
			runsBuildScript = true
		}
	}
	if !runsBuildScript {
		t.Errorf("build stage %q does not RUN ./deploy/build.sh", build.Name)
	}
}

// The HEALTHCHECK probes intentd's own HTTP endpoint on the port the image
// configures for it, in exec form (no shell in scratch).
func TestDockerfileHealthcheckProbesReadyz(t *testing.T) {
	st := stages(t)
	final := st[len(st)-1]
	env := map[string]string{}
	var test []string
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env[kv.Key] = kv.Value
			}
		case *instructions.HealthCheckCommand:
			test = c.Health.Test
		}
	}
	if len(test) < 2 || test[0] != "CMD" {
		t.Fatalf("HEALTHCHECK test %q, want exec form [CMD …]", test)
	}
	if test[1] != "/usr/local/bin/intentctl" || !slices.Contains(test, "probe") {
		t.Fatalf("HEALTHCHECK runs %q, want /usr/local/bin/intentctl probe URL", test)
	}
	_, port, err := net.SplitHostPort(env["INTENTD_METRICS_LISTEN"])
	if err != nil {
		t.Fatalf("ENV INTENTD_METRICS_LISTEN=%q: %v", env["INTENTD_METRICS_LISTEN"], err)
	}
	url := test[len(test)-1]
	if want := "http://127.0.0.1:" + port + "/readyz"; url != want {
		t.Errorf("HEALTHCHECK probes %s, want %s (the metrics listener the image configures)", url, want)
	}
}
