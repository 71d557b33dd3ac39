package console

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

// Activity remembers, per tenant, what the overview shows beyond the
// store's state: the recent calls refused for a superseded token or a
// conflict, and how many outcomes became unknown over the last hours. It
// sees the calls this replica answers (its interceptor runs in intentd's
// gRPC chain, after the guard has resolved each call's tenant), from the
// moment the replica started: other replicas keep their own, and a restart
// forgets. Memory is bounded: the last maxRefusals refusals, and
// activityBins bins per tenant seen.
type Activity struct {
	now func() time.Time
	mu  sync.Mutex
	// refusals is a ring of the most recent refusals, oldest first once
	// full (next is where the next one goes).
	refusals []Refusal
	next     int
	bins     map[string]*unknownSeries
}

// Refusal is one refused call the overview lists.
type Refusal struct {
	Time      time.Time
	Tenant    string
	Key       string
	Method    string
	Principal string
	// Reason is the ErrorInfo reason: STALE_TOKEN, FINGERPRINT_MISMATCH,
	// INVALID_TRANSITION or LEASE_HELD.
	Reason string
	// Token is the token the call named; Current the intent's, when the
	// refusal says.
	Token, Current uint64
}

const (
	maxRefusals  = 500
	activityBin  = 10 * time.Minute
	activityBins = 36 // six hours
)

// refusedReasons are the refusals the overview lists: a worker that
// resumed after another took over, a changed decision sent as a retry, and
// a reviewer's decision another decision or worker overtook.
var refusedReasons = map[string]bool{
	vocab.Reason(intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN):          true,
	vocab.Reason(intentv1.ErrorReason_ERROR_REASON_FINGERPRINT_MISMATCH): true,
	vocab.Reason(intentv1.ErrorReason_ERROR_REASON_INVALID_TRANSITION):   true,
	vocab.Reason(intentv1.ErrorReason_ERROR_REASON_LEASE_HELD):           true,
}

// unknownSeries counts, per bin of activityBin, the outcomes that became
// unknown: accepted MarkUnknown reports, and RECONCILE leases (each one is
// issued because an earlier attempt's outcome is unknown, its lease lapsed
// or marked).
type unknownSeries struct {
	// start[i] is the start of the bin counts[i] holds; a bin whose start
	// is not the one expected is stale and reads as zero.
	start            [activityBins]time.Time
	marked, reconcil [activityBins]int
}

// NewActivity returns an empty Activity on the clock now (nil: time.Now).
func NewActivity(now func() time.Time) *Activity {
	if now == nil {
		now = time.Now
	}
	return &Activity{now: now, bins: map[string]*unknownSeries{}}
}

// Unary returns the interceptor that feeds a; it goes after the guard in
// the chain, where each call carries the tenant the guard resolved
// (intent.TenantFrom).
func (a *Activity) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		a.observe(ctx, info.FullMethod, req, resp, err)
		return resp, err
	}
}

func (a *Activity) observe(ctx context.Context, method string, req, resp any, err error) {
	m, ok := req.(proto.Message)
	if !ok {
		return
	}
	tenant, ok := intent.TenantFrom(ctx)
	if !ok || tenant == "" {
		return // DeriveKey, or a call the guard refused before scoping it
	}
	key := stringField(m, "key")
	if err != nil {
		a.refused(ctx, method, tenant, key, m, err)
		return
	}
	switch r := resp.(type) {
	case *intentv1.MarkUnknownResponse:
		a.count(tenant, func(s *unknownSeries, i int) { s.marked[i]++ })
	case *intentv1.AcquireResponse:
		if r.GetOutcome() == intentv1.Outcome_OUTCOME_RECONCILE {
			a.count(tenant, func(s *unknownSeries, i int) { s.reconcil[i]++ })
		}
	}
}

func (a *Activity) refused(ctx context.Context, method, tenant, key string, req proto.Message, err error) {
	var info *errdetails.ErrorInfo
	for _, d := range status.Convert(err).Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || !refusedReasons[info.GetReason()] {
		return
	}
	r := Refusal{
		Time: a.now(), Tenant: tenant, Key: key, Method: method[strings.LastIndexByte(method, '/')+1:],
		Principal: intent.PrincipalFrom(ctx), Reason: info.GetReason(),
	}
	r.Token = uintField(req, "token")
	if r.Token == 0 {
		r.Token = uintField(req, "expected_token")
	}
	r.Current, _ = strconv.ParseUint(info.GetMetadata()["current_token"], 10, 64)
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.refusals) < maxRefusals {
		a.refusals = append(a.refusals, r)
	} else {
		a.refusals[a.next] = r
	}
	a.next = (a.next + 1) % maxRefusals
}

func (a *Activity) count(tenant string, add func(*unknownSeries, int)) {
	now := a.now()
	start := now.Truncate(activityBin)
	i := int(start.Unix()/int64(activityBin/time.Second)) % activityBins
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.bins[tenant]
	if s == nil {
		s = &unknownSeries{}
		a.bins[tenant] = s
	}
	if !s.start[i].Equal(start) {
		s.start[i], s.marked[i], s.reconcil[i] = start, 0, 0
	}
	add(s, i)
}

// Refusals returns tenant's most recent refusals, newest first, at most n.
func (a *Activity) Refusals(tenant string, n int) []Refusal {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Refusal
	for i := range a.refusals {
		// Walk back from the newest.
		j := (a.next - 1 - i + 2*len(a.refusals)) % len(a.refusals)
		if r := a.refusals[j]; r.Tenant == tenant {
			out = append(out, r)
			if len(out) == n {
				break
			}
		}
	}
	return out
}

// UnknownBin is one bin of the unknown-outcomes chart.
type UnknownBin struct {
	Start            time.Time
	Marked, Reconcil int
}

// Unknowns returns tenant's bins over the last activityBins bins, oldest
// first, the current (partial) bin last.
func (a *Activity) Unknowns(tenant string) []UnknownBin {
	now := a.now().Truncate(activityBin)
	out := make([]UnknownBin, activityBins)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.bins[tenant]
	for k := range out {
		start := now.Add(-time.Duration(activityBins-1-k) * activityBin)
		out[k].Start = start
		if s == nil {
			continue
		}
		i := int(start.Unix()/int64(activityBin/time.Second)) % activityBins
		if s.start[i].Equal(start) {
			out[k].Marked, out[k].Reconcil = s.marked[i], s.reconcil[i]
		}
	}
	return out
}

func stringField(m proto.Message, name string) string {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil || fd.Kind() != protoreflect.StringKind {
		return ""
	}
	return r.Get(fd).String()
}

func uintField(m proto.Message, name string) uint64 {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil || fd.Kind() != protoreflect.Uint64Kind {
		return 0
	}
	return r.Get(fd).Uint()
}
