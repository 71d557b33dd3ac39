package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/run/devcerts"
)

// rawRange reads every key through etcd's HTTP gateway (POST /v3/kv/range
// from "\x00" to "\x00": the whole key space) over conn's transport, as
// any local process could: it returns the response body.
func rawRange(t *testing.T, client *http.Client, url string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v3/kv/range", strings.NewReader(`{"key": "AA==", "range_end": "AA=="}`))
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("HTTP %s", resp.Status)
	}
	return string(b), err
}

// rawKV calls etcd's gRPC KV API on target through fn, on a connection of
// its own and without any credentials.
func rawKV(t *testing.T, target string, fn func(context.Context, pb.KVClient) error) error {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return fn(ctx, pb.NewKVClient(conn))
}

// rawPut writes a key through etcd's gRPC KV API on target.
func rawPut(t *testing.T, target string) error {
	t.Helper()
	return rawKV(t, target, func(ctx context.Context, kv pb.KVClient) error {
		_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("/intentd/v1/t/acme/i/forged"), Value: []byte(`{"state": 4}`)})
		return err
	})
}

// rawGet reads one key through etcd's gRPC KV API on target.
func rawGet(t *testing.T, target string) error {
	t.Helper()
	return rawKV(t, target, func(ctx context.Context, kv pb.KVClient) error {
		_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("/intentd/v1/")})
		return err
	})
}

// unixHTTP is an HTTP client that reaches sock whatever the URL says.
func unixHTTP(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// Regression: with TLS, a client CA and a tokens file, the embedded etcd
// still served plaintext on 127.0.0.1:2379 with no authentication, so any
// local process could read every record (POST /v3/kv/range) and forge
// others (/v3/kv/put), around tokens, roles, tenants and fencing. Now,
// whenever intentd runs with credentials, its etcd serves only a unix
// socket of mode 0600 in the private data directory: nothing answers on
// the TCP client URL or the peer URL, and another user cannot connect to
// the socket (checked as user nobody when the test runs as root). Without
// credentials (development on loopback) the TCP client URL stays open.
func TestSecureModeEmbeddedEtcdRefusesUnauthenticated(t *testing.T) {
	dir := t.TempDir()
	pki := generate(t, filepath.Join(dir, "pki"), devcerts.Options{Clients: []string{"ops-1"}})
	tokens := filepath.Join(dir, "tokens.json")
	writeTokensFile(t, tokens, tokenEntry("admin-1", "admin", "embed-admin-token-4c1e"))
	for _, tc := range []struct {
		name   string
		secure func(*daemon.Config)
		open   bool // whether the TCP client URL may answer
	}{
		{"no credentials", func(*daemon.Config) {}, true},
		{"tokens file", func(c *daemon.Config) { c.TokensFile = tokens }, false},
		{"TLS", func(c *daemon.Config) { c.TLSCert, c.TLSKey = pki.Server.Cert, pki.Server.Key }, false},
		{"TLS, client CA and tokens file", func(c *daemon.Config) {
			c.TLSCert, c.TLSKey, c.TLSClientCA, c.TLSClientAuth = pki.Server.Cert, pki.Server.Key, pki.CA.Cert, "optional"
			c.TokensFile = tokens
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			cfg := testConfig(data)
			clientAddr, peerAddr := freeport.Addr(t), freeport.Addr(t)
			cfg.EmbedClientURL, cfg.EmbedPeerURL = "http://"+clientAddr, "http://"+peerAddr
			tc.secure(&cfg)
			runLogged(t, cfg)

			body, err := rawRange(t, http.DefaultClient, "http://"+clientAddr)
			switch {
			case tc.open && err != nil:
				t.Fatalf("raw range on %s without credentials: %v, want the development listener to answer", clientAddr, err)
			case !tc.open && err == nil:
				t.Fatalf("raw range on %s with intentd in secure mode answered %.200s, want the connection refused", clientAddr, body)
			}
			if err := rawPut(t, clientAddr); !tc.open && err == nil {
				t.Fatalf("raw gRPC Put on %s with intentd in secure mode was accepted, want it refused", clientAddr)
			}
			if _, err := rawRange(t, http.DefaultClient, "http://"+peerAddr); err == nil {
				t.Errorf("the peer URL %s answers HTTP, want no peer listener", peerAddr)
			}

			sock := cfg.EmbedSocket()
			if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
				t.Fatalf("socket %s: %v %v, want a socket of mode 0600", sock, fi.Mode(), err)
			}
			if fi, err := os.Stat(data); err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("data dir %s: %v %v, want mode 0700", data, fi.Mode(), err)
			}
			// The owner reaches it: the socket is the etcd intentd uses,
			// guarded by the file system as the data files are.
			if _, err := rawRange(t, unixHTTP(sock), "http://etcd"); err != nil {
				t.Fatalf("raw range on the socket as its owner: %v, want an answer", err)
			}
			if os.Geteuid() != 0 {
				t.Log("not root: cannot try the socket as another user")
				return
			}
			err = asUser(65534, func() error {
				conn, err := net.Dial("unix", sock)
				if err == nil {
					conn.Close()
				}
				return err
			})
			if !errors.Is(err, syscall.EACCES) {
				t.Fatalf("connecting to the socket as user nobody: %v, want permission denied", err)
			}
		})
	}
}

// The embedded etcd's startup line says where its clients reach it, and
// why not over TCP when it does not listen there.
func TestEmbeddedEtcdSaysWhereClientsReachIt(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	writeTokensFile(t, tokens, tokenEntry("admin-1", "admin", "embed-admin-token-7d2a"))
	for _, tc := range []struct {
		name   string
		mutate func(*daemon.Config)
		want   string
	}{
		{"no --embed-client-url", func(c *daemon.Config) { c.EmbedClientURL = "" },
			`client_url="none: no --embed-client-url, so its etcd is reachable through the socket only"`},
		{"--embed-client-url, with credentials", func(c *daemon.Config) { c.TokensFile = tokens },
			`client_url="none: intentd runs with credentials (TLS or a tokens file), so --embed-client-url is not served and its etcd is reachable through the socket only"`},
		{"--embed-client-url, without credentials", func(*daemon.Config) {}, "client_url=http://127.0.0.1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(filepath.Join(t.TempDir(), "data"))
			tc.mutate(&cfg)
			_, logs := runLogged(t, cfg)
			line := ""
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, `msg="embedded etcd ready"`) {
					line = l
				}
			}
			if !strings.Contains(line, tc.want) {
				t.Errorf("startup line %q, want it to say %s", line, tc.want)
			}
		})
	}
}

// A second intentd on a data directory in use refuses to start, and leaves
// the first one's etcd socket alone (etcd replaces a socket file it finds).
func TestSecondIntentdOnSameDataDirRefused(t *testing.T) {
	cfg := testConfig(t.TempDir())
	first := start(t, cfg)
	err, _ := runToExit(t, cfg)
	if err == nil || !strings.Contains(err.Error(), "is in use") {
		t.Fatalf("second intentd on %s: %v, want a refusal saying the data dir is in use", cfg.DataDir, err)
	}
	// Asked over etcd's gRPC API, on a connection of each attempt's own:
	// its HTTP gateway, which dials etcd on its first request, answered 503
	// for more than 15 s on a loaded machine, its own connection waiting out
	// gRPC's reconnect backoff, which says nothing of the socket.
	var rerr error
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if rerr = rawGet(t, "unix://"+cfg.EmbedSocket()); rerr == nil || time.Now().After(deadline) {
			break
		}
	}
	if rerr != nil {
		t.Fatalf("the first intentd's etcd socket after the refusal: %v, want it still answering", rerr)
	}
	if _, err := intentv1.NewIntentServiceClient(first.conn).Register(call(t), &intentv1.RegisterRequest{Key: "still-serving", Params: params(t, 1)}); err != nil {
		t.Fatalf("the first intentd after the refusal: %v", err)
	}
}

// A data directory others can enter is made private before the socket is
// created in it.
func TestEmbeddedEtcdMakesDataDirPrivate(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(data)
	_, logs := runLogged(t, cfg)
	if fi, err := os.Stat(data); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data dir: %v %v, want mode 0700", fi.Mode(), err)
	}
	if !strings.Contains(logs.String(), "made --data-dir private") {
		t.Errorf("log lacks the notice of the mode change:\n%s", logs.String())
	}
}

func TestEmbedFlagsValidate(t *testing.T) {
	long := "/" + strings.Repeat("d", 100)
	tests := []struct {
		name    string
		mutate  func(*daemon.Config)
		wantErr string // substring; empty means valid
	}{
		{"defaults", func(*daemon.Config) {}, ""},
		{"client on loopback", func(c *daemon.Config) { c.EmbedClientURL = "http://127.0.0.1:2379" }, ""},
		{"client on another loopback address", func(c *daemon.Config) { c.EmbedClientURL = "http://127.0.0.2:2379" }, ""},
		{"client on IPv6 loopback", func(c *daemon.Config) { c.EmbedClientURL = "http://[::1]:2379" }, ""},
		{"client on localhost", func(c *daemon.Config) { c.EmbedClientURL = "http://localhost:2379" }, ""},
		{"client on a port the kernel picks", func(c *daemon.Config) { c.EmbedClientURL = "http://127.0.0.1:0" }, ""},
		{"client on every interface", func(c *daemon.Config) { c.EmbedClientURL = "http://0.0.0.0:2379" }, "--embed-client-url \"http://0.0.0.0:2379\": want http://host:port with a loopback host"},
		{"client on a LAN address", func(c *daemon.Config) { c.EmbedClientURL = "http://10.0.0.5:2379" }, "--embed-client-url"},
		{"client on a host name", func(c *daemon.Config) { c.EmbedClientURL = "http://etcd.example.com:2379" }, "--embed-client-url"},
		{"client without a port", func(c *daemon.Config) { c.EmbedClientURL = "http://127.0.0.1" }, "--embed-client-url"},
		{"client with a path", func(c *daemon.Config) { c.EmbedClientURL = "http://127.0.0.1:2379/v3" }, "--embed-client-url"},
		{"client over https", func(c *daemon.Config) { c.EmbedClientURL = "https://127.0.0.1:2379" }, "--embed-client-url"},
		{"client on a unix socket", func(c *daemon.Config) { c.EmbedClientURL = "unix:///tmp/etcd.sock" }, "--embed-client-url"},
		{"client empty: the unix socket only", func(c *daemon.Config) { c.EmbedClientURL = "" }, ""},
		{"peer on every interface", func(c *daemon.Config) { c.EmbedPeerURL = "http://0.0.0.0:2380" }, "--embed-peer-url"},
		{"external etcd: embed flags unused", func(c *daemon.Config) {
			c.EtcdEndpoints = []string{"http://10.0.0.1:2379"}
			c.EmbedClientURL, c.EmbedQuotaBytes, c.EmbedCompaction.Mode = "http://0.0.0.0:2379", 0, ""
		}, ""},
		{"data dir too long for the socket", func(c *daemon.Config) { c.DataDir = long }, "--data-dir " + long + ": too long"},
		{"smallest quota", func(c *daemon.Config) { c.EmbedQuotaBytes = 1 << 20 }, ""},
		{"quota too small", func(c *daemon.Config) { c.EmbedQuotaBytes = 512 << 10 }, "--embed-quota-bytes 524288: want"},
		{"quota beyond what etcd recommends", func(c *daemon.Config) { c.EmbedQuotaBytes = 16 << 30 }, "--embed-quota-bytes 17179869184"},
		{"periodic, an hour", func(c *daemon.Config) { c.EmbedCompaction = daemon.Compaction{Mode: "periodic", Retention: "1h"} }, ""},
		{"periodic, a bare number", func(c *daemon.Config) { c.EmbedCompaction = daemon.Compaction{Mode: "periodic", Retention: "10"} }, "--embed-compaction-retention \"10\""},
		{"periodic, a tenth of a second", func(c *daemon.Config) { c.EmbedCompaction = daemon.Compaction{Mode: "periodic", Retention: "100ms"} }, ""},
		{"periodic, too short", func(c *daemon.Config) { c.EmbedCompaction = daemon.Compaction{Mode: "periodic", Retention: "10ms"} }, "--embed-compaction-retention \"10ms\""},
		{"revision", func(c *daemon.Config) { c.EmbedCompaction = daemon.Compaction{Mode: "revision", Retention: "100000"} }, ""},
		{"revision, a duration", func(c *daemon.Config) { c.EmbedCompaction = daemon.Compaction{Mode: "revision", Retention: "5m"} }, "--embed-compaction-retention \"5m\": with --embed-compaction-mode revision"},
		{"revision, zero", func(c *daemon.Config) { c.EmbedCompaction = daemon.Compaction{Mode: "revision", Retention: "0"} }, "--embed-compaction-retention"},
		{"unknown mode", func(c *daemon.Config) { c.EmbedCompaction.Mode = "hourly" }, "--embed-compaction-mode \"hourly\": want periodic or revision"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := daemon.DefaultConfig()
			cfg.DataDir = "/var/lib/intentd"
			tc.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
