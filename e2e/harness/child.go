package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// childEnv carries a worker child's spec (JSON) to the test binary
// re-executed as that child.
const childEnv = "INTENTD_E2E_WORKER_CHILD"

// ChildCommand is the test binary re-executed as a worker child: it runs
// the suite's TestWorkerProcess only, with spec (JSON-encoded) for
// ChildSpec to read, and ends after timeout at the latest. A suite's worker
// is a real process, so that a scenario can SIGSTOP and SIGKILL it as a
// real worker is; start it with StartProcess.
func ChildCommand(spec any, timeout time.Duration) (*exec.Cmd, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("harness: worker child spec: %w", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1", "-test.timeout="+timeout.String())
	cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	return cmd, nil
}

// InChild reports whether this test binary runs as a worker child.
func InChild() bool { return os.Getenv(childEnv) != "" }

// ChildSpec decodes the spec ChildCommand gave this worker child into v; it
// reports false in the parent (TestWorkerProcess then does nothing).
func ChildSpec(v any) (bool, error) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return false, nil
	}
	if err := json.Unmarshal([]byte(raw), v); err != nil {
		return true, fmt.Errorf("harness: %s: %w", childEnv, err)
	}
	return true, nil
}
