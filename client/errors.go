package client

import (
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/internal/core/vocab"
)

// Errors intentd returns, for errors.Is. Every error a Client method
// returns for a refused call is an *Error that matches exactly one of them
// (by its ErrorInfo reason, else by its gRPC code), and for the finer ones
// below also the one they refine.
var (
	ErrInvalidArgument     = errors.New("client: invalid argument")
	ErrNotFound            = errors.New("client: intent not found")
	ErrSessionNotFound     = errors.New("client: session not found")
	ErrFingerprintMismatch = errors.New("client: fingerprint mismatch")
	ErrInvalidTransition   = errors.New("client: invalid transition")
	ErrResultMismatch      = errors.New("client: result mismatch")
	ErrStaleToken          = errors.New("client: stale token")
	ErrExpired             = errors.New("client: intent expired")
	ErrLeaseHeld           = errors.New("client: held under a live lease")
	ErrCompacted           = errors.New("client: revision compacted")
	ErrUnavailable         = errors.New("client: intentd unavailable")
	ErrUnauthenticated     = errors.New("client: unauthenticated")
	ErrPermissionDenied    = errors.New("client: permission denied")
	ErrResourceExhausted   = errors.New("client: resource exhausted")
	ErrInternal            = errors.New("client: internal error")
)

// Finer errors: each also matches the error of its code, as it did before
// it had one of its own.
var (
	ErrRateLimited     error = &refined{"client: rate limited", ErrResourceExhausted}
	ErrTooLarge        error = &refined{"client: change too large", ErrResourceExhausted}
	ErrStoreFull       error = &refined{"client: store full", ErrResourceExhausted}
	ErrStoreRolledBack error = &refined{"client: store rolled back", ErrUnavailable}
	// ErrArchiveUnavailable: the call needed the archive (PostgreSQL: an
	// intent that left etcd) and it did not answer; calls on live intents
	// still work. The same call may be sent again.
	ErrArchiveUnavailable error = &refined{"client: archive unavailable", ErrUnavailable}
)

// refined is a sentinel that also matches a coarser one.
type refined struct {
	msg    string
	coarse error
}

func (r *refined) Error() string { return r.msg }
func (r *refined) Unwrap() error { return r.coarse }

// byReason maps every ErrorInfo reason of the proto's ErrorReason to its
// sentinel (a test checks none is missing); byCode is the fallback for errors
// without a reason intentd declares (transport failures, other servers).
var byReason = map[intentv1.ErrorReason]error{
	intentv1.ErrorReason_ERROR_REASON_INVALID_FIELD:        ErrInvalidArgument,
	intentv1.ErrorReason_ERROR_REASON_INTENT_NOT_FOUND:     ErrNotFound,
	intentv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND:    ErrSessionNotFound,
	intentv1.ErrorReason_ERROR_REASON_FINGERPRINT_MISMATCH: ErrFingerprintMismatch,
	intentv1.ErrorReason_ERROR_REASON_INVALID_TRANSITION:   ErrInvalidTransition,
	intentv1.ErrorReason_ERROR_REASON_RESULT_MISMATCH:      ErrResultMismatch,
	intentv1.ErrorReason_ERROR_REASON_STALE_TOKEN:          ErrStaleToken,
	intentv1.ErrorReason_ERROR_REASON_INTENT_EXPIRED:       ErrExpired,
	intentv1.ErrorReason_ERROR_REASON_LEASE_HELD:           ErrLeaseHeld,
	intentv1.ErrorReason_ERROR_REASON_REVISION_COMPACTED:   ErrCompacted,
	intentv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE:    ErrUnavailable,
	intentv1.ErrorReason_ERROR_REASON_STORE_ROLLED_BACK:    ErrStoreRolledBack,
	intentv1.ErrorReason_ERROR_REASON_TOO_LARGE:            ErrTooLarge,
	intentv1.ErrorReason_ERROR_REASON_STORE_FULL:           ErrStoreFull,
	intentv1.ErrorReason_ERROR_REASON_RATE_LIMITED:         ErrRateLimited,
	intentv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED:      ErrUnauthenticated,
	intentv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED:    ErrPermissionDenied,
	intentv1.ErrorReason_ERROR_REASON_INTERNAL:             ErrInternal,
	intentv1.ErrorReason_ERROR_REASON_ARCHIVE_UNAVAILABLE:  ErrArchiveUnavailable,
}

var byCode = map[codes.Code]error{
	codes.InvalidArgument:   ErrInvalidArgument,
	codes.NotFound:          ErrNotFound,
	codes.Unavailable:       ErrUnavailable,
	codes.DeadlineExceeded:  ErrUnavailable,
	codes.Unauthenticated:   ErrUnauthenticated,
	codes.PermissionDenied:  ErrPermissionDenied,
	codes.ResourceExhausted: ErrResourceExhausted,
	codes.Internal:          ErrInternal,
}

// Error is a call intentd refused or could not answer.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Reason is the ErrorInfo reason, e.g. "STALE_TOKEN"; empty if none.
	Reason string
	// Metadata is the ErrorInfo metadata, e.g. {"current_token": "42"}.
	Metadata map[string]string
	// Field names the offending request field of an invalid argument.
	Field string
	// Statement is what became of the intent, when intentd says (refusals
	// of fenced calls).
	Statement *intentv1.Statement
	// Message is intentd's message.
	Message string

	sentinel error
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("intentd: %s (%s, %s)", e.Message, e.Code, e.Reason)
	}
	return fmt.Sprintf("intentd: %s (%s)", e.Message, e.Code)
}

// Is matches the sentinel for the error's reason (or code), and the
// coarser sentinel a finer one refines.
func (e *Error) Is(target error) bool { return e.sentinel != nil && errors.Is(e.sentinel, target) }

// CurrentToken is the intent's newest token, for a STALE_TOKEN refusal.
func (e *Error) CurrentToken() fencing.Token {
	v, _ := strconv.ParseUint(e.Metadata["current_token"], 10, 64)
	return fencing.Token(v)
}

// convert turns a gRPC error into an *Error; other errors (a context that
// ended) pass through.
func convert(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if st.Code() == codes.Canceled {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			e.Reason, e.Metadata = d.GetReason(), d.GetMetadata()
		case *errdetails.BadRequest:
			if v := d.GetFieldViolations(); len(v) > 0 {
				e.Field = v[0].GetField()
			}
		case *intentv1.Statement:
			e.Statement = d
		}
	}
	if r, ok := vocab.ParseReason(e.Reason); ok && byReason[r] != nil {
		e.sentinel = byReason[r]
	} else {
		e.sentinel = byCode[e.Code]
	}
	return e
}

// retriable reports whether the very same call may be sent again: intentd
// did not answer (UNAVAILABLE, or the attempt's deadline passed). Every
// intentd call recognizes its own earlier effect, so this is safe.
// FAILED_PRECONDITION, INVALID_ARGUMENT, PERMISSION_DENIED and the like are
// never retried: the same call would fail the same way.
func retriable(err error) bool {
	c := status.Code(err)
	return c == codes.Unavailable || c == codes.DeadlineExceeded
}

// rateLimited reports whether intentd refused the call as RATE_LIMITED:
// before doing anything.
func rateLimited(err error) bool {
	return status.Code(err) == codes.ResourceExhausted && errors.Is(convert(err), ErrRateLimited)
}
