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
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/vocab"
)

// ErrorDomain is the ErrorInfo domain of every intentd error.
const ErrorDomain = "intentd.dev"

// codeOf is the one table of the reasons intentd sends (the proto's
// ErrorReason) and the gRPC code each comes with; TestEveryReasonIsDeclaredEverywhere
// checks it has every reason and the README's table of reasons ("The
// protocol in one screen") says the same.
var codeOf = map[intentv1.ErrorReason]codes.Code{
	intentv1.ErrorReason_ERROR_REASON_INVALID_FIELD:        codes.InvalidArgument,
	intentv1.ErrorReason_ERROR_REASON_INTENT_NOT_FOUND:     codes.NotFound,
	intentv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND:    codes.NotFound,
	intentv1.ErrorReason_ERROR_REASON_FINGERPRINT_MISMATCH: codes.FailedPrecondition,
	intentv1.ErrorReason_ERROR_REASON_INVALID_TRANSITION:   codes.FailedPrecondition,
	intentv1.ErrorReason_ERROR_REASON_RESULT_MISMATCH:      codes.FailedPrecondition,
	intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN:          codes.Aborted,
	intentv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE:    codes.Unavailable,
	intentv1.ErrorReason_ERROR_REASON_INTENT_EXPIRED:       codes.FailedPrecondition,
	intentv1.ErrorReason_ERROR_REASON_LEASE_HELD:           codes.FailedPrecondition,
	intentv1.ErrorReason_ERROR_REASON_REVISION_COMPACTED:   codes.FailedPrecondition,
	intentv1.ErrorReason_ERROR_REASON_TOO_LARGE:            codes.ResourceExhausted,
	intentv1.ErrorReason_ERROR_REASON_STORE_FULL:           codes.ResourceExhausted,
	intentv1.ErrorReason_ERROR_REASON_STORE_ROLLED_BACK:    codes.Unavailable,
	intentv1.ErrorReason_ERROR_REASON_INTERNAL:             codes.Internal,
	intentv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED:      codes.Unauthenticated,
	intentv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED:    codes.PermissionDenied,
	intentv1.ErrorReason_ERROR_REASON_RATE_LIMITED:         codes.ResourceExhausted,
	intentv1.ErrorReason_ERROR_REASON_ARCHIVE_UNAVAILABLE:  codes.Unavailable,
}

// The guard's refusals (server/auth.go), made statuses by toStatus like
// every other error.
type (
	// unauthenticatedError: no principal; why (logged, and sent) says what
	// was wrong with the credentials, if any were offered.
	unauthenticatedError struct{ why string }
	// deniedError: the principal lacks a role or tenant.
	deniedError struct{ principal, method, why string }
	// rateLimitedError: a bucket of the rate limits is empty until retry.
	rateLimitedError struct {
		limit string
		retry time.Duration
	}
	// tenantError is an *intent.InvalidError of the tenant, worded
	// "tenant: <why>" as the guard has always worded it.
	tenantError struct{ *intent.InvalidError }
)

func (e *unauthenticatedError) Error() string {
	if e.why == "" {
		return "unauthenticated"
	}
	return "unauthenticated: " + e.why
}

func (e *deniedError) Error() string {
	return fmt.Sprintf("permission denied: principal %q: %s", e.principal, e.why)
}

func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("rate limit of %s exceeded; retry in %v", e.limit, e.retry)
}

func (e *tenantError) Error() string { return e.Field + ": " + e.Reason }
func (e *tenantError) Unwrap() error { return e.InvalidError }

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
		unauth  *unauthenticatedError
		deny    *deniedError
		limited *rateLimitedError
	)
	switch {
	case errors.As(err, &unauth):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, err.Error(), nil)
	case errors.As(err, &deny):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, err.Error(),
			map[string]string{"principal": deny.principal, "method": deny.method})
	case errors.As(err, &limited):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_RATE_LIMITED, err.Error(),
			map[string]string{"limit": limited.limit},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(limited.retry)})
	case errors.As(err, &invalid):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_INVALID_FIELD, err.Error(),
			map[string]string{"field": invalid.Field},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: invalid.Field, Description: invalid.Reason},
			}})
	case errors.As(err, &stale):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN, err.Error(),
			map[string]string{"current_token": stale.Current.String(), "token": stale.Token.String()},
			refusal(intentv1.StatementStatus_STATEMENT_STATUS_STALE_TOKEN, fmt.Sprintf("stale_token: a newer lease (token %s) superseded yours on intent %s; your report changed nothing and is kept as evidence; acquire again to learn what to do", stale.Current, intentName(stale.Key, stale.Intent)),
				stale.Intent, uint64(stale.Current), true))
	case errors.As(err, &fpm):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_FINGERPRINT_MISMATCH, err.Error(),
			map[string]string{"registered_fingerprint": fpm.Stored, "request_fingerprint": fpm.Given})
	case errors.As(err, &trans):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_INVALID_TRANSITION, err.Error(),
			map[string]string{"state": trans.State.String()},
			refusal(intentv1.StatementStatus_STATEMENT_STATUS_REFUSED, fmt.Sprintf("refused: %s is not allowed on intent %s in state %s", trans.Call, intentName(trans.Key, trans.Intent), trans.State), trans.Intent, 0, trans.Evidence))
	case errors.As(err, &expired):
		// A packed tombstone keeps no fingerprint (docs/DESIGN.md,
		// "Tombstones"): then the metadata has no fingerprint key.
		meta := map[string]string{"final_state": expired.State.String()}
		if expired.Fingerprint != "" {
			meta["fingerprint"] = expired.Fingerprint
		}
		return withDetails(intentv1.ErrorReason_ERROR_REASON_INTENT_EXPIRED, err.Error(), meta)
	case errors.As(err, &compact):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_REVISION_COMPACTED, err.Error(),
			map[string]string{"compact_revision": strconv.FormatInt(compact.Compacted, 10)})
	case errors.Is(err, intent.ErrStoreFull):
		log.Error("etcd backend quota exhausted: compact, defragment and disarm the NOSPACE alarm", "err", err)
		return withDetails(intentv1.ErrorReason_ERROR_REASON_STORE_FULL, "the store is full: intentd serves reads only until an operator frees space; nothing was written", nil)
	case errors.Is(err, intent.ErrTooLarge):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_TOO_LARGE, err.Error(), nil)
	case errors.Is(err, intent.ErrLeaseHeld):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_LEASE_HELD, err.Error(), nil)
	case errors.Is(err, intent.ErrResultMismatch):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_RESULT_MISMATCH, err.Error(), nil)
	case errors.As(err, &missing):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_INTENT_NOT_FOUND, missing.Error(), nil)
	case errors.Is(err, intent.ErrNotFound):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_INTENT_NOT_FOUND, "intent: not found", nil)
	case errors.Is(err, intent.ErrSessionNotFound):
		return withDetails(intentv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session not found: it expired, was closed, or belongs elsewhere; open a new one", nil)
	case errors.Is(err, intent.ErrStoreRolledBack):
		log.Error("etcd's revision went back: refusing to decide anything", "err", err)
		return withDetails(intentv1.ErrorReason_ERROR_REASON_STORE_ROLLED_BACK, "etcd's revision went back below one this replica already saw (restored from a snapshot without a revision bump?): this replica decides nothing until an operator restores with a bump; another replica may serve", nil)
	case errors.Is(err, intent.ErrArchiveUnavailable):
		// Before ErrUnavailable, which it also is: a program tells the
		// archive (PostgreSQL) from etcd by the reason.
		log.Warn("archive unavailable", "err", err)
		return withDetails(intentv1.ErrorReason_ERROR_REASON_ARCHIVE_UNAVAILABLE, "the archive (PostgreSQL) did not answer in time: this call needs an intent that left etcd, or must ask the archive about its key; nothing was decided; retrying the same call is safe once the archive is back", nil)
	case errors.Is(err, intent.ErrUnavailable):
		log.Warn("store unavailable", "err", err)
		return withDetails(intentv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, "etcd did not answer in time; retrying the same call is safe", nil)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded; retrying the same call is safe")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	}
	log.Error("unmapped error", "err", err)
	return withDetails(intentv1.ErrorReason_ERROR_REASON_INTERNAL, "internal error", nil)
}

// withDetails builds the status of a refusal for reason: the code the table
// gives it, msg, and an ErrorInfo with meta, then the more details.
func withDetails(reason intentv1.ErrorReason, msg string, meta map[string]string, more ...proto.Message) error {
	c, ok := codeOf[reason]
	if !ok {
		c = codes.Internal // not reached: a test checks the table has every reason
	}
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: vocab.Reason(reason), Metadata: meta}}
	for _, m := range more {
		details = append(details, protoadapt.MessageV1Of(m))
	}
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		return status.Error(c, msg)
	}
	return st.Err()
}
