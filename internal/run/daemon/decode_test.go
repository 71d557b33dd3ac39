package daemon_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/internal/core/rawrpc"
	"github.com/intentd/intentd/internal/testing/testlog"
)

// TestUndecodableRequestIsInvalidArgument: intentd as it runs (codec,
// interceptors, guard, validation, health and reflection) answers bytes
// that are not a valid request with INVALID_ARGUMENT / INVALID_FIELD naming
// the field, never grpc-go's INTERNAL, for unary calls and streams alike,
// and logs the refusal like any other.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	logs := &testlog.Buffer{}
	conn := startLogged(t, testConfig(t.TempDir()), logs)
	tests := []struct {
		method string
		stream bool
		req    string
		field  string
	}{
		// RegisterRequest{key: "lamp-\xff\xfe-order"}
		{"/intent.v1.IntentService/Register", false, "\x12\x0dlamp-\xff\xfe-order", "key"},
		// OpenSessionRequest{worker: "worker-\xc3\x28"}
		{"/intent.v1.IntentService/OpenSession", false, "\x12\x09worker-\xc3\x28", "worker"},
		{"/intent.v1.IntentService/Get", false, "not protobuf", "request"},
		{"/intent.v1.IntentService/Watch", true, "\x12\x02\xc3\x28", "key"},
		{"/grpc.health.v1.Health/Check", false, "\x0a\x01\xff", "service"},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", true, "\x1a\x01\xff", "file_by_filename"},
	}
	for _, tt := range tests {
		err := rawrpc.Call(call(t), conn, tt.method, tt.stream, []byte(tt.req))
		st := status.Convert(err)
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if d, ok := d.(*errdetails.ErrorInfo); ok {
				info = d
			}
		}
		if st.Code() != codes.InvalidArgument || info.GetReason() != "INVALID_FIELD" || info.GetMetadata()["field"] != tt.field {
			t.Errorf("%s(%+q) = %v (ErrorInfo %v), want INVALID_ARGUMENT, INVALID_FIELD naming %q", tt.method, tt.req, err, info, tt.field)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "grpc.code=InvalidArgument") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := logs.String(); !strings.Contains(got, "grpc.method=Register") || !strings.Contains(got, "grpc.code=InvalidArgument") {
		t.Errorf("the refused Register is not in the log\n--- log ---\n%s", got)
	}
}
