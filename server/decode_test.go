package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/intentd/intentd/etcdstore"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/rawrpc"
	"github.com/intentd/intentd/internal/testing/etcdtest"
	"github.com/intentd/intentd/server"
)

// rawCall sends b as the request of method, as rawrpc.Call does.
func rawCall(ctx context.Context, conn *grpc.ClientConn, method protoreflect.MethodDescriptor, b []byte) error {
	full := "/" + string(method.Parent().FullName()) + "/" + string(method.Name())
	return rawrpc.Call(ctx, conn, full, method.IsStreamingServer(), b)
}

// method returns the IntentService method named name.
func method(t testing.TB, name string) protoreflect.MethodDescriptor {
	t.Helper()
	m := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods().ByName(protoreflect.Name(name))
	if m == nil {
		t.Fatalf("no method %s", name)
	}
	return m
}

// invalidField returns the field an INVALID_ARGUMENT / INVALID_FIELD
// refusal names, failing the test for any other error.
func invalidField(t testing.TB, err error) string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("error %v: code %v, want %v", err, st.Code(), codes.InvalidArgument)
	}
	var info *errdetails.ErrorInfo
	var violations []string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				violations = append(violations, v.GetField())
			}
		}
	}
	if info.GetDomain() != server.ErrorDomain || info.GetReason() != "INVALID_FIELD" {
		t.Fatalf("error %v: ErrorInfo %v, want %s / %s", err, info, server.ErrorDomain, "INVALID_FIELD")
	}
	field := info.GetMetadata()["field"]
	if len(violations) != 1 || violations[0] != field {
		t.Fatalf("error %v: ErrorInfo names %q, BadRequest %q; want the same one field", err, field, violations)
	}
	return field
}

// wire builds raw request bytes field by field.
type wire []byte

func (w wire) str(num protowire.Number, s string) wire {
	return protowire.AppendString(protowire.AppendTag(w, num, protowire.BytesType), s)
}

func (w wire) msg(num protowire.Number, m wire) wire {
	return protowire.AppendBytes(protowire.AppendTag(w, num, protowire.BytesType), m)
}

func (w wire) varint(num protowire.Number, v uint64) wire {
	return protowire.AppendVarint(protowire.AppendTag(w, num, protowire.VarintType), v)
}

// structOf is the wire form of a google.protobuf.Struct with one member
// whose google.protobuf.Value is value.
func structOf(key string, value wire) wire {
	return wire{}.msg(1, wire{}.str(1, key).msg(2, value))
}

// TestInvalidUTF8IsInvalidArgumentNotInternal sends requests whose string
// fields hold bytes that are not UTF-8, as a client in another language
// can. grpc-go's codec used to refuse them before any interceptor ran,
// with INTERNAL ("string field contains invalid UTF-8") and no ErrorInfo;
// they must be INVALID_ARGUMENT / INVALID_FIELD naming the field, for every
// request type, and reach no handler.
func TestInvalidUTF8IsInvalidArgumentNotInternal(t *testing.T) {
	_, conn := serveConn(t, etcdtest.Start(t), etcdstore.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const bad = "lamp-\xff\xfe-order"
	params := structOf("item", wire{}.str(3, "desk lamp"))
	register := wire{}.str(2, "k").msg(3, params)
	tests := []struct {
		method string
		req    wire
		field  string
	}{
		{"Register", wire{}.str(2, bad).msg(3, params), "key"},
		{"Register", wire{}.str(1, "t\xc3\x28"), "tenant"},
		{"Register", wire{}.str(2, "k").msg(3, structOf("note", wire{}.str(3, bad))), "params.note"},
		{"Register", wire{}.str(2, "k").msg(3, structOf("unit price", wire{}.str(3, bad))), `params["unit price"]`},
		{"Register", wire{}.str(2, "k").msg(3, structOf(bad, wire{}.str(3, "x"))), "params"},
		{"Register", wire{}.str(2, "k").msg(3, structOf("items",
			wire{}.msg(6, wire{}.msg(1, wire{}.str(3, "a")).msg(1, wire{}.str(3, "b")).msg(1, wire{}.msg(5, structOf("sku", wire{}.str(3, bad))))))), "params.items[2].sku"},
		{"Register", wire{}.str(2, "k").msg(5, wire{}.str(1, "team").str(2, bad)), "labels[team]"},
		{"Register", wire{}.str(2, "k").msg(5, wire{}.str(1, bad).str(2, "a")), "labels"},
		{"DeriveKey", wire{}.str(1, bad), "action"},
		{"DeriveKey", wire{}.str(1, "ship").msg(2, structOf("order", wire{}.str(3, bad))), "identity.order"},
		{"OpenSession", wire{}.str(2, "worker-\xc3\x28"), "worker"},
		{"CloseSession", wire{}.str(2, bad), "session_id"},
		{"Acquire", wire{}.str(2, "k").msg(6, wire{}.str(2, "k").msg(3, structOf("x", wire{}.str(3, bad)))), "register.params.x"},
		{"Acquire", wire{}.str(4, bad), "request_id"},
		{"Heartbeat", wire{}.str(2, "s").msg(3, wire{}.str(1, "ok")).msg(3, wire{}.str(1, bad)), "leases[1].key"},
		{"Complete", wire{}.str(2, "k").varint(3, 7).msg(4, wire{}.msg(2, wire{}.str(1, "order").str(2, bad))), "result.external_refs[order]"},
		{"Complete", wire{}.str(2, "k").varint(3, 7).msg(5, register).msg(5, wire{}.str(2, bad)), "children[1].key"},
		{"MarkUnknown", wire{}.str(2, "k").varint(3, 7).str(4, bad), "reason"},
		{"Release", wire{}.str(2, bad), "key"},
		{"Fail", wire{}.str(2, "k").varint(3, 7).msg(4, wire{}.str(1, bad)), "failure.code"},
		{"Escalate", wire{}.str(2, bad), "key"},
		{"Resolve", wire{}.str(2, "k").str(6, bad), "actor"},
		{"Cancel", wire{}.str(2, bad), "key"},
		{"Get", wire{}.str(2, bad), "key"},
		{"List", wire{}.str(3, bad), "label"},
		{"Watch", wire{}.str(2, bad), "key"},
		{"BeginSubmission", wire{}.str(2, "k").msg(8, wire{}.str(3, "/p"+bad)), "request.target"},
		{"RecordSubmission", wire{}.str(2, "k").msg(7, wire{}.msg(2, wire{}.str(1, "X").str(2, bad))), "response.headers[0].value"},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.field, func(t *testing.T) {
			m := method(t, tt.method)
			// The bytes must be what the case says: refused for UTF-8.
			if err := proto.Unmarshal(tt.req, newRequest(t, m)); err == nil || !strings.Contains(err.Error(), "UTF-8") {
				t.Fatalf("test bytes decode as %s with %v, want an invalid UTF-8 error", m.Input().FullName(), err)
			}
			err := rawCall(ctx, conn, m, tt.req)
			if err == nil {
				t.Fatal("accepted, want INVALID_ARGUMENT")
			}
			if got := invalidField(t, err); got != tt.field {
				t.Errorf("field = %q, want %q (error %v)", got, tt.field, err)
			}
		})
		covered[tt.method] = true
	}
	methods := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods()
	for i := range methods.Len() {
		if name := string(methods.Get(i).Name()); !covered[name] {
			t.Errorf("no case for %s", name)
		}
	}
}

// TestMalformedProtobufIsInvalidArgument sends bytes that are not a
// protobuf message at all, or break off inside one: INVALID_ARGUMENT /
// INVALID_FIELD naming the field where they go wrong, or "request" (with
// the message type in the text) when they go wrong outside any field, never
// INTERNAL.
func TestMalformedProtobufIsInvalidArgument(t *testing.T) {
	_, conn := serveConn(t, etcdtest.Start(t), etcdstore.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	truncated := func(w wire) wire { return w[:len(w)-1] }
	tests := []struct {
		name, method string
		req          wire
		field        string
	}{
		{"text", "Register", wire("hello, intentd"), "request"},
		{"field number 0", "Get", wire{0x00, 0x01}, "request"},
		{"truncated tag", "Get", wire{0x80}, "request"},
		{"end group without start", "Get", wire{0x7c}, "request"},
		{"length past the end", "Register", wire{0x12, 0x7f, 'k'}, "key"},
		{"truncated varint", "Complete", wire{0x18, 0xff}, "token"},
		{"overlong varint", "List", wire{0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, "page_size"},
		{"truncated nested message", "Register", wire{}.str(2, "k").msg(3, truncated(structOf("a", wire{}.str(3, "b")))), "params"},
		{"malformed packed enum", "List", wire{}.msg(2, wire{0xff}), "states"},
		{"unknown field past the end", "Get", append(wire{}.str(2, "k"), 0x9a, 0x06, 0x05), "request"},
		{"deep garbage in params", "Register", wire{}.str(2, "k").msg(3, structOf("a", wire{}.msg(5, structOf("b", wire{0x0a, 0x05})))), "params.a.b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := method(t, tt.method)
			if err := proto.Unmarshal(tt.req, newRequest(t, m)); err == nil {
				t.Fatalf("test bytes %x decode as %s: not a malformed case", []byte(tt.req), m.Input().FullName())
			}
			err := rawCall(ctx, conn, m, tt.req)
			if err == nil {
				t.Fatal("accepted, want INVALID_ARGUMENT")
			}
			if got := invalidField(t, err); got != tt.field {
				t.Errorf("field = %q, want %q (error %v)", got, tt.field, err)
			}
			if tt.field == "request" && !strings.Contains(status.Convert(err).Message(), string(m.Input().FullName())) {
				t.Errorf("message %q does not name the message type %s", status.Convert(err).Message(), m.Input().FullName())
			}
		})
	}

	// Well-formed requests still decode: unknown fields and a known field
	// with another wire type are kept as unknown fields, as protobuf does.
	ok := wire{}.str(2, "missing-key").varint(99, 1).varint(2, 5)
	if err := rawCall(ctx, conn, method(t, "Get"), ok); status.Code(err) != codes.NotFound {
		t.Errorf("Get with unknown fields: %v, want NOT_FOUND", err)
	}
}

// newRequest returns an empty request message of m.
func newRequest(t testing.TB, m protoreflect.MethodDescriptor) proto.Message {
	t.Helper()
	for _, mt := range requestTypes(t) {
		if mt.Descriptor().FullName() == m.Input().FullName() {
			return mt.New().Interface()
		}
	}
	t.Fatalf("no request type for %s", m.FullName())
	return nil
}

// FuzzRawRequest sends arbitrary bytes as the request of one of the
// IntentService methods (chosen by rpc) to a real gRPC server on a real
// etcd, with request validation as intentd runs it: whatever the bytes,
// the answer is never INTERNAL or UNKNOWN, and an INVALID_ARGUMENT carries
// ErrorInfo INVALID_FIELD naming a field of the request (or "request").
func FuzzRawRequest(f *testing.F) {
	_, conn := serveConn(f, etcdtest.Start(f), etcdstore.DefaultConfig())
	methods := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods()
	params := structOf("item", wire{}.str(3, "desk lamp"))
	seeds := map[string][]wire{
		"Register":    {wire{}.str(2, "order-1").msg(3, params), wire{}.str(2, "lamp-\xff\xfe-order").msg(3, params)},
		"OpenSession": {wire{}.str(2, "worker-\xc3\x28")},
		"Acquire":     {wire{}.str(2, "order-1").str(3, "s").str(4, "r").msg(6, wire{}.str(2, "order-1").msg(3, params))},
		"Complete":    {wire{}.str(2, "order-1").varint(3, 7).msg(5, wire{}.str(2, "c").msg(3, structOf("n", wire{0x11, 0, 0, 0, 0, 0, 0, 0x40, 0x43})))},
		"List":        {wire{}.msg(2, wire{1, 2}).varint(5, 5)},
		"Watch":       {wire{}.str(2, "order-1")},
	}
	for i := range methods.Len() {
		m := methods.Get(i)
		f.Add(uint8(i), []byte(nil))
		f.Add(uint8(i), []byte("\x0a\x80"))
		for _, s := range seeds[string(m.Name())] {
			f.Add(uint8(i), []byte(s))
		}
	}
	if d, err := proto.Marshal(&intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(time.Second)}); err == nil {
		f.Add(uint8(methods.ByName("OpenSession").Index()), d)
	}
	f.Fuzz(func(t *testing.T, rpc uint8, data []byte) {
		m := methods.Get(int(rpc) % methods.Len())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := rawCall(ctx, conn, m, data)
		st := status.Convert(err)
		switch st.Code() {
		case codes.OK:
			return
		case codes.Internal, codes.Unknown:
			t.Fatalf("%s(%x) = %v: a client's bytes must never yield %v", m.Name(), data, err, st.Code())
		case codes.InvalidArgument:
			field := invalidField(t, err)
			if field == "request" {
				return
			}
			if name := fieldName.FindString(field); m.Input().Fields().ByName(protoreflect.Name(name)) == nil {
				t.Fatalf("%s(%x) refused naming %q, which is no field of %s", m.Name(), data, field, m.Input().FullName())
			}
		case codes.DeadlineExceeded:
			// The server's copy of the deadline may fire a moment before
			// the client's context reports it: only an answer well before
			// the deadline is wrong.
			if deadline, _ := ctx.Deadline(); time.Until(deadline) > time.Second {
				t.Fatalf("%s(%x) = %v %v before the call's deadline", m.Name(), data, err, time.Until(deadline).Round(time.Millisecond))
			}
		}
	})
}
