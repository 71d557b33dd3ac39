package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The wheel's declared floors (python/pyproject.toml) are the runtimes
// python-env.sh pins for the "pb6" entry and generates the stubs for: a
// floor lower than what the stubs check at import would let pip install a
// runtime they refuse.
func TestPythonFloorsAreThePinnedOnes(t *testing.T) {
	pyproject := read(t, "../python/pyproject.toml")
	for _, c := range []struct{ pkg, floorVar string }{
		{"protobuf", "PROTOBUF_FLOOR"},
		{"grpcio", "GRPCIO_FLOOR"},
	} {
		floor := scriptVar(t, "python-env.sh", c.floorVar)
		want := `"` + c.pkg + `>=` + floor + `,`
		if !strings.Contains(pyproject, want) {
			t.Errorf("python/pyproject.toml does not declare %s>=%s (python-env.sh's %s)", c.pkg, floor, c.floorVar)
		}
	}
	stubs := read(t, "../python/stubs/intent/v1/intent_pb2_grpc.py")
	grpcFloor := scriptVar(t, "python-env.sh", "GRPCIO_FLOOR")
	if !strings.Contains(stubs, "GRPC_GENERATED_VERSION = '"+grpcFloor+"'") {
		t.Errorf("python/stubs were not generated for grpcio %s: regenerate with scripts/python-gen.sh", grpcFloor)
	}
	pb := read(t, "../python/stubs/intent/v1/intent_pb2.py")
	m := regexp.MustCompile(`Protobuf Python Version: (\S+)`).FindStringSubmatch(pb)
	if m == nil || m[1] != scriptVar(t, "python-env.sh", "PROTOBUF_FLOOR") {
		t.Errorf("python/stubs' protobuf gencode version %v is not PROTOBUF_FLOOR", m)
	}
}

// Every entry python-test.sh runs names an environment python-env.sh
// builds, and each pins exact versions.
func TestPythonEnvironmentsArePinned(t *testing.T) {
	for _, name := range []string{"gen", "build", "pb6", "pb7", "frameworks", "coinstall"} {
		out, err := exec.Command("bash", "python-env.sh", "--pins", name).Output()
		if err != nil {
			t.Fatalf("python-env.sh --pins %s: %v", name, err)
		}
		for _, line := range strings.Fields(string(out)) {
			if !regexp.MustCompile(`^[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*$`).MatchString(line) {
				t.Errorf("python-env.sh --pins %s: %q is not pinned to an exact version", name, line)
			}
		}
	}
}

// Where the package index cannot be reached, an environment is not built
// and the script says "skipped: <why>" with exit status 3, which
// python-test.sh passes on as a skip, never as a pass.
func TestPythonEnvSaysSkippedWithoutTheIndex(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	if exec.Command("python3", "-c", "import sys; sys.exit(sys.version_info < (3, 11))").Run() != nil {
		t.Skip("python3 is older than 3.11")
	}
	cache := t.TempDir()
	cmd := exec.Command("bash", "python-env.sh", "pb7")
	cmd.Env = append(os.Environ(),
		"INTENTD_CACHE="+cache,
		"PIP_INDEX_URL=http://127.0.0.1:9/simple", // discard: nothing answers
		"PIP_FIND_LINKS=", "PIP_NO_INDEX=", "PIP_RETRIES=0")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 {
		t.Fatalf("python-env.sh without an index: %v, want exit status 3; output:\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^skipped: python environment pb7: the Python package index cannot be reached`).Match(out) {
		t.Errorf("no skipped line:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(cache, "python", "pb7")); !os.IsNotExist(err) {
		t.Errorf("a half-built environment was left behind: %v", err)
	}
}
