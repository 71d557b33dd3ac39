package main

import (
	"context"
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/freeport"
	"github.com/intentd/intentd/internal/run/embedetcd"
	"github.com/intentd/intentd/internal/run/heapfloor"
)

// The front is the floor of a replay that misses the cache: a gRPC
// server, with an etcd embedded in its process as intentd's, that answers
// intentd's very Acquire call with intentd's very answer, stored whole in
// its etcd and read as intentd's miss reads its embedded etcd: from the
// member's own key-value store (embedetcd.LocalGet). It
// neither decodes the request (but for finding its key), nor validates
// it, nor decodes a record or builds an answer: what is left is the part
// of a miss no service can skip. The clients' side is intentd's too (the
// same request, the same answer to decode). front ÷ get is what that
// floor costs against a raw Get on this machine; intentd ÷ front, what
// intentd's own work costs on top of it.

// frontAcquire is the front's one method.
const frontAcquire = "/intentbench.Front/Acquire"

// frame is a message's encoding, passed through as it is: what the
// front's codec decodes a request into, and encodes an answer from.
type frame []byte

// frontCodec passes frames through and encodes anything else (the health
// service's messages) as protobuf.
type frontCodec struct{}

func (frontCodec) Name() string { return "proto" }

func (frontCodec) Marshal(v any) ([]byte, error) {
	if f, ok := v.(*frame); ok {
		return *f, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (frontCodec) Unmarshal(data []byte, v any) error {
	if f, ok := v.(*frame); ok {
		*f = slices.Clone(data) // gRPC may reuse data's buffer
		return nil
	}
	return proto.Unmarshal(data, v.(proto.Message))
}

// frontAnswerer is what the front's service descriptor dispatches to.
type frontAnswerer interface {
	Acquire(ctx context.Context, req frame) (*frame, error)
}

var frontDesc = grpc.ServiceDesc{
	ServiceName: "intentbench.Front",
	HandlerType: (*frontAnswerer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Acquire",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req frame
			if err := dec(&req); err != nil {
				return nil, err
			}
			return srv.(frontAnswerer).Acquire(ctx, req)
		},
	}},
}

// etcdFront answers from its etcd's frontPrefix + the request's key.
type etcdFront struct {
	get func(context.Context, string) (*mvccpb.KeyValue, error)
}

// frontPrefix is where the front's etcd holds each intent's answer.
const frontPrefix = "answer/"

func (f etcdFront) Acquire(ctx context.Context, req frame) (*frame, error) {
	key, ok := acquireKey(req)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "no key")
	}
	kv, err := f.get(ctx, frontPrefix+key)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if kv == nil {
		return nil, status.Errorf(codes.NotFound, "%q: no answer stored", key)
	}
	answer := frame(kv.Value)
	return &answer, nil
}

// keyField is AcquireRequest.key's number.
var keyField = (&intentv1.AcquireRequest{}).ProtoReflect().Descriptor().Fields().ByName("key").Number()

// acquireKey finds an encoded AcquireRequest's key without decoding the
// rest.
func acquireKey(b []byte) (string, bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		if num == keyField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			return string(v), n >= 0
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return "", false
		}
		b = b[n:]
	}
	return "", false
}

// serveFront serves the front on args[0], its etcd's data in args[1],
// until SIGTERM; with the health service too, for waitServing. The front
// reads its etcd's store in process; the etcd serves args[2] (a loopback
// client URL) only for the benchmark to fill it.
func serveFront(args []string) error {
	if len(args) != 3 {
		return errors.New("front: want a listen address, a data directory and a client URL")
	}
	client, err := url.Parse(args[2])
	if err != nil {
		return err
	}
	e, err := startEmbedded("front", args[1], *client)
	if err != nil {
		return err
	}
	defer e.Close()
	// The collector's floor intentd holds by default, so that the front
	// does not collect more often than intentd would.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go heapfloor.Hold(ctx, heapfloor.Default)
	l, err := net.Listen("tcp", args[0])
	if err != nil {
		return err
	}
	s := grpc.NewServer(grpc.ForceServerCodec(frontCodec{}), grpc.NumStreamWorkers(64)) // intentd keeps 64
	// It reads its etcd as intentd reads its embedded one.
	s.RegisterService(&frontDesc, etcdFront{get: embedetcd.LocalGet(e)})
	healthpb.RegisterHealthServer(s, health.NewServer())
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(l) }()
	defer s.Stop()
	return waitTerm(errc)
}

// frontServer is the benchmark's handle on a running front: the gRPC
// server, and a client of its etcd.
type frontServer struct {
	*grpcChild
	etcd *clientv3.Client
}

// startFront starts a front, its data in a directory named front under
// dir.
func startFront(ctx context.Context, dir string) (*frontServer, error) {
	etcdAddr, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	g, err := startGRPCChild(ctx, dir, "front", filepath.Join(dir, "front"), "http://"+etcdAddr)
	if err != nil {
		return nil, err
	}
	s := &frontServer{grpcChild: g}
	if s.etcd, err = etcdClient([]string{etcdAddr}); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// acquire sends req to the front, as to intentd, and decodes its answer:
// an acquireFunc.
func (s *frontServer) acquire(ctx context.Context, req *intentv1.AcquireRequest, opts ...grpc.CallOption) (*intentv1.AcquireResponse, error) {
	out := new(intentv1.AcquireResponse)
	if err := s.conn.Invoke(ctx, frontAcquire, req, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// store puts each intent's answer into the front's etcd.
func (s *frontServer) store(ctx context.Context, keys []string, answers [][]byte) error {
	frontKeys := make([]string, len(keys))
	for i, k := range keys {
		frontKeys[i] = frontPrefix + k
	}
	return putBatched(ctx, s.etcd, frontKeys, answers)
}

func (s *frontServer) close() {
	if s.etcd != nil {
		s.etcd.Close()
	}
	s.grpcChild.close()
}
