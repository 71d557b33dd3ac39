package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// callLog writes one "finished call" line per call, with the message and
// fields of go-grpc-middleware's logging interceptor (which intentd used
// before): protocol, grpc.component, grpc.service, grpc.method,
// grpc.method_type, peer.address, grpc.start_time, grpc.request.deadline,
// grpc.code, grpc.error, grpc.time_ms. Unlike that interceptor, it builds
// nothing until it knows the call's level and the logger takes it: that
// one formats its fields (two timestamps, the peer address, copies of the
// field list, a context value) at the start of every call, which at the
// default level, where a successful call is not logged, was a measurable
// part of a replay's CPU for a line never written (see
// docs/PERFORMANCE.md, "The hot spots").
type callLog struct {
	log *slog.Logger
	// all logs every call at INFO (--access-log); otherwise a successful
	// call is DEBUG, a refusal at the level its code calls for, and
	// health checks and reflection are not logged.
	all bool
}

// level is the level of a call that ended with code.
func (c callLog) level(code codes.Code) slog.Level {
	if code == codes.OK && !c.all {
		return slog.LevelDebug
	}
	return slog.Level(logging.DefaultServerCodeToLevel(code))
}

// quiet reports whether calls of fullMethod go unlogged: health checks and
// reflection (a grpcurl session makes dozens of them), unless all.
func (c callLog) quiet(fullMethod string) bool {
	return !c.all && (strings.HasPrefix(fullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection."))
}

func (c callLog) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		c.finished(ctx, info.FullMethod, nil, start, err)
		return resp, err
	}
}

func (c callLog) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		c.finished(ss.Context(), info.FullMethod, info, start, err)
		return err
	}
}

// finished logs a call of fullMethod (a stream's when info is not nil)
// that started at start and ended with err, if its level is enabled.
func (c callLog) finished(ctx context.Context, fullMethod string, info *grpc.StreamServerInfo, start time.Time, err error) {
	if errors.Is(err, io.EOF) {
		err = nil
	}
	code := status.Code(err)
	level := c.level(code)
	if !c.log.Enabled(ctx, level) || c.quiet(fullMethod) {
		return
	}
	meta := interceptors.NewServerCallMeta(fullMethod, info, nil)
	fields := make([]any, 0, 22)
	fields = append(fields, "protocol", "grpc", "grpc.component", "server",
		"grpc.service", meta.Service, "grpc.method", meta.Method, "grpc.method_type", string(meta.Typ))
	if p, ok := peer.FromContext(ctx); ok {
		fields = append(fields, "peer.address", p.Addr.String())
	}
	fields = append(fields, "grpc.start_time", start.Format(time.RFC3339))
	if d, ok := ctx.Deadline(); ok {
		fields = append(fields, "grpc.request.deadline", d.Format(time.RFC3339))
	}
	fields = append(fields, "grpc.code", code.String())
	if err != nil {
		fields = append(fields, "grpc.error", err.Error())
	}
	ms := float32(time.Since(start).Nanoseconds()/1000) / 1000
	fields = append(fields, "grpc.time_ms", fmt.Sprint(ms))
	c.log.Log(ctx, level, "finished call", fields...)
}
