package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// intentctl probe is the health check of images without a shell: its exit
// status is what a container runtime reads, and its one line is what an
// operator sees in `docker inspect`.
func TestProbeExitStatusFollowsHTTPStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			_, _ = w.Write([]byte("ok\n"))
		case "/readyz":
			http.Error(w, "etcd unreachable: context deadline exceeded\nmore detail", http.StatusServiceUnavailable)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String() + "/healthz"
	closed.Close()

	for _, tc := range []struct {
		name, url  string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"healthy", srv.URL + "/healthz", exitOK, "200 OK ok\n", ""},
		{"not ready says why", srv.URL + "/readyz", exitFailure, "", "503 Service Unavailable etcd unreachable: context deadline exceeded\n"},
		{"no such path", srv.URL + "/nope", exitFailure, "", "404 Not Found"},
		{"nothing listens", closedURL, exitUnreachable, "", "connection refused"},
		{"not a URL", "http://[::1", exitUsage, "", "probe \"http://[::1\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := invocation{args: []string{"--timeout", "5s", "probe", tc.url}, env: map[string]string{}}.run(t)
			if got.code != tc.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", got.code, tc.wantCode, got.stderr)
			}
			if got.stdout != tc.wantStdout {
				t.Errorf("stdout %q, want %q", got.stdout, tc.wantStdout)
			}
			if !strings.Contains(got.stderr, tc.wantStderr) {
				t.Errorf("stderr %q, want it to contain %q", got.stderr, tc.wantStderr)
			}
		})
	}
}
