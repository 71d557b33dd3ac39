package etcdstore

import (
	"context"
	"time"
	"unsafe"

	"github.com/intentd/intentd/etcdstore/internal/storagepb"
	"github.com/intentd/intentd/fencing"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// The fencing gateway's two calls (machine's submission.go decides them).
// Each is one transition on the intent's record: a BeginSubmission that
// forwards writes the in-flight submission guarded by the record's
// revision and the holder's session, so the token check and the record
// that the submission started are one etcd transaction.

// BeginSubmission decides whether the gateway may send a request of
// st.Operation upstream under st.Token (see machine.Rules.BeginSubmission):
// Forward (recorded as in flight), Replay of the recorded answer, Busy,
// Unknown, or Lookup. A superseded token is a *intent.StaleTokenError,
// kept as evidence.
func (s *Store) BeginSubmission(ctx context.Context, st intent.SubmissionStart) (*intent.SubmissionBegun, error) {
	start := s.optimisticHeld(st.Tenant, st.Key)
	load := func(ctx context.Context) (*machine.View, error) { return s.read(ctx, st.Tenant, st.Key, nil) }
	call := machine.BeginCall{Start: &st, Principal: intent.PrincipalFrom(ctx)}
	ctx, decide, done := s.archivable(ctx, func(v *machine.View) machine.Decision {
		return s.rules.BeginSubmission(v, call, s.cfg.Now())
	})
	a, err := s.transition(ctx, st.Tenant, st.Key, start, load, decide)
	if err = done(err); err != nil {
		return nil, err
	}
	return &intent.SubmissionBegun{Verdict: a.Verdict, Submission: a.Submission, Intent: a.Intent, Replayed: a.Replayed}, nil
}

// RecordSubmission keeps what the gateway learned of a submission (see
// machine.Rules.RecordSubmission) before the gateway answers the worker.
func (s *Store) RecordSubmission(ctx context.Context, e intent.SubmissionEnd) (*intent.SubmissionRecord, error) {
	start := s.optimisticHeld(e.Tenant, e.Key) // the guards send us to a fresh read if it changed
	load := func(ctx context.Context) (*machine.View, error) { return s.read(ctx, e.Tenant, e.Key, nil) }
	call := machine.RecordCall{End: &e, Principal: intent.PrincipalFrom(ctx)}
	ctx, decide, done := s.archivable(ctx, func(v *machine.View) machine.Decision {
		return s.rules.RecordSubmission(v, call, s.cfg.Now())
	})
	a, err := s.transition(ctx, e.Tenant, e.Key, start, load, decide)
	if err = done(err); err != nil {
		return nil, err
	}
	return &intent.SubmissionRecord{Submission: a.Submission, Intent: a.Intent, Replayed: a.Replayed}, nil
}

// optimisticHeld is a view of an intent from the record cache with its
// holder's session from the session cache, when both are there: a
// BeginSubmission from it commits in one round trip, its guards (the
// record's revision, the holder's session) sending it to a fresh read if
// either changed. nil when either is missing.
func (s *Store) optimisticHeld(tenant, key string) *machine.View {
	c, ok := s.cachedEntry(tenant, key)
	if !ok {
		return nil
	}
	v := c.view(key)
	if l := c.rec.Lease; l != nil {
		if sess, ok := s.sessions.Get(l.SessionID); ok && sess.tenant == tenant {
			v.Sessions = map[string]int64{l.SessionID: sess.rev}
		}
	}
	return v
}

// toCompactSubmissions is a record's submissions in their stored form,
// times after c's base.
func toCompactSubmissions(subs []intent.Submission, c *times) []*storagepb.Submission {
	if len(subs) == 0 {
		return nil
	}
	out := make([]*storagepb.Submission, len(subs))
	for i := range subs {
		s := &subs[i]
		m := &storagepb.Submission{
			Operation: s.Operation, Id: s.ID, Token: uint64(s.Token), State: int32(s.State),
			Upstream: s.Request.Upstream, Method: s.Request.Method, Target: s.Request.Target,
			BodyBytes: s.Request.BodyBytes, Body: s.Request.Body, HasLookup: s.HasLookup,
			StartedAt: c.since(s.StartedAt), Deadline: c.since(s.Deadline), EndedAt: c.since(s.EndedAt),
			LookedUp: s.LookedUp, Error: s.Error,
		}
		m.BodySha256, m.BodySha256Text = hexBytes(s.Request.BodySHA256)
		if r := s.Response; r != nil {
			m.Response = &storagepb.UpstreamResponse{Status: int32(r.Status), Body: r.Body, BodyBytes: r.BodyBytes}
			for _, h := range r.Header {
				m.Response.Headers = append(m.Response.Headers, &storagepb.Header{Name: h.Name, Value: h.Value})
			}
		}
		out[i] = m
	}
	return out
}

// fromCompactSubmissions is the submissions a stored record holds, times
// after created.
func fromCompactSubmissions(ms []*storagepb.Submission, created time.Time) []intent.Submission {
	if len(ms) == 0 {
		return nil
	}
	out := make([]intent.Submission, len(ms))
	for i, m := range ms {
		s := intent.Submission{
			Operation: m.Operation, ID: m.Id, Token: fencing.Token(m.Token), State: intent.SubmissionState(m.State),
			Request: intent.SubmittedRequest{Upstream: m.Upstream, Method: m.Method, Target: m.Target,
				BodySHA256: hexString(m.BodySha256, m.BodySha256Text), BodyBytes: m.BodyBytes, Body: m.Body},
			HasLookup: m.HasLookup, StartedAt: after(created, m.StartedAt), Deadline: after(created, m.Deadline),
			EndedAt: after(created, m.EndedAt), LookedUp: m.LookedUp, Error: m.Error,
		}
		if r := m.Response; r != nil {
			s.Response = &intent.UpstreamResponse{Status: int(r.Status), Body: r.Body, BodyBytes: r.BodyBytes}
			if len(r.Headers) > 0 {
				s.Response.Header = make([]intent.HeaderField, len(r.Headers))
				for j, h := range r.Headers {
					s.Response.Header[j] = intent.HeaderField{Name: h.Name, Value: h.Value}
				}
			}
		}
		out[i] = s
	}
	return out
}

// eachSubmissionTime calls f with each time the submissions hold (for
// eachTime).
func eachSubmissionTime(subs []intent.Submission, f func(*time.Time)) {
	for i := range subs {
		f(&subs[i].StartedAt)
		f(&subs[i].Deadline)
		f(&subs[i].EndedAt)
	}
}

// submissionsBytes estimates the heap a record's submissions occupy (for
// recordBytes).
func submissionsBytes(subs []intent.Submission) int64 {
	if subs == nil {
		return 0
	}
	n := alloc(cap(subs) * int(submissionSize))
	for i := range subs {
		s := &subs[i]
		n += alloc(len(s.Operation)) + alloc(len(s.ID)) + alloc(len(s.Request.Upstream)) + alloc(len(s.Request.Method)) +
			alloc(len(s.Request.Target)) + alloc(len(s.Request.BodySHA256)) + alloc(cap(s.Request.Body)) + alloc(len(s.Error))
		if r := s.Response; r != nil {
			n += alloc(int(responseSize)) + alloc(cap(r.Body)) + alloc(cap(r.Header)*int(headerFieldSize))
			for _, h := range r.Header {
				n += alloc(len(h.Name)) + alloc(len(h.Value))
			}
		}
	}
	return n
}

var (
	submissionSize  = int64(unsafe.Sizeof(intent.Submission{}))
	responseSize    = int64(unsafe.Sizeof(intent.UpstreamResponse{}))
	headerFieldSize = int64(unsafe.Sizeof(intent.HeaderField{}))
)
