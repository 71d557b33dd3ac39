package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/text"
)

// Task is one intent to carry through its life with Run.
type Task struct {
	// Key is the intent's key.
	Key string
	// Register, when set, registers the intent in the same etcd
	// transaction as the first Acquire (for callers that both approve and
	// execute); its params must match if the intent exists.
	Register *intentv1.RegisterRequest
	// ExpectedFingerprint, when set, must equal the stored fingerprint.
	ExpectedFingerprint string
	// Execute performs the side effect, once, under att's lease: it must
	// send att.OperationKey(...) as the downstream idempotency key (and
	// att.Token to a resource that checks fencing tokens). Its context is
	// cancelled the moment the lease is lost. Its error decides the report:
	// nil → Complete with the result; Final(...) → Fail; NotAttempted(...)
	// → Release; anything else (a timeout, a reset) → MarkUnknown, never a
	// fresh attempt.
	Execute func(ctx context.Context, att *Attempt) (*intentv1.Result, error)
	// Reconcile finds out whether an earlier attempt took effect, by
	// asking the downstream system by operation key. Found → Complete with
	// the evidence; Absent → Release, then Execute; Undecided → Escalate.
	// An error (the lookup failed) leaves the intent UNKNOWN for the next
	// reconcile. A nil Reconcile escalates every RECONCILE.
	Reconcile func(ctx context.Context, att *Attempt) (Evidence, error)
	// WaitInProgress bounds how long Run waits for another worker's
	// attempt to finish before it returns IN_PROGRESS (default 30s).
	WaitInProgress time.Duration
}

// Attempt is the caller's lease on an intent while Execute or Reconcile
// runs.
type Attempt struct {
	// Key is the intent's key.
	Key string
	// Token is the lease's fencing token: send it to resources that check
	// tokens (fencing.Header).
	Token fencing.Token
	// Reconciling is true in Reconcile: an earlier attempt may have taken
	// effect.
	Reconciling bool
	// Intent is the intent as acquired: its params are the approved terms.
	Intent *intentv1.Intent

	children []*intentv1.RegisterRequest
}

// OperationKey is "<key>:<operation>", the idempotency key to send to the
// downstream provider for one kind of call. It is the same for every
// attempt and every worker: that is what makes a retry a retry.
func (a *Attempt) OperationKey(operation string) string { return intent.OperationKey(a.Key, operation) }

// RegisterChild asks for a child intent to be registered in the same
// transaction as this attempt's Complete (the outbox): it exists if and
// only if this intent completes.
func (a *Attempt) RegisterChild(child *intentv1.RegisterRequest) {
	a.children = append(a.children, child)
}

// Evidence is what Reconcile found out.
type Evidence struct {
	verdict int
	result  *intentv1.Result
	reason  string
}

const (
	undecided = iota
	found
	absent
)

// Found says the effect exists downstream; result records it (the order
// id, as external refs).
func Found(result *intentv1.Result) Evidence { return Evidence{verdict: found, result: result} }

// Absent says the downstream system confirmed the effect does not exist:
// the intent may be executed again, with the same operation keys.
func Absent(reason string) Evidence { return Evidence{verdict: absent, reason: reason} }

// Undecided says the answer cannot be told: a human decides.
func Undecided(reason string) Evidence { return Evidence{verdict: undecided, reason: reason} }

// FinalError marks a definite failure (a declined card): the intent FAILS
// for good. Make one with Final.
type FinalError struct {
	Code string
	Err  error
}

func (e *FinalError) Error() string { return fmt.Sprintf("final failure %s: %v", e.Code, e.Err) }
func (e *FinalError) Unwrap() error { return e.Err }

// Final marks err as a definite failure with a short code.
func Final(code string, err error) error { return &FinalError{Code: code, Err: err} }

// NotAttemptedError marks an error that happened before anything was sent
// downstream: the intent returns to PENDING. Make one with NotAttempted.
type NotAttemptedError struct{ Err error }

func (e *NotAttemptedError) Error() string { return "not attempted: " + e.Err.Error() }
func (e *NotAttemptedError) Unwrap() error { return e.Err }

// NotAttempted marks err as certain to have had no effect downstream.
func NotAttempted(err error) error { return &NotAttemptedError{Err: err} }

// Outcome is how Run left the intent.
type Outcome struct {
	// Outcome is the last word: COMPLETED, FAILED, CANCELLED, IN_PROGRESS
	// (another worker still holds it), NEEDS_REVIEW (escalated, or this
	// Run's MarkUnknown was one attempt too many: see Intent.attempts) or
	// EXPIRED — or UNSPECIFIED when this Run left it UNKNOWN or PENDING
	// (see Intent.State).
	Outcome intentv1.Outcome
	// Intent is the intent as Run last saw it.
	Intent *intentv1.Intent
	// Executed is true when this Run called Execute.
	Executed bool
	// Superseded is true when a lease of this Run was taken over by
	// another worker or a reviewer: its report was kept as evidence only.
	Superseded bool
	// Statement is intentd's account of the last Acquire.
	Statement *intentv1.Statement
}

// Result is the stored result of a COMPLETED intent.
func (o *Outcome) Result() *intentv1.Result { return o.Intent.GetResult() }

// ErrLeaseLost is returned (wrapped) when the lease was lost while Execute
// or Reconcile ran and nobody took over: the report was still sent, and
// accepted as the best evidence there is.
var ErrLeaseLost = errors.New("client: lease lost")

// maxTakeovers bounds how often one Run re-acquires after its lease was
// superseded, so that two parties cannot bounce an intent forever.
const maxTakeovers = 3

// Run carries one intent through its life on this session: acquire; if
// done, return the stored result without executing; if another worker
// holds it, wait (watching) up to task.WaitInProgress; if an earlier
// attempt's outcome is unknown, reconcile; otherwise execute once and
// report. It never executes an intent on a doubt: after any doubt it
// reconciles or escalates. When its report is refused because another
// worker or a reviewer took over (ABORTED), it acquires again to learn
// what became of the intent, and follows that.
func (s *Session) Run(ctx context.Context, task Task) (*Outcome, error) {
	ctx, span := s.c.startRun(ctx, s.tenant, task.Key)
	out, err := s.run(ctx, task)
	endRun(span, out, err)
	return out, err
}

// run is Run, inside its span.
func (s *Session) run(ctx context.Context, task Task) (*Outcome, error) {
	if task.Execute == nil {
		return nil, errors.New("client: Task.Execute is required")
	}
	wait := task.WaitInProgress
	if wait == 0 {
		wait = 30 * time.Second
	}
	deadline := time.Now().Add(wait)
	executed, superseded, takeovers := false, false, 0
	var prev error // why the last lease was lost, when Run re-acquires after it
	for {
		if err := s.Err(); err != nil {
			// A lost session would hand out leases it cannot keep.
			if prev != nil {
				return nil, prev
			}
			return nil, err
		}
		acq, err := s.acquire(ctx, &task, newRequestID())
		if err != nil {
			return nil, err
		}
		var out *Outcome
		switch acq.GetOutcome() {
		case intentv1.Outcome_OUTCOME_EXECUTE:
			executed = true
			out, err = s.execute(ctx, &task, acq)
		case intentv1.Outcome_OUTCOME_RECONCILE:
			var again bool
			if again, out, err = s.reconcile(ctx, &task, acq); err == nil && again {
				continue // confirmed absent: acquire again and execute
			}
		case intentv1.Outcome_OUTCOME_IN_PROGRESS:
			if time.Now().Before(deadline) {
				if err := s.waitWhileHeld(ctx, task.Key, acq, deadline); err != nil {
					return nil, err
				}
				continue
			}
			out = &Outcome{Outcome: acq.GetOutcome(), Intent: acq.GetIntent(), Statement: acq.GetStatement()}
		default: // final, needs review, expired: nothing to do
			out = &Outcome{Outcome: acq.GetOutcome(), Intent: acq.GetIntent(), Statement: acq.GetStatement()}
		}
		if errors.Is(err, ErrStaleToken) && takeovers < maxTakeovers && ctx.Err() == nil {
			// ABORTED: someone took over. Acquire again to learn what
			// became of the intent.
			superseded, takeovers, prev = true, takeovers+1, err
			continue
		}
		if out != nil {
			out.Executed, out.Superseded = executed, superseded
		}
		return out, err
	}
}

// acquire sends Acquire. If the caller's context ends before the answer
// arrives, the lease may have been issued all the same (the answer was
// lost): it asks again with the same request id, detached from the
// caller, and gives back a lease it got — Release for EXECUTE (nothing was
// done), MarkUnknown for RECONCILE — so that the intent is not held by a
// worker that is not working on it.
func (s *Session) acquire(ctx context.Context, task *Task, requestID string) (*intentv1.AcquireResponse, error) {
	req := &intentv1.AcquireRequest{Key: task.Key, SessionId: s.id, RequestId: requestID, ExpectedFingerprint: task.ExpectedFingerprint}
	if task.Register != nil {
		req.Register = proto.CloneOf(task.Register)
		req.Register.Key = task.Key
	}
	acq, err := s.c.Acquire(ctx, req)
	if err == nil || ctx.Err() == nil {
		return acq, err
	}
	rctx, cancel := s.reportCtx(ctx)
	defer cancel()
	if got, gerr := s.c.Acquire(rctx, req); gerr == nil && got.GetLease() != nil && got.GetLease().GetSessionId() == s.id {
		t := got.GetLease().GetToken()
		switch got.GetOutcome() {
		case intentv1.Outcome_OUTCOME_EXECUTE:
			_, _ = s.c.Release(rctx, &intentv1.ReleaseRequest{Key: task.Key, Token: t, Reason: "caller gave up before acting"})
		case intentv1.Outcome_OUTCOME_RECONCILE:
			_, _ = s.c.MarkUnknown(rctx, &intentv1.MarkUnknownRequest{Key: task.Key, Token: t, Reason: "caller gave up before reconciling"})
		}
	}
	return nil, err
}

// underLease runs fn under a lease: its context ends when the lease is
// lost or the caller's context ends. A lease already lost when it starts
// (the session was lost meanwhile) does not run fn at all.
func (s *Session) underLease(ctx context.Context, key string, t fencing.Token, fn func(context.Context) error) (lost bool, err error) {
	lostCh := s.track(key, t)
	defer s.untrack(key, t)
	select {
	case <-lostCh:
		return true, NotAttempted(fmt.Errorf("%w before it started", ErrLeaseLost))
	default:
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // exits when the lease is lost or fn returned
		select {
		case <-lostCh:
			cancel()
		case <-lctx.Done():
		}
	}()
	err = fn(lctx)
	select {
	case <-lostCh:
		return true, err
	default:
		return false, err
	}
}

// reportCtx outlives the caller's context: an effect that happened must be
// recorded even when the caller stopped waiting.
func (s *Session) reportCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.c.opts.reportTimeout)
}

func (s *Session) execute(ctx context.Context, task *Task, acq *intentv1.AcquireResponse) (*Outcome, error) {
	att := &Attempt{Key: task.Key, Token: fencing.Token(acq.GetLease().GetToken()), Intent: acq.GetIntent()}
	var res *intentv1.Result
	lost, err := s.underLease(ctx, task.Key, att.Token, func(ctx context.Context) error {
		var err error
		res, err = task.Execute(ctx, att)
		return err
	})
	rctx, cancel := s.reportCtx(ctx)
	defer cancel()
	base := intentv1.Outcome_OUTCOME_UNSPECIFIED
	var in *intentv1.Intent
	var final *FinalError
	var none *NotAttemptedError
	var rerr error
	markUnknown := func(reason string) {
		var resp *intentv1.MarkUnknownResponse
		resp, rerr = s.c.MarkUnknown(rctx, &intentv1.MarkUnknownRequest{Key: task.Key, Token: uint64(att.Token), Reason: text.Cut(reason, maxReason)})
		in, base = resp.GetIntent(), markedUnknown(resp.GetIntent())
	}
	switch {
	case err == nil:
		var resp *intentv1.CompleteResponse
		resp, rerr = s.c.Complete(rctx, &intentv1.CompleteRequest{Key: task.Key, Token: uint64(att.Token), Result: res, Children: att.children})
		in, base = resp.GetIntent(), intentv1.Outcome_OUTCOME_COMPLETED
		if unrecordable(rerr) {
			// The effect happened, and what Execute returned cannot be
			// recorded (too large, too many references): the intent is
			// UNKNOWN, for a lookup to record what exists, rather than
			// held by this session's lease while it lives.
			err = rerr
			markUnknown("the result could not be recorded: " + rerr.Error())
		}
	case errors.As(err, &final):
		var resp *intentv1.FailResponse
		resp, rerr = s.c.Fail(rctx, &intentv1.FailRequest{Key: task.Key, Token: uint64(att.Token), Failure: &intentv1.Failure{Code: text.Cut(final.Code, maxFailureCode), Message: text.Cut(final.Err.Error(), maxFailureMessage)}})
		in, base = resp.GetIntent(), intentv1.Outcome_OUTCOME_FAILED
		if unrecordable(rerr) { // an empty code, say
			err = rerr
			markUnknown("the failure could not be recorded: " + rerr.Error())
		}
	case errors.As(err, &none):
		var resp *intentv1.ReleaseResponse
		resp, rerr = s.c.Release(rctx, &intentv1.ReleaseRequest{Key: task.Key, Token: uint64(att.Token), Reason: text.Cut(none.Error(), maxReason)})
		in = resp.GetIntent()
	default:
		markUnknown(err.Error())
	}
	if rerr != nil {
		return nil, leaseErr(lost, rerr)
	}
	out := &Outcome{Outcome: base, Intent: in}
	if err != nil && (base == intentv1.Outcome_OUTCOME_UNSPECIFIED || base == intentv1.Outcome_OUTCOME_NEEDS_REVIEW) {
		// Left UNKNOWN (or PENDING, or to a human): say why, and whether
		// the lease was lost under Execute, although nobody took over.
		return out, leaseErr(lost, err)
	}
	return out, nil
}

// reconcile asks the caller's Reconcile what became of an earlier attempt
// and reports it. again is true after a confirmed absence: the caller
// acquires again and executes.
func (s *Session) reconcile(ctx context.Context, task *Task, acq *intentv1.AcquireResponse) (again bool, out *Outcome, err error) {
	att := &Attempt{Key: task.Key, Token: fencing.Token(acq.GetLease().GetToken()), Reconciling: true, Intent: acq.GetIntent()}
	ev := Undecided("no reconcile function")
	var rerr error
	lost := false
	if task.Reconcile != nil {
		lost, rerr = s.underLease(ctx, task.Key, att.Token, func(ctx context.Context) error {
			var err error
			ev, err = task.Reconcile(ctx, att)
			return err
		})
	}
	rctx, cancel := s.reportCtx(ctx)
	defer cancel()
	token := uint64(att.Token)
	if rerr != nil {
		// The lookup itself failed (the provider is down, the lease was
		// lost): nothing was learned. Leave the intent UNKNOWN for the
		// next reconcile rather than for a human.
		resp, err := s.c.MarkUnknown(rctx, &intentv1.MarkUnknownRequest{Key: task.Key, Token: token, Reason: text.Cut("reconcile failed: "+rerr.Error(), maxReason)})
		if err != nil {
			return false, nil, leaseErr(lost, err)
		}
		return false, &Outcome{Outcome: markedUnknown(resp.GetIntent()), Intent: resp.GetIntent()}, leaseErr(lost, rerr)
	}
	switch ev.verdict {
	case found:
		resp, err := s.c.Complete(rctx, &intentv1.CompleteRequest{Key: task.Key, Token: token, Result: ev.result, Children: att.children})
		if unrecordable(err) {
			// The effect exists and what was found cannot be recorded: a
			// person records it (another lookup would find the same).
			eresp, eerr := s.c.Escalate(rctx, &intentv1.EscalateRequest{Key: task.Key, Token: token, Actor: "client.Run",
				Reason: text.Cut("found downstream, but the result could not be recorded: "+err.Error(), maxReason)})
			if eerr != nil {
				return false, nil, leaseErr(lost, eerr)
			}
			return false, &Outcome{Outcome: intentv1.Outcome_OUTCOME_NEEDS_REVIEW, Intent: eresp.GetIntent()}, leaseErr(lost, err)
		}
		if err != nil {
			return false, nil, leaseErr(lost, err)
		}
		return false, &Outcome{Outcome: intentv1.Outcome_OUTCOME_COMPLETED, Intent: resp.GetIntent()}, nil
	case absent:
		if _, err := s.c.Release(rctx, &intentv1.ReleaseRequest{Key: task.Key, Token: token, Reason: text.Cut(ev.reason, maxReason)}); err != nil {
			return false, nil, leaseErr(lost, err)
		}
		return true, nil, nil
	default:
		resp, err := s.c.Escalate(rctx, &intentv1.EscalateRequest{Key: task.Key, Token: token, Reason: text.Cut(ev.reason, maxReason), Actor: "client.Run"})
		if err != nil {
			return false, nil, leaseErr(lost, err)
		}
		return false, &Outcome{Outcome: intentv1.Outcome_OUTCOME_NEEDS_REVIEW, Intent: resp.GetIntent()}, nil
	}
}

// markedUnknown is the Outcome of an accepted MarkUnknown: UNSPECIFIED (the
// intent is left UNKNOWN), or NEEDS_REVIEW when that attempt was the one
// that reached the intent's max_attempts.
func markedUnknown(in *intentv1.Intent) intentv1.Outcome {
	if in.GetState() == intentv1.State_STATE_NEEDS_REVIEW {
		return intentv1.Outcome_OUTCOME_NEEDS_REVIEW
	}
	return intentv1.Outcome_OUTCOME_UNSPECIFIED
}

func leaseErr(lost bool, err error) error {
	if lost {
		return fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return err
}

// waitWhileHeld waits until the intent leaves IN_PROGRESS, watching its
// record from the revision Acquire saw, or until deadline. A watch that
// breaks falls back to a short sleep: the next Acquire tells the truth
// anyway.
func (s *Session) waitWhileHeld(ctx context.Context, key string, acq *intentv1.AcquireResponse, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// From the revision Acquire saw, not from now: a change between the
	// Acquire and the watch's start is not missed.
	err := s.c.Watch(wctx, &intentv1.WatchRequest{Key: key, StartRevision: acq.GetIntent().GetRevision() + 1}, func(ev *intentv1.WatchResponse) bool {
		// Keep waiting on what is not a change that left IN_PROGRESS (the
		// created notice, should a request ask for it).
		return ev.GetType() == intentv1.WatchResponse_TYPE_CREATED || ev.GetIntent().GetState() == intentv1.State_STATE_IN_PROGRESS
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil && wctx.Err() == nil {
		t := time.NewTimer(s.c.opts.backoffMin)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The limits of a report's free text (intent.proto), in bytes: run cuts
// what it reports to them, so that a report is never refused for the
// length of an error message.
const (
	maxReason         = 1024
	maxFailureCode    = 128
	maxFailureMessage = 1024
)

// unrecordable reports whether a report was refused for what it carries —
// a result or failure intentd's limits do not allow, or one protobuf
// cannot encode (a string that is not UTF-8) — so that the same report
// would be refused again.
func unrecordable(err error) bool {
	var e *Error
	return errors.Is(err, ErrInvalidArgument) || errors.As(err, &e) && e.Code == codes.Internal && strings.HasPrefix(e.Message, "grpc: error while marshaling")
}
