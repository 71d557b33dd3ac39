package server

// Request decoding. grpc-go decodes a request before any interceptor runs,
// and turns every decoding failure into INTERNAL ("grpc: failed to unmarshal
// the received message: string field contains invalid UTF-8"), with no
// ErrorInfo and no log line: it formats the codec's error into a new status
// (rpc_util.go, recv), so no error a codec returns survives as anything
// else. INTERNAL tells a client "server bug, maybe retry"; bytes that are
// not a valid message are the client's to fix.
//
// So decoding moves to where intentd's errors are made. The server's codec
// (RequestCodec) hands a request over undecoded, as a frame; DecodedService
// wraps each unary handler of a service so that it asks for the frame and
// decodes it itself, and DecodeInterceptors do the same for the messages of
// streams. A frame that does not decode becomes an *intent.InvalidError
// naming the field where the bytes go wrong (found by walking the wire
// format against the message's descriptor: "key", "register.params.note",
// "labels[team]"), and toStatus turns it into INVALID_ARGUMENT with
// ErrorInfo INVALID_FIELD like any other malformed field. It surfaces inside
// the interceptor chain, so it is logged and counted like every refusal.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/intentd/intentd/intent"
)

// frame is a request message's bytes, not yet decoded.
type frame struct {
	buf mem.Buffer
}

// requestCodec is grpc-go's proto codec, except that it hands a *frame the
// bytes as they came, sends a kept replay answer as its kept bytes, and
// encodes every other Acquire answer deterministically (keptEncoding), so
// that a replay read from etcd sends what a replay from memory sends.
type requestCodec struct {
	encoding.CodecV2
}

func (c requestCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := keptEncoding(v); ok {
		return b, nil
	}
	return c.CodecV2.Marshal(v)
}

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		f.buf = data.MaterializeToBuffer(mem.DefaultBufferPool())
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}

// RequestCodec returns the server option that lets DecodedService and
// DecodeInterceptors decode requests themselves, and that sends a replay
// answer kept from an earlier replay as the bytes it was encoded to then.
// It changes nothing else: every other message is encoded and decoded by
// grpc-go's proto codec.
func RequestCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(requestCodec{encoding.GetCodecV2(grpcproto.Name)})
}

// DecodedService returns a copy of desc whose unary methods decode their
// request with intentd's errors: bytes that are not a valid request fail
// with INVALID_ARGUMENT / INVALID_FIELD naming the field, before the
// service's handler runs. The server must have been built with
// RequestCodec, and its interceptor chain should contain DecodeInterceptors
// ahead of any interceptor that reads the request (authorization,
// validation), which would otherwise see an empty one. Without that
// interceptor the call still fails the same way, but only once the other
// interceptors have let it pass.
func DecodedService(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	out := *desc
	out.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		out.Methods[i] = grpc.MethodDesc{MethodName: m.MethodName, Handler: decodedHandler(m.Handler)}
	}
	return &out
}

// decodeErrorKey carries a unary request's decoding error from the handler
// wrapper to the interceptor that reports it.
type decodeErrorKey struct{}

// decodedHandler wraps a generated unary handler, which decodes its request
// with dec and then calls the interceptor chain ic.
func decodedHandler(h grpc.MethodHandler) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		var bad error
		decode := func(in any) error {
			m, ok := in.(proto.Message)
			if !ok {
				return dec(in)
			}
			var f frame
			if err := dec(&f); err != nil {
				return err // the transport's: the message never arrived
			}
			bad = decodeFrame(f, m)
			return nil
		}
		chain := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if bad != nil {
				ctx = context.WithValue(ctx, decodeErrorKey{}, bad)
				handler = func(context.Context, any) (any, error) { return nil, toStatus(slog.Default(), bad) }
			}
			if ic == nil {
				return handler(ctx, req)
			}
			return ic(ctx, req, info, handler)
		}
		return h(srv, ctx, decode, chain)
	}
}

// DecodeInterceptors returns the unary and stream interceptors that refuse
// a request whose bytes did not decode (see DecodedService) and decode the
// messages streams receive, with INVALID_ARGUMENT / INVALID_FIELD naming the
// field. Put them after logging, metrics and panic recovery, so that the
// refusal is logged and counted, and before authorization and validation,
// which need a decoded request. They need RequestCodec.
func DecodeInterceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	log := slog.Default()
	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err, _ := ctx.Value(decodeErrorKey{}).(error); err != nil {
			return nil, toStatus(log, err)
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &decodingStream{ServerStream: ss, log: log})
	}
	return unary, stream
}

// decodingStream decodes each message a streaming handler receives.
type decodingStream struct {
	grpc.ServerStream
	log *slog.Logger
}

// RecvMsg receives the next message and decodes it into m.
func (s *decodingStream) RecvMsg(m any) error {
	msg, ok := m.(proto.Message)
	if !ok {
		return s.ServerStream.RecvMsg(m)
	}
	var f frame
	if err := s.ServerStream.RecvMsg(&f); err != nil {
		return err
	}
	if err := decodeFrame(f, msg); err != nil {
		return toStatus(s.log, err)
	}
	return nil
}

// decodeFrame decodes f into m as grpc-go's proto codec would, and frees
// f. If the bytes do not decode, m is left empty and the error is an
// *intent.InvalidError naming where they go wrong.
func decodeFrame(f frame, m proto.Message) error {
	defer f.buf.Free()
	b := f.buf.ReadOnlyData()
	if err := proto.Unmarshal(b, m); err != nil {
		proto.Reset(m)
		return undecodable(m.ProtoReflect().Descriptor(), b, err)
	}
	return nil
}

// wholeRequest is the field an error names when the bytes go wrong outside
// any field: the request as a whole, as for a message-level rule.
const wholeRequest = "request"

// maxPathLen bounds the field path of a decoding error: a request may nest
// messages thousands deep, and the path travels back in trailers, three
// times over (message, ErrorInfo, BadRequest).
const maxPathLen = 512

// undecodable explains why b is not a valid md, which proto.Unmarshal
// refused with err: the path of the first field whose bytes are wrong, and
// what is wrong with them.
func undecodable(md protoreflect.MessageDescriptor, b []byte, err error) error {
	w := walker{}
	reason, found := w.message(md, b, 0)
	if !found {
		// The walk is no parser: should it miss what proto.Unmarshal
		// found, the error still says which message it was.
		return intent.Invalid(wholeRequest, "not a valid %s: %v", md.FullName(), err)
	}
	path := w.path()
	if path == "" {
		return intent.Invalid(wholeRequest, "not a valid %s: %s", md.FullName(), reason)
	}
	return intent.Invalid(path, "%s", reason)
}

// walker finds where a message's wire format goes wrong, as
// google.golang.org/protobuf's decoder sees it: malformed tags, lengths
// and varints, strings that are not UTF-8 (proto3 and editions), and nesting
// beyond the decoder's recursion limit, in known fields and nested messages
// alike. Unknown fields are only checked for being well formed, and a known
// field with an unexpected wire type is an unknown field, as the decoder
// takes it. steps holds the path found, innermost first.
type walker struct {
	steps []string
}

// step is one element of a field path: ".name", "[2]", "[team]".
func (w *walker) step(s string) { w.steps = append(w.steps, s) }

// path spells the steps outermost first, without a leading dot, cut at a
// step boundary past maxPathLen bytes.
func (w *walker) path() string {
	var b strings.Builder
	for i := len(w.steps) - 1; i >= 0; i-- {
		s := w.steps[i]
		if b.Len() == 0 {
			s = strings.TrimPrefix(s, ".")
		}
		if b.Len()+len(s) > maxPathLen {
			b.WriteString("...")
			break
		}
		b.WriteString(s)
	}
	return b.String()
}

// message walks b as a message of md, nested depth levels deep; it returns
// what is wrong and true, with the path in w.steps, or false if it finds
// nothing wrong.
func (w *walker) message(md protoreflect.MessageDescriptor, b []byte, depth int) (string, bool) {
	if depth >= protowire.DefaultRecursionLimit {
		return fmt.Sprintf("nested more than %d messages deep", protowire.DefaultRecursionLimit), true
	}
	seen := map[protowire.Number]int{} // occurrences so far, for list indexes
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "malformed field tag: " + protowire.ParseError(n).Error(), true
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		fd := md.Fields().ByNumber(num)
		if n < 0 {
			if fd != nil {
				w.step(fieldStep(md, fd))
			}
			return fmt.Sprintf("malformed value of field %d: %v", num, protowire.ParseError(n)), true
		}
		value := b[:n]
		b = b[n:]
		if fd == nil || !wireTypeFits(fd, typ) {
			continue // an unknown field, well formed
		}
		index := seen[num]
		seen[num]++
		if reason, found := w.field(md, fd, typ, value, index, depth); found {
			return reason, true
		}
	}
	return "", false
}

// field walks one occurrence of fd, its bytes being value (length prefix
// included).
func (w *walker) field(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, typ protowire.Type, value []byte, index, depth int) (string, bool) {
	name := func() {
		if fd.IsList() {
			w.step("[" + strconv.Itoa(index) + "]")
		}
		w.step(fieldStep(md, fd))
	}
	switch {
	case fd.IsMap():
		content, _ := protowire.ConsumeBytes(value)
		reason, found := w.mapEntry(md, fd, content, depth)
		if found {
			w.step(fieldStep(md, fd))
		}
		return reason, found
	case fd.Kind() == protoreflect.MessageKind:
		content, _ := protowire.ConsumeBytes(value)
		if reason, found := w.message(fd.Message(), content, depth+1); found {
			name()
			return reason, true
		}
	case fd.Kind() == protoreflect.GroupKind:
		content, _ := protowire.ConsumeGroup(fd.Number(), value)
		if reason, found := w.message(fd.Message(), content, depth+1); found {
			name()
			return reason, true
		}
	case fd.Kind() == protoreflect.StringKind:
		content, _ := protowire.ConsumeBytes(value)
		if checksUTF8(fd) && !utf8.Valid(content) {
			name()
			return "not valid UTF-8", true
		}
	case typ == protowire.BytesType && fd.IsList() && fd.Kind() != protoreflect.BytesKind:
		content, _ := protowire.ConsumeBytes(value)
		if !packedWellFormed(fd, content) {
			w.step(fieldStep(md, fd))
			return "malformed packed values", true
		}
	}
	return "", false
}

// mapEntry walks one entry of the map field fd. The path names the entry
// by its key when the key is readable: "labels[team]".
func (w *walker) mapEntry(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, b []byte, depth int) (string, bool) {
	entry := fd.Message()
	sub := walker{}
	reason, found := sub.message(entry, b, depth+1)
	if !found {
		return "", false
	}
	// sub's outermost step names the entry's key or value field.
	if len(sub.steps) > 0 && sub.steps[len(sub.steps)-1] == "."+string(entry.Fields().ByNumber(1).Name()) {
		return "map key: " + reason, true
	}
	if len(sub.steps) == 0 {
		return reason, true // the entry itself is malformed
	}
	w.steps = append(w.steps, sub.steps[:len(sub.steps)-1]...)
	w.step(keyStep(md, mapKey(entry, b)))
	return reason, true
}

// mapKey returns the text of the key of the map entry b, the last one
// written, as the decoder keeps it.
func mapKey(entry protoreflect.MessageDescriptor, b []byte) string {
	kd := entry.Fields().ByNumber(1)
	key := ""
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			break
		}
		if num == 1 && wireTypeFits(kd, typ) {
			switch typ {
			case protowire.BytesType:
				v, _ := protowire.ConsumeBytes(b[:n])
				key = string(v)
			case protowire.VarintType:
				v, _ := protowire.ConsumeVarint(b[:n])
				key = strconv.FormatUint(v, 10)
			}
		}
		b = b[n:]
	}
	return key
}

// The well-known types that carry JSON values get JSON paths, as
// intent.Canonical names their values: params.items[2].sku rather than
// params.fields[items].list_value.values[2].struct_value.fields[sku].
const (
	structName    = "google.protobuf.Struct"
	listValueName = "google.protobuf.ListValue"
	valueName     = "google.protobuf.Value"
)

// fieldStep is the path step of field fd of md: none for the fields of
// the JSON types, whose map keys and list indexes are the path.
func fieldStep(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor) string {
	switch md.FullName() {
	case valueName, listValueName, structName:
		return ""
	}
	return "." + string(fd.Name())
}

// keyStep is the path step of a map entry with key k in a map field of md:
// a Struct member's as intent.Canonical's paths spell it, else a subscript.
func keyStep(md protoreflect.MessageDescriptor, k string) string {
	if md.FullName() == structName {
		return intent.PathKey(k)
	}
	return subscript(strings.ToValidUTF8(k, "\uFFFD"))
}

// checksUTF8 reports whether the decoder refuses a string field fd that is
// not UTF-8: in proto3 and editions files, not in proto2 ones.
func checksUTF8(fd protoreflect.FieldDescriptor) bool {
	return fd.ParentFile() == nil || fd.ParentFile().Syntax() != protoreflect.Proto2
}

// wireTypeFits reports whether the decoder reads a field fd written with
// wire type typ as fd (otherwise it keeps it as an unknown field).
func wireTypeFits(fd protoreflect.FieldDescriptor, typ protowire.Type) bool {
	want := kindWireType(fd.Kind())
	return typ == want || (fd.IsList() && typ == protowire.BytesType && want != protowire.BytesType && want != protowire.StartGroupType)
}

func kindWireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Int64Kind,
		protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	default:
		return protowire.BytesType
	}
}

// packedWellFormed reports whether b is a well-formed packed list of fd's
// scalars.
func packedWellFormed(fd protoreflect.FieldDescriptor, b []byte) bool {
	for len(b) > 0 {
		var n int
		switch kindWireType(fd.Kind()) {
		case protowire.VarintType:
			_, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			_, n = protowire.ConsumeFixed32(b)
		default:
			_, n = protowire.ConsumeFixed64(b)
		}
		if n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}
