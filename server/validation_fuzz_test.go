package server_test

import (
	"regexp"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/server"
)

// requestTypes lists the request message type of every IntentService RPC,
// in the order the service declares them.
func requestTypes(tb testing.TB) []protoreflect.MessageType {
	tb.Helper()
	var out []protoreflect.MessageType
	methods := intentv1.File_intent_v1_intent_proto.Services().ByName("IntentService").Methods()
	for i := range methods.Len() {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(methods.Get(i).Input().FullName())
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, mt)
	}
	return out
}

// fieldName is the first name of a field path: "children" in
// "children[0].key".
var fieldName = regexp.MustCompile(`^[a-z_]+`)

// FuzzValidateRequest decodes arbitrary bytes into a request of one of the
// RPCs (chosen by rpc) and checks it as the handlers check their requests
// first. It must never panic; a request it refuses must get
// INVALID_ARGUMENT with an ErrorInfo (intentd.dev, INVALID_FIELD) naming a
// field of that request, the same field as the BadRequest violation.
func FuzzValidateRequest(f *testing.F) {
	types := requestTypes(f)
	params, err := structpb.NewStruct(map[string]any{"item": "desk lamp", "quantity": 1})
	if err != nil {
		f.Fatal(err)
	}
	seeds := []proto.Message{
		&intentv1.RegisterRequest{Key: "order-1", Params: params, Labels: map[string]string{"team": "a"}},
		&intentv1.RegisterRequest{Key: "order 1", Params: params, Labels: map[string]string{"": "a"}},
		&intentv1.AcquireRequest{Key: "order-1", SessionId: "abc", RequestId: "r1", Register: &intentv1.RegisterRequest{Key: "order-1", Params: params}},
		&intentv1.CompleteRequest{Key: "order-1", Token: 7, Result: &intentv1.Result{ExternalRefs: map[string]string{"id": "SO-1"}}, Children: []*intentv1.RegisterRequest{{Key: "mail", Params: params}, {Key: "bad key"}}},
		&intentv1.HeartbeatRequest{SessionId: "abc", Leases: []*intentv1.HeldLease{{Key: "order-1", Token: 0}}},
		&intentv1.OpenSessionRequest{Worker: "w", Ttl: durationpb.New(1)},
		&intentv1.ResolveRequest{Key: "order-1", Decision: 9, Actor: "alice", Reason: "r", RequestId: "q"},
		&intentv1.ListRequest{States: []intentv1.State{1, 0}, Label: "team=a", PageSize: 101},
		&intentv1.WatchRequest{Key: "order-1", StartRevision: -1},
	}
	index := map[protoreflect.FullName]uint8{}
	for i, mt := range types {
		index[mt.Descriptor().FullName()] = uint8(i)
		f.Add(uint8(i), []byte(nil))
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(index[m.ProtoReflect().Descriptor().FullName()], b)
	}

	f.Fuzz(func(t *testing.T, rpc uint8, data []byte) {
		mt := types[int(rpc)%len(types)]
		req := mt.New().Interface()
		if err := proto.Unmarshal(data, req); err != nil {
			return // bytes that do not decode never reach a handler (see FuzzRawRequest)
		}
		err := server.CheckRequest(req)
		if err == nil {
			return
		}
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument {
			t.Fatalf("%s refused with %v, want InvalidArgument", mt.Descriptor().FullName(), err)
		}
		var info0 *errdetails.ErrorInfo
		var violations []string
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				info0 = d
			case *errdetails.BadRequest:
				for _, v := range d.GetFieldViolations() {
					violations = append(violations, v.GetField())
				}
			}
		}
		if info0.GetDomain() != server.ErrorDomain || info0.GetReason() != "INVALID_FIELD" {
			t.Fatalf("%s refused with ErrorInfo %v, want %s / %s", mt.Descriptor().FullName(), info0, server.ErrorDomain, "INVALID_FIELD")
		}
		field := info0.GetMetadata()["field"]
		if len(violations) != 1 || violations[0] != field {
			t.Fatalf("ErrorInfo names %q, BadRequest %q: want the same one field", field, violations)
		}
		if name := fieldName.FindString(field); mt.Descriptor().Fields().ByName(protoreflect.Name(name)) == nil {
			t.Fatalf("refusal names %q, which is no field of %s", field, mt.Descriptor().FullName())
		}
	})
}
