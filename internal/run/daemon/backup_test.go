package daemon_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/run/devcerts"
)

// runBlock runs a document's shell block with bash in dir, with ./bin
// first on PATH and env added.
func runBlock(t *testing.T, root, dir, script string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append(env, "PATH="+filepath.Join(root, "bin")+":"+os.Getenv("PATH"))...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n--- script ---\n%s\n--- output ---\n%s", err, script, out.String())
	}
}

// Regression: the README's backup command, `etcdctl --endpoints
// 127.0.0.1:2379 snapshot save`, relied on the embedded etcd's open TCP
// port, which secure mode now closes. The backup and restore blocks (now
// in docs/BACKUP.md), run as written against an intentd with TLS, a client CA and a
// tokens file, must save a snapshot through the socket and restore it: the
// intent registered before the backup is back, the one after it is gone,
// and tokens continue above the revision bump.
func TestBackupAndRestoreInSecureMode(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"etcdctl", "etcdutl"} {
		if _, err := os.Stat(filepath.Join(root, "bin", tool)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("bin/%s missing in CI: scripts/install-tools.sh must build it: %v", tool, err)
			}
			t.Skipf("bin/%s not installed; run ./scripts/install-tools.sh", tool)
		}
	}
	backup, restore := docBlocks(t, root, "backup", "docs/BACKUP.md"), docBlocks(t, root, "restore", "docs/BACKUP.md")

	dir := t.TempDir()
	pki := generate(t, filepath.Join(dir, "pki"), devcerts.Options{Clients: []string{"ops-1"}})
	tokens := filepath.Join(dir, "tokens.json")
	const token = "backup-admin-token-7d2f"
	writeTokensFile(t, tokens, tokenEntry("admin-1", "admin", token))
	data := filepath.Join(dir, "data")
	cfg := testConfig(data)
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, cfg.TLSClientAuth = pki.Server.Cert, pki.Server.Key, pki.CA.Cert, "optional"
	cfg.TokensFile = tokens
	env := []string{"DATA_DIR=" + data}
	work := t.TempDir() // where the commands run and the snapshot lands

	register := func(in *instance, key string) {
		t.Helper()
		c := intentv1.NewIntentServiceClient(dialWith(t, in.addr, tlsTo(t, pki, "")))
		if _, err := c.Register(bearerCall(t, token), &intentv1.RegisterRequest{Key: key, Params: params(t, 1)}); err != nil {
			t.Fatalf("Register %s: %v", key, err)
		}
	}
	in := start(t, cfg)
	register(in, "before-backup")
	runBlock(t, root, work, backup, env...)
	register(in, "after-backup")
	in.shutdown(t)

	runBlock(t, root, work, restore, env...)
	in = start(t, cfg)
	c := intentv1.NewIntentServiceClient(dialWith(t, in.addr, tlsTo(t, pki, "")))
	if _, err := c.Get(bearerCall(t, token), &intentv1.GetRequest{Key: "before-backup"}); err != nil {
		t.Errorf("Get before-backup after the restore: %v, want it back", err)
	}
	if _, err := c.Get(bearerCall(t, token), &intentv1.GetRequest{Key: "after-backup"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get after-backup after the restore: %v, want NOT_FOUND (registered after the snapshot)", err)
	}
	sess, err := c.OpenSession(bearerCall(t, token), &intentv1.OpenSessionRequest{Worker: "w-1"})
	if err != nil {
		t.Fatal(err)
	}
	acq, err := c.Acquire(bearerCall(t, token), &intentv1.AcquireRequest{Key: "before-backup", SessionId: sess.GetSessionId(), RequestId: "r-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := acq.GetLease().GetToken(); got <= 1_000_000_000 {
		t.Errorf("token after the restore = %d, want above the bump of 1000000000", got)
	}
}
