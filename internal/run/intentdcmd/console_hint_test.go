package intentdcmd

import (
	"strings"
	"testing"

	"github.com/intentd/intentd/internal/run/daemon"
)

// TestNextStepsGivesTheConsolesOwnListener: with --console-listen the
// console is there, not on the metrics listener, and the line intentd
// prints once it serves says so.
func TestNextStepsGivesTheConsolesOwnListener(t *testing.T) {
	for _, tc := range []struct{ console, metrics, want, not string }{
		{"127.0.0.1:7653", "127.0.0.1:7651", "Review console: http://127.0.0.1:7653/console/", "7651/console/"},
		{"0.0.0.0:7653", "", "Review console: http://127.0.0.1:7653/console/", ""},
		{"", "127.0.0.1:7651", "Review console: http://127.0.0.1:7651/console/", ""},
	} {
		cfg := daemon.DefaultConfig()
		cfg.ConsoleListen, cfg.MetricsListen = tc.console, tc.metrics
		line, _, _ := strings.Cut(nextSteps("127.0.0.1:7650", cfg), "\n")
		if !strings.Contains(line, tc.want) || (tc.not != "" && strings.Contains(line, tc.not)) {
			t.Errorf("--console-listen %q --metrics-listen %q: first line %q, want it to hold %q (and not %q)", tc.console, tc.metrics, line, tc.want, tc.not)
		}
	}
}
