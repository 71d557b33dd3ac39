// Package version says which build of intentd and intentctl is running.
//
// Release builds stamp it at link time (deploy/Dockerfile, deploy/build.sh):
//
//	go build -ldflags "-X github.com/intentd/intentd/internal/run/version.Version=v1.2.3" ./cmd/intentd
//
// An unstamped build reports the module version and VCS revision Go
// recorded in the binary, so `go install …@v1.2.3` and a build from a
// checkout still say something true.
package version

import (
	"runtime/debug"
	"strings"
)

// Version is set with -ldflags -X by release builds; empty otherwise.
var Version string

// String is the version to print: the stamped one, else what the Go build
// recorded (module version, or the VCS revision with "+dirty" when the tree
// had changes), else "dev".
func String() string {
	if Version != "" {
		return Version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return "dev"
	}
	return "dev-" + strings.TrimSpace(rev[:min(12, len(rev))]) + dirty
}
