package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

var getInfo = &grpc.UnaryServerInfo{FullMethod: "/intent.v1.IntentService/Get"}

// callContext is a server call's context as grpc-go gives it: a peer and a
// deadline.
func callContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50123}})
}

// At the default level a successful call is not logged, and it used to
// cost the logging interceptor's fields anyway (timestamps formatted, the
// peer address, the field list copied, a context value), allocations per
// call for a line never written (see docs/PERFORMANCE.md, "The hot
// spots"). Now it costs none.
func TestCallLogBuildsNothingWhenItsLevelIsOff(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	intercept := callLog{log: log}.unary()
	ctx := callContext(t)
	ok := func(context.Context, any) (any, error) { return nil, nil }
	allocs := testing.AllocsPerRun(1000, func() {
		_, _ = intercept(ctx, nil, getInfo, ok)
	})
	if allocs != 0 {
		t.Errorf("a successful call at --log-level info: %v allocations, want 0", allocs)
	}
}

// The "finished call" line has the fields, in the order, that
// go-grpc-middleware's logging interceptor wrote, which intentd used
// before: operators' queries on them keep working.
func TestCallLogWritesTheFieldsOfTheLoggingInterceptor(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"ok", nil},
		{"refused", status.Error(codes.NotFound, "no such intent")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			handler := func(context.Context, any) (any, error) { return nil, tc.err }
			var got, want bytes.Buffer
			gotLog := slog.New(slog.NewJSONHandler(&got, &slog.HandlerOptions{Level: slog.LevelDebug}))
			_, _ = callLog{log: gotLog, all: true}.unary()(callContext(t), nil, getInfo, handler)
			wantLog := slog.New(slog.NewJSONHandler(&want, &slog.HandlerOptions{Level: slog.LevelDebug}))
			lib := logging.UnaryServerInterceptor(logging.LoggerFunc(func(ctx context.Context, l logging.Level, msg string, fields ...any) {
				wantLog.Log(ctx, slog.Level(l), msg, fields...)
			}), logging.WithLogOnEvents(logging.FinishCall))
			_, _ = lib(callContext(t), nil, getInfo, handler)
			if g, w := keysOf(t, got.Bytes()), keysOf(t, want.Bytes()); !slices.Equal(g, w) {
				t.Errorf("fields %q, want %q (go-grpc-middleware's)", g, w)
			}
			for _, k := range []string{"level", "msg", "protocol", "grpc.component", "grpc.service", "grpc.method", "grpc.method_type", "peer.address", "grpc.code", "grpc.error"} {
				if g, w := valueOf(t, got.Bytes(), k), valueOf(t, want.Bytes(), k); g != w {
					t.Errorf("%s = %q, want %q", k, g, w)
				}
			}
		})
	}
}

// keysOf lists the keys of a JSON log line in order.
func keysOf(t *testing.T, line []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(line))
	var keys []string
	if _, err := dec.Token(); err != nil {
		t.Fatalf("log line %q: %v", line, err)
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		keys = append(keys, k.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
	}
	return keys
}

// valueOf is the value of key in a JSON log line, as text.
func valueOf(t *testing.T, line []byte, key string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatalf("log line %q: %v", line, err)
	}
	v, _ := m[key].(string)
	return v
}
