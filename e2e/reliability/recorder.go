package reliability

import (
	"context"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// Call is one recorded gRPC call: one attempt, as it left the client. A
// client library's retry is a second Call.
type Call struct {
	// Client is the recording connection the call went through.
	Client int
	// Method is the RPC's short name ("Acquire").
	Method string
	// In and Out are the call as the model reads it (In.Kind is 0 for
	// calls the model does not know: sessions, DeriveKey).
	In  Input
	Out Output
	// Session is the session a Heartbeat, OpenSession or CloseSession is
	// about; Leases are the leases a Heartbeat named; StaleKey is the
	// intent a refused Heartbeat names.
	Session  string
	Leases   []HeldLease
	StaleKey string
	// Code is the gRPC status code, Reason its ErrorInfo reason (if any),
	// Message its text.
	Code    codes.Code
	Reason  string
	Message string
	// Start and End are offsets from the Recorder's start.
	Start, End time.Duration
}

// HeldLease is a lease a Heartbeat named.
type HeldLease struct {
	Key   string
	Token uint64
}

// Latency is how long the call took.
func (c Call) Latency() time.Duration { return c.End - c.Start }

// OK reports whether intentd answered without an error.
func (c Call) OK() bool { return c.Code == codes.OK }

// Decided reports whether intentd answered with a decision only etcd can
// back: anything OK but the replay of a final state, which intentd may
// serve from memory.
func (c Call) Decided() bool {
	if !c.OK() {
		return false
	}
	switch c.Out.Outcome {
	case intentv1.Outcome_OUTCOME_COMPLETED, intentv1.Outcome_OUTCOME_FAILED, intentv1.Outcome_OUTCOME_CANCELLED:
		return c.In.Kind != OpAcquire
	}
	return c.Method != "DeriveKey"
}

// Transition reports whether an OK call changed (or confirmed) an intent's
// state: the calls whose acknowledgement must survive.
func (c Call) Transition() bool {
	return c.OK() && c.In.Kind != 0 && c.In.Kind != OpGet && c.In.Kind != OpHeld
}

// Recorder records every call made through the connections it wraps. It is
// safe for concurrent use.
type Recorder struct {
	start time.Time

	mu      sync.Mutex
	calls   []Call
	clients int
}

// NewRecorder starts a history at time zero = now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Since is now as an offset in the history.
func (r *Recorder) Since() time.Duration { return time.Since(r.start) }

// At is t as an offset in the history.
func (r *Recorder) At(t time.Time) time.Duration { return t.Sub(r.start) }

// Conn wraps cc: every unary call through it is recorded under a new
// client id, which it returns too. Streams (Watch) pass through
// unrecorded: they change nothing.
func (r *Recorder) Conn(cc grpc.ClientConnInterface) (grpc.ClientConnInterface, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.clients
	r.clients++
	return &recordingConn{r: r, cc: cc, client: id}, id
}

// Client reserves a client id for calls recorded with Add: a worker
// process's connection, whose calls are made elsewhere.
func (r *Recorder) Client() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.clients
	r.clients++
	return id
}

// Add records a call made outside this process (by a worker process); its
// Start and End are offsets in this history already (At).
func (r *Recorder) Add(c Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

// Calls returns a copy of the history so far, in the order calls ended.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

type recordingConn struct {
	r      *Recorder
	cc     grpc.ClientConnInterface
	client int
}

func (c *recordingConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	start := c.r.Since()
	err := c.cc.Invoke(ctx, method, args, reply, opts...)
	end := c.r.Since()
	call := describe(method, args, reply, err)
	call.Client, call.Start, call.End = c.client, start, end
	c.r.Add(call)
	return err
}

func (c *recordingConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.cc.NewStream(ctx, desc, method, opts...)
}

// refusal reports whether code says intentd decided not to act: every
// other error (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, INTERNAL, a
// broken connection) leaves the outcome unknown.
func refusal(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists,
		codes.PermissionDenied, codes.Unauthenticated, codes.ResourceExhausted, codes.OutOfRange, codes.Unimplemented:
		return true
	}
	return false
}

// resultString is a result's canonical text: external refs sorted, then
// the payload in hex.
func resultString(r *intentv1.Result) string {
	if r == nil {
		return ""
	}
	var parts []string
	for k, v := range r.GetExternalRefs() {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	s := strings.Join(parts, ",")
	if len(r.GetPayload()) > 0 {
		s += "#" + hex.EncodeToString(r.GetPayload())
	}
	return s
}

// describe turns one call into a Call: the model's input and output.
func describe(method string, args, reply any, err error) Call {
	c := Call{Method: method[strings.LastIndex(method, "/")+1:]}
	st, _ := status.FromError(err)
	c.Code, c.Message = st.Code(), st.Message()
	if err != nil {
		if !refusal(c.Code) {
			c.Out.Unknown = true
		}
		c.Out.Reason = c.Code.String()
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				c.Out.Reason = d.GetReason()
				if v, err := strconv.ParseUint(d.GetMetadata()["current_token"], 10, 64); err == nil {
					c.Out.Current = v
				}
			case *intentv1.Statement:
				c.StaleKey = d.GetIntentKey()
				if c.Out.Current == 0 {
					c.Out.Current = d.GetCurrentToken()
				}
			}
		}
		c.Reason = c.Out.Reason
		if c.Out.Unknown {
			c.Out.Reason = "" // the model reads only that nothing is known
		}
	}
	ok := err == nil
	switch a := args.(type) {
	case *intentv1.RegisterRequest:
		c.In = Input{Kind: OpRegister, Key: a.GetKey()}
		if ok {
			c.Out.Created = reply.(*intentv1.RegisterResponse).GetCreated()
		}
	case *intentv1.AcquireRequest:
		c.In = Input{Kind: OpAcquire, Key: a.GetKey(), Session: a.GetSessionId(), Request: a.GetRequestId()}
		c.Session = a.GetSessionId()
		if ok {
			resp := reply.(*intentv1.AcquireResponse)
			c.Out.Outcome = resp.GetOutcome()
			c.Out.Token, c.Out.Holder = resp.GetLease().GetToken(), resp.GetLease().GetSessionId()
			if resp.GetOutcome() == intentv1.Outcome_OUTCOME_COMPLETED {
				c.Out.Result = resultString(resp.GetIntent().GetResult())
			}
		}
	case *intentv1.CompleteRequest:
		c.In = Input{Kind: OpComplete, Key: a.GetKey(), Token: a.GetToken(), Result: resultString(a.GetResult())}
	case *intentv1.MarkUnknownRequest:
		c.In = Input{Kind: OpMarkUnknown, Key: a.GetKey(), Token: a.GetToken()}
	case *intentv1.ReleaseRequest:
		c.In = Input{Kind: OpRelease, Key: a.GetKey(), Token: a.GetToken()}
	case *intentv1.FailRequest:
		c.In = Input{Kind: OpFail, Key: a.GetKey(), Token: a.GetToken()}
	case *intentv1.EscalateRequest:
		if a.GetToken() != 0 { // a reviewer's escalation is not a worker's report
			c.In = Input{Kind: OpEscalate, Key: a.GetKey(), Token: a.GetToken()}
		}
	case *intentv1.GetRequest:
		c.In = Input{Kind: OpGet, Key: a.GetKey()}
		if ok {
			in := reply.(*intentv1.GetResponse).GetIntent()
			c.Out.State, c.Out.Token = in.GetState(), in.GetLease().GetToken()
			c.Out.Live, c.Out.Holder = in.GetLease().GetLive(), in.GetLease().GetSessionId()
			if in.GetState() == intentv1.State_STATE_COMPLETED {
				c.Out.Result = resultString(in.GetResult())
			}
		}
	case *intentv1.HeartbeatRequest:
		c.Session = a.GetSessionId()
		for _, l := range a.GetLeases() {
			c.Leases = append(c.Leases, HeldLease{Key: l.GetKey(), Token: l.GetToken()})
		}
	case *intentv1.OpenSessionRequest:
		if ok {
			c.Session = reply.(*intentv1.OpenSessionResponse).GetSessionId()
		}
	case *intentv1.CloseSessionRequest:
		c.Session = a.GetSessionId()
	}
	return c
}
