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
)

// Errors intentd returns, for errors.Is. Every error a Client method
// returns for a refused call is an *Error that matches exactly one of them
// (by its ErrorInfo reason, else by its gRPC code).
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

// byReason maps ErrorInfo reasons to sentinels; byCode is the fallback for
// errors without one (transport failures, auth, limits).
var byReason = map[string]error{
	"INVALID_FIELD":        ErrInvalidArgument,
	"INTENT_NOT_FOUND":     ErrNotFound,
	"SESSION_NOT_FOUND":    ErrSessionNotFound,
	"FINGERPRINT_MISMATCH": ErrFingerprintMismatch,
	"INVALID_TRANSITION":   ErrInvalidTransition,
	"RESULT_MISMATCH":      ErrResultMismatch,
	"STALE_TOKEN":          ErrStaleToken,
	"INTENT_EXPIRED":       ErrExpired,
	"LEASE_HELD":           ErrLeaseHeld,
	"REVISION_COMPACTED":   ErrCompacted,
	"STORE_UNAVAILABLE":    ErrUnavailable,
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

// Is matches the sentinel for the error's reason (or code).
func (e *Error) Is(target error) bool { return e.sentinel != nil && target == e.sentinel }

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
	if s, ok := byReason[e.Reason]; ok {
		e.sentinel = s
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
