package intent

import (
	"errors"
	"fmt"
	"time"

	"github.com/intentd/intentd/fencing"
)

// Errors a store reports. Callers test them with errors.Is; the gRPC server
// maps each to one status code and ErrorInfo reason in one table.
var (
	// ErrNotFound: no intent with this key in this tenant.
	ErrNotFound = errors.New("intent: not found")
	// ErrSessionNotFound: the session expired, was closed, or never existed.
	ErrSessionNotFound = errors.New("intent: session not found")
	// ErrFingerprintMismatch: the key exists with other approved terms.
	ErrFingerprintMismatch = errors.New("intent: fingerprint mismatch")
	// ErrStaleToken: a newer token was issued; see StaleTokenError.
	ErrStaleToken = errors.New("intent: stale token")
	// ErrInvalidTransition: the intent's state does not allow the call.
	ErrInvalidTransition = errors.New("intent: invalid transition")
	// ErrResultMismatch: Complete was retried under the same token with
	// another result.
	ErrResultMismatch = errors.New("intent: result mismatch")
	// ErrUnavailable: the store could not be reached or did not answer in
	// time. Retrying the same call is safe.
	ErrUnavailable = errors.New("intent: store unavailable")
	// ErrStoreRolledBack: etcd answered at a revision below one this
	// replica already saw (restored from a snapshot without a revision
	// bump): fencing tokens would repeat, so nothing is decided until an
	// operator restores with a bump. The store's refusal, which carries
	// the revisions (etcdstore.RolledBackError), also matches
	// ErrUnavailable.
	ErrStoreRolledBack = errors.New("intent: store rolled back")
	// ErrInvalid: the request is malformed; see InvalidError for the field.
	ErrInvalid = errors.New("intent: invalid argument")
	// ErrTooLarge: the change would exceed what one etcd transaction may
	// carry; nothing was written.
	ErrTooLarge = errors.New("intent: change too large")
	// ErrStoreFull: etcd's backend quota is exhausted; it serves reads
	// and deletes only until an operator compacts, defragments and
	// disarms the alarm. Nothing was written.
	ErrStoreFull = errors.New("intent: store full")
	// ErrLeaseHeld: a worker holds a live lease; a reviewer must pass force
	// to supersede it.
	ErrLeaseHeld = errors.New("intent: held under a live lease")
	// ErrExpired: the record outlived its retention; a tombstone remains.
	// The work needs a new approval (a new key).
	ErrExpired = errors.New("intent: expired")
	// ErrCompacted: a listing or watch asked for a revision etcd compacted
	// away; see CompactedError. Re-list from the first page.
	ErrCompacted = errors.New("intent: revision compacted")
	// ErrArchiveUnavailable: the call had to ask the archive (the cold
	// tier of final intents) and could not: the key is not in etcd, and
	// only the archive can tell whether it was finished before. Nothing
	// was written. The store's error also matches ErrUnavailable: retrying
	// the same call is safe, and calls on live intents keep working.
	ErrArchiveUnavailable = errors.New("intent: archive unavailable")
)

// ExpiredError describes the tombstone of a removed intent.
type ExpiredError struct {
	Key   string
	State State // the final state the intent had
	// Fingerprint is the intent's, for a tombstone an earlier version
	// wrote; empty for a packed one, which does not keep it.
	Fingerprint string
	// CompletedAt is when the intent became final (to the second for a
	// packed tombstone).
	CompletedAt time.Time
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("intent: %q expired after its retention (it was %s); it needs a new approval", e.Key, e.State)
}

// Is makes errors.Is(err, ErrExpired) true.
func (e *ExpiredError) Is(target error) bool { return target == ErrExpired }

// CompactedError says which revision etcd still has.
type CompactedError struct {
	Requested int64
	Compacted int64 // the compaction revision: the oldest revision left is Compacted+1
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("intent: revision %d was compacted (compaction revision %d); list again and watch from the list's revision", e.Requested, e.Compacted)
}

// Is makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Is(target error) bool { return target == ErrCompacted }

// StaleTokenError is returned for a call made under a superseded token. It
// carries the current token so the caller knows how far behind it is.
type StaleTokenError struct {
	Key     string
	Token   fencing.Token // the token the caller presented
	Current fencing.Token // the newest token issued for the intent
	// Intent is the intent as it stands (without history), for telling
	// the caller what became of it.
	Intent *Intent
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("intent: stale token %s for %q: current token is %s", e.Token, e.Key, e.Current)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// FingerprintMismatchError is returned when a key is reused with other
// approved terms.
type FingerprintMismatchError struct {
	Key    string
	Stored string // fingerprint of the registered params
	Given  string // fingerprint of the params in the request
}

func (e *FingerprintMismatchError) Error() string {
	return fmt.Sprintf("intent: fingerprint mismatch for %q: registered %s, request %s", e.Key, e.Stored, e.Given)
}

// Is makes errors.Is(err, ErrFingerprintMismatch) true.
func (e *FingerprintMismatchError) Is(target error) bool { return target == ErrFingerprintMismatch }

// TransitionError is returned when the intent's state does not allow a call.
type TransitionError struct {
	Key   string
	State State
	Call  string
	// Intent is the intent as it stands (without history), when known.
	Intent *Intent
	// Evidence is true when the refused report was kept in the history.
	Evidence bool
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("intent: %s not allowed on %q in state %s", e.Call, e.Key, e.State)
}

// Is makes errors.Is(err, ErrInvalidTransition) true.
func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

// NotFoundError is returned when no intent has the key in the caller's
// tenant; it names the key, so that a message read alone says which.
type NotFoundError struct {
	Key string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("intent: no intent with key %q", e.Key)
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// InvalidError names a malformed request field.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("intent: invalid %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Invalid returns an InvalidError for field.
func Invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
