package client

import (
	"context"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Client calls intentd. It is safe for concurrent use.
type Client struct {
	rpc  intentv1.IntentServiceClient
	opts options
}

type options struct {
	tenant        string
	callTimeout   time.Duration
	backoffMin    time.Duration
	backoffMax    time.Duration
	reportTimeout time.Duration
	tracer        trace.Tracer
}

// Option configures a Client.
type Option func(*options)

// WithTenant sets the tenant of every request that names none.
func WithTenant(tenant string) Option { return func(o *options) { o.tenant = tenant } }

// WithCallTimeout bounds each attempt of a call (default 10s); a call is
// retried while it is UNAVAILABLE or an attempt times out, until the
// caller's context ends.
func WithCallTimeout(d time.Duration) Option { return func(o *options) { o.callTimeout = d } }

// WithBackoff sets the first and the longest wait between attempts
// (default 50ms and 2s); each wait is jittered.
func WithBackoff(first, longest time.Duration) Option {
	return func(o *options) { o.backoffMin, o.backoffMax = first, longest }
}

// WithReportTimeout bounds how long Run keeps retrying a report after the
// side effect ran (default 1m). A report outlives the caller's context: an
// effect that happened is recorded even if the caller stopped waiting.
func WithReportTimeout(d time.Duration) Option { return func(o *options) { o.reportTimeout = d } }

// WithTracerProvider makes Session.Run start a span of its own, so that
// its calls (traced with a conn dialled with Tracing) and the spans of the
// task's Execute and Reconcile, which get its context, form one trace. The
// span carries the hashed intent key (see docs/OPERATIONS.md, "Tracing"),
// the outcome and whether Run executed, never params or results. Without
// this option, or with a nil tp, Run starts no span.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) {
		o.tracer = nil
		if tp != nil {
			o.tracer = tp.Tracer(tracerName)
		}
	}
}

// New returns a Client on conn (a *grpc.ClientConn, or anything that
// implements the interface, such as an in-process channel).
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	o := options{callTimeout: 10 * time.Second, backoffMin: 50 * time.Millisecond, backoffMax: 2 * time.Second, reportTimeout: time.Minute}
	for _, opt := range opts {
		opt(&o)
	}
	return &Client{rpc: intentv1.NewIntentServiceClient(conn), opts: o}
}

// RPC returns the generated client, for calls this package does not wrap.
func (c *Client) RPC() intentv1.IntentServiceClient { return c.rpc }

// call sends one request, again and again while intentd does not answer
// (UNAVAILABLE, or the attempt's own deadline), with jittered backoff, each
// attempt under its own deadline; it returns at once when ctx ends, and
// never retries a refusal. Every intentd call is safe to repeat: Register
// and reports are idempotent, Acquire by its request id.
func call[Req, Resp any](ctx context.Context, c *Client, rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	return send(ctx, c, rpc, req, retriable)
}

// report is call for a report under a token (Complete, MarkUnknown,
// Release, Fail), which is sent again also while intentd refuses it as
// RATE_LIMITED: what it records may already have happened in the world,
// and a report left unsent leaves the intent to lapse into a lookup. A
// rate-limited call did nothing, so sending it again is as safe as after
// UNAVAILABLE; the report's context bounds the waiting.
func report[Req, Resp any](ctx context.Context, c *Client, rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	return send(ctx, c, rpc, req, func(err error) bool { return retriable(err) || rateLimited(err) })
}

// send is call and report: one request, again while again(err) says so.
func send[Req, Resp any](ctx context.Context, c *Client, rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req, again func(error) bool) (Resp, error) {
	wait := c.opts.backoffMin
	for {
		actx, cancel := context.WithTimeout(ctx, c.opts.callTimeout)
		resp, err := rpc(actx, req)
		cancel()
		if err == nil || !again(err) || ctx.Err() != nil {
			if err != nil && ctx.Err() != nil {
				return resp, ctx.Err()
			}
			return resp, convert(err)
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return resp, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, c.opts.backoffMax)
	}
}

func (c *Client) tenant(t string) string {
	if t == "" {
		return c.opts.tenant
	}
	return t
}

// Register approves an intent (idempotent for the same key and params). A
// request without a request id gets a fresh one, kept across this call's
// retries, so that created stays true when a reply was lost.
func (c *Client) Register(ctx context.Context, req *intentv1.RegisterRequest) (*intentv1.RegisterResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	if req.GetRequestId() == "" {
		req.RequestId = newRequestID()
	}
	return call(ctx, c, c.rpc.Register, req)
}

// DeriveKey returns what Register would compute, storing nothing: the
// canonical key for an action and its identity, and the fingerprint of
// params, for whichever the request gives.
func (c *Client) DeriveKey(ctx context.Context, req *intentv1.DeriveKeyRequest) (*intentv1.DeriveKeyResponse, error) {
	return call(ctx, c, c.rpc.DeriveKey, req)
}

// Fingerprint returns the fingerprint intentd gives params (the one
// Register stores), for an Acquire's expected_fingerprint: a worker that
// holds the terms it is about to act on asserts they are the approved ones
// without reimplementing the canonical form.
func (c *Client) Fingerprint(ctx context.Context, params *structpb.Struct) (string, error) {
	resp, err := c.DeriveKey(ctx, &intentv1.DeriveKeyRequest{Params: params})
	if err != nil {
		return "", err
	}
	return resp.GetFingerprint(), nil
}

// Acquire asks for the right to act on an intent. Retrying with the same
// request id returns the same lease.
func (c *Client) Acquire(ctx context.Context, req *intentv1.AcquireRequest) (*intentv1.AcquireResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	if req.GetRegister() != nil {
		req.Register.Tenant = req.GetTenant()
	}
	return call(ctx, c, c.rpc.Acquire, req)
}

// Complete records the result under the caller's token.
func (c *Client) Complete(ctx context.Context, req *intentv1.CompleteRequest) (*intentv1.CompleteResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return report(ctx, c, c.rpc.Complete, req)
}

// MarkUnknown records that the outcome is unknown, under the caller's token.
func (c *Client) MarkUnknown(ctx context.Context, req *intentv1.MarkUnknownRequest) (*intentv1.MarkUnknownResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return report(ctx, c, c.rpc.MarkUnknown, req)
}

// Release records a confirmed absence, under the caller's token.
func (c *Client) Release(ctx context.Context, req *intentv1.ReleaseRequest) (*intentv1.ReleaseResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return report(ctx, c, c.rpc.Release, req)
}

// Fail records a definite failure, under the caller's token.
func (c *Client) Fail(ctx context.Context, req *intentv1.FailRequest) (*intentv1.FailResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return report(ctx, c, c.rpc.Fail, req)
}

// Escalate hands an intent to a human.
func (c *Client) Escalate(ctx context.Context, req *intentv1.EscalateRequest) (*intentv1.EscalateResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return call(ctx, c, c.rpc.Escalate, req)
}

// Resolve records a reviewer's decision. A request without a request id
// gets a fresh one, kept across this call's retries.
func (c *Client) Resolve(ctx context.Context, req *intentv1.ResolveRequest) (*intentv1.ResolveResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	if req.GetRequestId() == "" {
		req.RequestId = newRequestID()
	}
	return call(ctx, c, c.rpc.Resolve, req)
}

// Cancel withdraws a PENDING intent.
func (c *Client) Cancel(ctx context.Context, req *intentv1.CancelRequest) (*intentv1.CancelResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return call(ctx, c, c.rpc.Cancel, req)
}

// Get reads an intent with its history.
func (c *Client) Get(ctx context.Context, req *intentv1.GetRequest) (*intentv1.GetResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return call(ctx, c, c.rpc.Get, req)
}

// List reads one page of intents.
func (c *Client) List(ctx context.Context, req *intentv1.ListRequest) (*intentv1.ListResponse, error) {
	req.Tenant = c.tenant(req.GetTenant())
	return call(ctx, c, c.rpc.List, req)
}

// Watch calls fn for every change the stream reports until fn returns
// false (Watch then returns nil), ctx ends, or the stream breaks. A broken
// stream is not resumed here: the error says whether to resume (from the
// last revision + 1) or to re-list (ErrCompacted). With req.CreatedNotify
// the first response fn gets is of type TYPE_CREATED (no intent): the watch
// is established, and every change from then on reaches fn — act on it to
// be sure not to miss the change your act causes.
func (c *Client) Watch(ctx context.Context, req *intentv1.WatchRequest, fn func(*intentv1.WatchResponse) bool) error {
	req.Tenant = c.tenant(req.GetTenant())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// ended is err, or ctx's own error once ctx is done, whether the
	// stream was being opened or read: a caller tells an interruption by
	// errors.Is(err, context.Canceled), which gRPC's status does not match.
	ended := func(err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return convert(err)
	}
	stream, err := c.rpc.Watch(ctx, req)
	if err != nil {
		return ended(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return ended(err)
		}
		if !fn(ev) {
			return nil
		}
	}
}
