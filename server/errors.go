package server

// Errors become gRPC statuses here and nowhere else. The reading of codes,
// after grpc-go's codes package:
//
//   - INVALID_ARGUMENT: the request is wrong whatever the state of the
//     intent; fix it, do not retry it.
//   - FAILED_PRECONDITION: the request is well formed but the intent's state
//     forbids it (another fingerprint, a final state); retrying the same call
//     will fail the same way until someone changes the intent.
//   - ABORTED: the caller lost a race (its token was superseded); retry at a
//     higher level: Acquire again, and reconcile.
//   - UNAVAILABLE: etcd did not answer; retrying the very same call is safe,
//     because every operation recognizes its own earlier effect.
//
// Every error carries a google.rpc.ErrorInfo with domain "intentd.dev" and a
// reason a program can switch on. An error this table does not know becomes
// INTERNAL with a generic message: its text is logged, never sent.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/intentd/intentd/intent"
)

// ErrorDomain is the ErrorInfo domain of every intentd error.
const ErrorDomain = "intentd.dev"

// The ErrorInfo reasons intentd returns.
const (
	ReasonInvalidField        = "INVALID_FIELD"
	ReasonIntentNotFound      = "INTENT_NOT_FOUND"
	ReasonSessionNotFound     = "SESSION_NOT_FOUND"
	ReasonFingerprintMismatch = "FINGERPRINT_MISMATCH"
	ReasonInvalidTransition   = "INVALID_TRANSITION"
	ReasonResultMismatch      = "RESULT_MISMATCH"
	ReasonStaleToken          = "STALE_TOKEN"
	ReasonStoreUnavailable    = "STORE_UNAVAILABLE"
	ReasonIntentExpired       = "INTENT_EXPIRED"
	ReasonLeaseHeld           = "LEASE_HELD"
	ReasonRevisionCompacted   = "REVISION_COMPACTED"
	ReasonTooLarge            = "TOO_LARGE"
	ReasonStoreFull           = "STORE_FULL"
	ReasonStoreRolledBack     = "STORE_ROLLED_BACK"
	ReasonInternal            = "INTERNAL"
)

// toStatus maps a domain error to a gRPC status error.
func toStatus(log *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	var (
		invalid *intent.InvalidError
		stale   *intent.StaleTokenError
		fpm     *intent.FingerprintMismatchError
		trans   *intent.TransitionError
		expired *intent.ExpiredError
		compact *intent.CompactedError
		missing *intent.NotFoundError
	)
	switch {
	case errors.As(err, &invalid):
		return withDetails(codes.InvalidArgument, err.Error(), ReasonInvalidField,
			map[string]string{"field": invalid.Field},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: invalid.Field, Description: invalid.Reason},
			}})
	case errors.As(err, &stale):
		return withDetails(codes.Aborted, err.Error(), ReasonStaleToken,
			map[string]string{"current_token": stale.Current.String(), "token": stale.Token.String()},
			refusal("stale_token", fmt.Sprintf("stale_token: a newer lease (token %s) superseded yours on intent %s; your report changed nothing and is kept as evidence; acquire again to learn what to do", stale.Current, stale.Key),
				stale.Intent, uint64(stale.Current), true))
	case errors.As(err, &fpm):
		return withDetails(codes.FailedPrecondition, err.Error(), ReasonFingerprintMismatch,
			map[string]string{"registered_fingerprint": fpm.Stored, "request_fingerprint": fpm.Given})
	case errors.As(err, &trans):
		return withDetails(codes.FailedPrecondition, err.Error(), ReasonInvalidTransition,
			map[string]string{"state": trans.State.String()},
			refusal("refused", fmt.Sprintf("refused: %s is not allowed on intent %s in state %s", trans.Call, trans.Key, trans.State), trans.Intent, 0, trans.Evidence))
	case errors.As(err, &expired):
		return withDetails(codes.FailedPrecondition, err.Error(), ReasonIntentExpired,
			map[string]string{"final_state": expired.State.String(), "fingerprint": expired.Fingerprint})
	case errors.As(err, &compact):
		return withDetails(codes.FailedPrecondition, err.Error(), ReasonRevisionCompacted,
			map[string]string{"compact_revision": strconv.FormatInt(compact.Compacted, 10)})
	case errors.Is(err, intent.ErrStoreFull):
		log.Error("etcd backend quota exhausted: compact, defragment and disarm the NOSPACE alarm", "err", err)
		return withDetails(codes.ResourceExhausted, "the store is full: intentd serves reads only until an operator frees space; nothing was written", ReasonStoreFull, nil)
	case errors.Is(err, intent.ErrTooLarge):
		return withDetails(codes.ResourceExhausted, err.Error(), ReasonTooLarge, nil)
	case errors.Is(err, intent.ErrLeaseHeld):
		return withDetails(codes.FailedPrecondition, err.Error(), ReasonLeaseHeld, nil)
	case errors.Is(err, intent.ErrResultMismatch):
		return withDetails(codes.FailedPrecondition, err.Error(), ReasonResultMismatch, nil)
	case errors.As(err, &missing):
		return withDetails(codes.NotFound, missing.Error(), ReasonIntentNotFound, nil)
	case errors.Is(err, intent.ErrNotFound):
		return withDetails(codes.NotFound, "intent: not found", ReasonIntentNotFound, nil)
	case errors.Is(err, intent.ErrSessionNotFound):
		return withDetails(codes.NotFound, "session not found: it expired, was closed, or belongs elsewhere; open a new one", ReasonSessionNotFound, nil)
	case errors.Is(err, intent.ErrStoreRolledBack):
		log.Error("etcd's revision went back: refusing to decide anything", "err", err)
		return withDetails(codes.Unavailable, "etcd's revision went back below one this replica already saw (restored from a snapshot without a revision bump?): this replica decides nothing until an operator restores with a bump; another replica may serve", ReasonStoreRolledBack, nil)
	case errors.Is(err, intent.ErrUnavailable):
		log.Warn("store unavailable", "err", err)
		return withDetails(codes.Unavailable, "etcd did not answer in time; retrying the same call is safe", ReasonStoreUnavailable, nil)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded; retrying the same call is safe")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	}
	log.Error("unmapped error", "err", err)
	return withDetails(codes.Internal, "internal error", ReasonInternal, nil)
}

func withDetails(c codes.Code, msg, reason string, meta map[string]string, more ...proto.Message) error {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: reason, Metadata: meta}}
	for _, m := range more {
		details = append(details, protoadapt.MessageV1Of(m))
	}
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		return status.Error(c, msg)
	}
	return st.Err()
}
