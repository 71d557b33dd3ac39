package daemon_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/daemon"
)

// TestReadmeTour runs the grpcurl tour, verbatim, against a fresh intentd:
// the blocks of README.md, then those of docs/CONSOLE.md, which continue
// the README's shell with the review queue and a watch. It checks that each
// step shows what the text says it shows: a document that drifts from the
// product fails here. It runs the tour
// twice against the same intentd: a reader following it a second time used
// to meet the first run's intents (MarkUnknown refused on a COMPLETED
// intent), so each run must use fresh keys.
//
// A reader reaches the Watch example minutes after intentd started, when
// the embedded etcd has compacted its early history: the README's watch
// from "start_revision": "1" answered REVISION_COMPACTED to everyone who
// tried it. So this intentd compacts every second, and the tour starts
// only once revision 1 is compacted away.
func TestReadmeTour(t *testing.T) {
	root := repoRoot(t)
	needGrpcurl(t, root)
	script := docBlocks(t, root, "tour", "README.md", "docs/CONSOLE.md")
	if !strings.Contains(script, `"ttl": "300s"`) {
		t.Errorf("the tour's session TTL is not 300s: a reader slower than a minute lost the session")
	}

	cfg := testConfig(t.TempDir())
	cfg.EmbedCompaction = daemon.Compaction{Mode: "periodic", Retention: "1s"}
	in := start(t, cfg)
	waitCompactedPast(t, in, 1)
	for run := 1; run <= 2; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "ADDR="+in.addr)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("run %d of the tour failed: %v\n%s", run, err, out.String())
		}
		got := out.String()
		for _, want := range []string{
			`"created": true`,
			`"outcome": "OUTCOME_EXECUTE"`,
			`"actionTaken": "recorded"`,
			`"outcome": "OUTCOME_COMPLETED"`,
			`"actionTaken": "none"`,
			`already_completed: intent purchase-lamp-`,
			`"reason": "STALE_TOKEN"`,
			`"reason": "FINGERPRINT_MISMATCH"`,
			`"accepted": false`,
			`"state": "STATE_NEEDS_REVIEW"`,
			`already_completed: intent refund-`,
			`"refund_id": "re_123"`,
			`"type": "TYPE_PUT"`, // the watch from the revision just read
		} {
			if !strings.Contains(got, want) {
				t.Errorf("run %d: tour output lacks %s\n--- output ---\n%s", run, want, got)
			}
		}
		if strings.Contains(got, "REVISION_COMPACTED") {
			t.Errorf("run %d: the tour met REVISION_COMPACTED\n--- output ---\n%s", run, got)
		}
	}
}

// waitCompactedPast waits until the embedded etcd of in has compacted
// revision rev away: a Watch from it answers REVISION_COMPACTED.
func waitCompactedPast(t *testing.T, in *instance, rev int64) {
	t.Helper()
	c := intentv1.NewIntentServiceClient(in.conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var err error
		if w, werr := c.Watch(ctx, &intentv1.WatchRequest{StartRevision: rev}); werr != nil {
			err = werr
		} else {
			_, err = w.Recv()
		}
		cancel()
		if st, ok := status.FromError(err); ok && st.Code() == codes.FailedPrecondition {
			for _, d := range st.Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == "REVISION_COMPACTED" {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d still not compacted after 30s (last answer: %v)", rev, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestReadmeSecure runs the "Running securely" blocks of docs/SECURITY.md
// (once the README's) as written: the credentials block, then the intentd command in the
// background, then the calls each principal makes. They used to fail as
// written: an approver's token was used to read the review queue (refused:
// List needs reviewer or reader), and $TOKEN clobbered the tour's fencing
// token. The one change made to the text is the listen address, a free
// loopback port instead of 0.0.0.0:7650; the embedded etcd's ports and data
// directory come from INTENTD_* variables, which the command line leaves
// unset.
func TestReadmeSecure(t *testing.T) {
	root := repoRoot(t)
	needGrpcurl(t, root)
	setup := docBlocks(t, root, "secure-setup", "docs/SECURITY.md")
	serve := docBlocks(t, root, "secure-serve", "docs/SECURITY.md")
	use := docBlocks(t, root, "secure-use", "docs/SECURITY.md")
	const listen = "0.0.0.0:7650"
	if !strings.Contains(serve, listen) {
		t.Fatalf("the secure intentd command does not listen on %s:\n%s", listen, serve)
	}
	addr := freeport.Addr(t)
	serve = strings.Replace(serve, listen, addr, 1)

	// The blocks run from a directory shaped like the repository root: the
	// binaries in ./bin, built as docs/OPERATIONS.md's "Running intentd" says.
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/intentd", "./cmd/intentctl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if err := os.Symlink(filepath.Join(root, "bin", "grpcurl"), filepath.Join(bin, "grpcurl")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "serve.sh"), []byte(serve), 0o600); err != nil {
		t.Fatal(err)
	}
	script := setup + `
bash serve.sh > serve.log 2>&1 &
for i in $(seq 300); do grep -q '^intentd: serving on' serve.log && break; sleep 0.1; done
grep '^intentd: serving on' serve.log || { cat serve.log; exit 1; }
` + use

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ADDR="+addr,
		"INTENTD_DATA_DIR="+filepath.Join(dir, "data"),
		"INTENTD_EMBED_CLIENT_URL=http://127.0.0.1:0", "INTENTD_EMBED_PEER_URL=http://127.0.0.1:0",
		"INTENTD_METRICS_LISTEN=")
	// intentd runs in the script's process group: stop them all at the end.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second // should intentd still hold an output pipe
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Before t.TempDir removes the data dir, intentd (a grandchild) must
	// have stopped writing to it: wait until the group is empty.
	t.Cleanup(func() { stopGroup(t, cmd.Process.Pid) })
	if err := cmd.Wait(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
		t.Fatalf("the secure blocks failed: %v\n%s\n--- intentd ---\n%s", err, out.String(), log)
	}
	// protojson (grpcurl) varies its spacing on purpose, from one build to
	// another, and intentctl aligns its columns: compare with one space
	// after each colon.
	got := regexp.MustCompile(`:[ \t]+`).ReplaceAllString(out.String(), `: `)
	for _, want := range []string{
		`"created": true`,         // the approver registered
		"\nstate: PENDING\n",      // the reviewer read it
		"(no intents)",            // ops-1, by certificate, read the review queue
		"code: PERMISSION_DENIED", // the approver may not read
	} {
		if !strings.Contains(got, want) {
			t.Errorf("secure blocks' output lacks %s\n--- output ---\n%s", want, got)
		}
	}
}

// stopGroup sends SIGTERM to process group pgid and waits until none of its
// processes is left, killing them after 15s.
func stopGroup(t *testing.T, pgid int) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(15 * time.Second)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			t.Errorf("process group %d ignored SIGTERM for 15s; killed", pgid)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			time.Sleep(time.Second)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func needGrpcurl(t *testing.T, root string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, "bin", "grpcurl")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("bin/grpcurl missing in CI: scripts/install-tools.sh must install it: %v", err)
		}
		t.Skip("bin/grpcurl not installed; run ./scripts/install-tools.sh")
	}
}

// docBlocks joins the shell blocks between the markers <!-- name:begin -->
// and <!-- name:end --> of each of files (paths from the repository root),
// in order: later blocks continue in the shell of the earlier ones. Each
// file must hold at least one such block, so that a block moved elsewhere
// fails the test instead of leaving it nothing to run.
func docBlocks(t *testing.T, root, name string, files ...string) string {
	t.Helper()
	if len(files) == 0 {
		t.Fatalf("docBlocks(%s): no file named", name)
	}
	var blocks []string
	for _, file := range files {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		doc := string(b)
		found := 0
		for {
			_, rest, ok := strings.Cut(doc, "<!-- "+name+":begin -->")
			if !ok {
				break
			}
			block, after, ok := strings.Cut(rest, "<!-- "+name+":end -->")
			if !ok {
				t.Fatalf("%s: a %s block has no end marker", file, name)
			}
			block = strings.TrimSpace(block)
			block = strings.TrimPrefix(block, "```sh")
			blocks = append(blocks, strings.TrimSuffix(block, "```"))
			found++
			doc = after
		}
		if found == 0 {
			t.Fatalf("%s has no %s markers", file, name)
		}
	}
	return strings.Join(blocks, "\n")
}
