package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Release is one line of the repository's RELEASES file: a released
// version, its commit, and the newest storage format it reads.
type Release struct {
	Version string
	Commit  string
	Format  int
}

// Releases reads RELEASES at the root of the intentd module, oldest
// first.
func Releases() ([]Release, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(root, "RELEASES"))
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	defer f.Close()
	var out []Release
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 || len(fields[1]) != 40 {
			return nil, fmt.Errorf("harness: RELEASES:%d: %q: want \"<version> <40-digit commit> <format>\"", n, line)
		}
		format, err := strconv.Atoi(fields[2])
		if err != nil || format < 1 {
			return nil, fmt.Errorf("harness: RELEASES:%d: format %q: want a number from 1", n, fields[2])
		}
		out = append(out, Release{Version: fields[0], Commit: fields[1], Format: format})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("harness: RELEASES: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("harness: RELEASES lists no release")
	}
	return out, nil
}

// BuildRelease builds cmd/intentd of r from source into dir: its commit's
// tree, taken from the repository's history with git archive (so the
// repository must hold that commit: CI checks out the whole history),
// stamped with r.Version. It fails, never skips, when the commit is not
// there: the test then tells the operator's upgrade path from nothing.
func BuildRelease(r Release, dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", r.Commit+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: release %s: commit %s is not in the repository at %s (a shallow clone? fetch the whole history: git fetch --unshallow): %v %s",
			r.Version, r.Commit, root, err, bytes.TrimSpace(out))
	}
	src := filepath.Join(dir, "src-"+r.Version)
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", r.Commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", err
	}
	untar.Stdin = pipe
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return "", fmt.Errorf("harness: tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return "", fmt.Errorf("harness: git archive %s: %v %s", r.Commit, err, archiveErr.Bytes())
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("harness: tar -x of %s: %v %s", r.Commit, err, untarErr.Bytes())
	}
	bin := filepath.Join(dir, "intentd-"+r.Version)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin,
		"-ldflags", "-X github.com/intentd/intentd/internal/run/version.Version="+r.Version, "./cmd/intentd")
	build.Dir = src
	// The release's own go.mod, never a workspace around the checkout.
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: building release %s (%s) in %s: %v\n%s", r.Version, r.Commit, src, err, out)
	}
	return bin, nil
}

// SetBinary makes the replica run bin from its next Restart on (a rolling
// upgrade: Stop, SetBinary, Restart), with the same address, data
// directory and flags.
func (d *Intentd) SetBinary(bin string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.bin = bin
}

// Binary is what the replica runs (or will at its next Restart).
func (d *Intentd) Binary() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bin
}

// Logs is the tail of the replica's output, its last n lines.
func (d *Intentd) Logs(n int) string { return d.logs.Tail(n) }
