// Package intent holds intentd's domain model: the words of DESIGN.md as Go
// types (intents, states, leases, outcomes, history), the errors a store
// reports, and the canonical forms (canonical JSON, fingerprints, derived
// keys) that must agree in every language.
//
// It depends on the standard library and fencing only, so that the gRPC
// server, the etcd store and the client can all speak it without importing
// one another.
package intent

import (
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/intentd/intentd/fencing"
)

// DefaultTenant is the tenant used when a request names none.
const DefaultTenant = "default"

// State is where an intent is in its life. The values match the API's State
// enum numbers.
type State int

// The states of DESIGN.md.
const (
	StatePending     State = 1
	StateInProgress  State = 2
	StateUnknown     State = 3
	StateCompleted   State = 4
	StateFailed      State = 5
	StateNeedsReview State = 6
	StateCancelled   State = 7
)

var stateNames = map[State]string{
	StatePending:     "PENDING",
	StateInProgress:  "IN_PROGRESS",
	StateUnknown:     "UNKNOWN",
	StateCompleted:   "COMPLETED",
	StateFailed:      "FAILED",
	StateNeedsReview: "NEEDS_REVIEW",
	StateCancelled:   "CANCELLED",
}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return "STATE_INVALID"
}

// Final reports whether nothing can change the state any more. A final
// intent's result is replayed to every later caller.
func (s State) Final() bool {
	return s == StateCompleted || s == StateFailed || s == StateCancelled
}

// Outcome tells an Acquire caller what to do. Values match the API's Outcome
// enum numbers.
type Outcome int

// The outcomes of Acquire.
const (
	OutcomeExecute     Outcome = 1
	OutcomeReconcile   Outcome = 2
	OutcomeCompleted   Outcome = 3
	OutcomeFailed      Outcome = 4
	OutcomeCancelled   Outcome = 5
	OutcomeInProgress  Outcome = 6
	OutcomeNeedsReview Outcome = 7
	OutcomeExpired     Outcome = 8
)

var outcomeNames = map[Outcome]string{
	OutcomeExecute:     "EXECUTE",
	OutcomeReconcile:   "RECONCILE",
	OutcomeCompleted:   "COMPLETED",
	OutcomeFailed:      "FAILED",
	OutcomeCancelled:   "CANCELLED",
	OutcomeInProgress:  "IN_PROGRESS",
	OutcomeNeedsReview: "NEEDS_REVIEW",
	OutcomeExpired:     "EXPIRED",
}

func (o Outcome) String() string {
	if n, ok := outcomeNames[o]; ok {
		return n
	}
	return "OUTCOME_INVALID"
}

// Mode is what a lease allows its holder to do. Values match the API's
// LeaseMode enum numbers.
type Mode int

// The lease modes.
const (
	ModeExecute   Mode = 1
	ModeReconcile Mode = 2
	// ModeReview marks a reviewer's decision that superseded every worker
	// lease: the token is current, but no worker holds it.
	ModeReview Mode = 3
)

func (m Mode) String() string {
	switch m {
	case ModeExecute:
		return "EXECUTE"
	case ModeReconcile:
		return "RECONCILE"
	case ModeReview:
		return "REVIEW"
	}
	return "MODE_INVALID"
}

// Intent is one approved business action as the store returns it.
type Intent struct {
	Tenant        string
	Key           string
	State         State // effective: a lapsed IN_PROGRESS lease reads as StateUnknown
	Params        json.RawMessage
	ParamsVersion string
	Fingerprint   string
	Labels        map[string]string
	ParentKey     string
	Lease         *Lease // current lease, or the last one issued
	Result        *Result
	Failure       *Failure
	History       []Event
	CreatedAt     time.Time
	UpdatedAt     time.Time
	CompletedAt   time.Time
	Revision      int64 // etcd mod revision of the record as read
	// Retention is how long the record is kept once final; RetainUntil is
	// when it may go (zero while not final).
	Retention   time.Duration
	RetainUntil time.Time
	// Attempts counts the attempts that ended without a report (a lease
	// lapsed, or MarkUnknown); at MaxAttempts the intent goes to
	// NEEDS_REVIEW. MaxAttempts is 0 for an intent registered before
	// intentd had a limit: the server's default applies to it.
	Attempts    int
	MaxAttempts int
	// Action, Identity and Summary tell a person what the intent is, as
	// its registration gave them (see Registration); empty if it gave none.
	Action   string
	Identity json.RawMessage
	Summary  string
	// Children are the intents registered with this one as parent; filled
	// by Get only.
	Children []Child
}

// Child summarizes a child intent.
type Child struct {
	Key   string
	State State
}

// Lease is ownership of an intent by one worker session.
type Lease struct {
	Token      fencing.Token
	Mode       Mode
	SessionID  string
	Worker     string
	RequestID  string
	AcquiredAt time.Time
	// ExpiresAt estimates when the holder's session lapses; zero when
	// unknown. etcd decides expiry, this is for display only.
	ExpiresAt time.Time
	// Live is true while the holder's session exists in etcd.
	Live bool
}

// Result is what a completed intent produced. Payload is opaque and replayed
// byte for byte.
type Result struct {
	Payload      []byte
	ExternalRefs map[string]string
}

// Failure describes a definite failure.
type Failure struct {
	Code    string
	Message string
}

// EventKind is what a history entry records. Values match the API's
// HistoryEntry.Kind enum numbers.
type EventKind int

// The kinds of history entries.
const (
	EventRegistered    EventKind = 1
	EventAcquired      EventKind = 2
	EventCompleted     EventKind = 3
	EventMarkedUnknown EventKind = 4
	EventReleased      EventKind = 5
	EventFailed        EventKind = 6
	EventHeartbeat     EventKind = 7
	EventLeaseLapsed   EventKind = 8
	EventEscalated     EventKind = 9
	EventResolved      EventKind = 10
	EventCancelled     EventKind = 11
	// EventChildRegistered is written to a parent when Complete registered
	// a child; Reason holds the child's key.
	EventChildRegistered EventKind = 12
)

// Event is one entry in an intent's history.
type Event struct {
	Time      time.Time
	Kind      EventKind
	Token     fencing.Token
	Mode      Mode
	SessionID string
	Worker    string
	// Accepted is false for a report under a superseded token: evidence
	// that changed nothing.
	Accepted bool
	// Result is the reported result's external refs; its payload is kept
	// only as PayloadSHA256, so that evidence cannot grow a record past
	// what etcd accepts. The intent's own Result holds the payload.
	Result        *Result
	PayloadSHA256 string
	Failure       *Failure
	Reason        string
	// Principal is who acted, where known.
	Principal string
	// ResolvedState is the decided state of an EventResolved.
	ResolvedState State
	// Channel is where an EventResolved's decision was made ("console";
	// empty: the API).
	Channel string
	// RequestID is the caller's id of the call that made the event, where
	// the call has one (Resolve): how a retry recognizes its own effect.
	RequestID string
	// Issued is true when the event issued a new token (an acquisition, a
	// reviewer's decision): every earlier token is superseded by it.
	Issued bool
}

// Session is a worker's unit of liveness: an etcd lease kept alive by the
// worker's heartbeats. Every intent the worker holds points at it.
type Session struct {
	Tenant string
	ID     string
	Worker string
	TTL    time.Duration
}

// Registration is what an approver submits.
type Registration struct {
	Tenant        string
	Key           string
	Params        json.RawMessage // canonical JSON
	ParamsVersion string
	Labels        map[string]string
	ParentKey     string
	// Retention is how long the record is kept once final; zero means the
	// store's default.
	Retention time.Duration
	// MaxAttempts is how many attempts may end without a report (a lease
	// lapsed, or MarkUnknown) before the intent goes to NEEDS_REVIEW; zero
	// means the store's default, at most MaxAttemptsLimit.
	MaxAttempts int
	// Action is the kind of business operation ("refund.issue"), and
	// Identity the canonical JSON of the fields the key was derived from
	// (Derive; nil when none were given): what a derived key, 64 hex
	// digits, stands for. Summary is the approver's sentence for reviewers.
	// None is part of the fingerprint: registering an existing intent again
	// keeps its first, as it keeps its first MaxAttempts.
	Action   string
	Identity json.RawMessage
	Summary  string
	// RequestID, when set, lets a retried registration recognize its own
	// write after an ambiguous commit.
	RequestID string
}

// MaxAttemptsLimit is the most attempts a registration, or the server's
// default, may allow before an intent goes to NEEDS_REVIEW. The API's
// RegisterRequest.max_attempts rule says the same.
const MaxAttemptsLimit = 1000

// AcquireRequest asks for the right to act on an intent.
type AcquireRequest struct {
	Tenant    string
	Key       string
	SessionID string
	RequestID string
	// ExpectedFingerprint, when not empty, must match the stored one.
	ExpectedFingerprint string
	// Register, when not nil, registers the intent in the same transaction
	// if it is absent; its fingerprint must match if present.
	Register *Registration
}

// Acquisition is Acquire's answer.
type Acquisition struct {
	Outcome Outcome
	Intent  *Intent
	// Lease is the caller's lease for EXECUTE and RECONCILE, the holder's
	// for IN_PROGRESS, nil otherwise.
	Lease *Lease
	// Fresh is true when this call issued the lease; false when it returned
	// an already issued one (a retry with the same request id) or nothing.
	Fresh bool
	// Memo is set only on an answer replayed from the one remembered
	// version of a final record (see Memo), nil on every other answer.
	Memo *Memo
}

// Memo keeps what a caller derives from one version of a final record,
// so that the next replay of that version need not derive it again: the
// gRPC server keeps its answer's encoding here. What is kept may say the
// heap it holds (a HeapBytes() int64 method), which a store counts
// against its cache. A store hands out one Memo
// per version it remembers, and a new one with every newer version, so
// what is kept can never outlive the version it was derived from. A final
// record's version never changes, and a replay's answer (outcome,
// intent, statement) depends on nothing else, not the request: whatever is
// kept must be derived from the Acquisition alone and never modified once
// stored, as concurrent replays share it.
type Memo struct{ v atomic.Value }

// Load returns what was stored, or nil.
func (m *Memo) Load() any { return m.v.Load() }

// Store keeps v, which every later Store must match in type.
func (m *Memo) Store(v any) { m.v.Store(v) }

// ReportKind is which fenced report a worker makes.
type ReportKind int

// The fenced reports.
const (
	ReportComplete ReportKind = iota + 1
	ReportMarkUnknown
	ReportRelease
	ReportFail
)

func (k ReportKind) String() string {
	switch k {
	case ReportComplete:
		return "Complete"
	case ReportMarkUnknown:
		return "MarkUnknown"
	case ReportRelease:
		return "Release"
	case ReportFail:
		return "Fail"
	}
	return "ReportInvalid"
}

// Report is a fenced report from a lease holder.
type Report struct {
	Tenant  string
	Key     string
	Token   fencing.Token
	Kind    ReportKind
	Result  *Result  // ReportComplete
	Failure *Failure // ReportFail
	Reason  string   // ReportMarkUnknown, ReportRelease
	// Children are registered in the same transaction as a Complete (the
	// outbox): registrations in Tenant with Key as their ParentKey, each
	// key once and none Key (the server makes them so).
	Children []Registration
}

// Escalation hands an intent to a human.
type Escalation struct {
	Tenant string
	Key    string
	// Token is the worker's lease token; zero when a reviewer escalates.
	Token  fencing.Token
	Reason string
	Actor  string
	// Force lets a reviewer escalate under a live lease, superseding it.
	Force bool
}

// Resolution is a reviewer's decision on a NEEDS_REVIEW or UNKNOWN intent.
type Resolution struct {
	Tenant string
	Key    string
	// Decision is StateCompleted (Result required), StatePending,
	// StateFailed (Failure required) or StateCancelled.
	Decision State
	Result   *Result
	Failure  *Failure
	Actor    string
	Reason   string
	// Force decides an intent under a live lease, superseding it.
	Force bool
	// RequestID makes the decision safe to retry.
	RequestID string
	// Channel is where the decision was made ("console"; empty: the API),
	// kept in the history entry and nowhere else.
	Channel string
	// ExpectedToken, when not zero, is the token the reviewer saw: the
	// decision applies only while it is still the intent's current token.
	ExpectedToken fencing.Token
}

// Cancellation withdraws a PENDING intent.
type Cancellation struct {
	Tenant string
	Key    string
	Actor  string
	Reason string
}

// Label is one name=value pair.
type Label struct{ Name, Value string }

// Filter selects intents of one tenant; its parts combine with AND, States
// with OR.
type Filter struct {
	Tenant    string
	States    []State
	Label     *Label
	ParentKey string
}

// ListQuery asks for one page of a listing.
type ListQuery struct {
	Filter
	PageSize  int
	PageToken string
}

// Page is one page of a listing.
type Page struct {
	Intents       []*Intent
	NextPageToken string
	// Revision is the etcd revision every page of the listing reads.
	Revision int64
}

// WatchQuery selects changes to follow: one intent (Key) or a Filter.
type WatchQuery struct {
	Filter
	Key           string
	StartRevision int64
	// NotifyCreated asks for a first event with Created set once the watch
	// is established.
	NotifyCreated bool
}

// WatchEvent is one change, or the notice that the watch is established.
type WatchEvent struct {
	// Created marks the first event of a watch that asked for it
	// (NotifyCreated): no Intent; every change with a revision above
	// Revision is reported from then on.
	Created bool
	// Deleted is true when the record was removed after its retention;
	// Intent then holds only the tombstone's fields.
	Deleted  bool
	Intent   *Intent
	Revision int64
}

// ReportOutcome is the answer to an accepted report.
type ReportOutcome struct {
	Intent *Intent
	// Replayed is true when the report had already been recorded (a retry):
	// nothing changed.
	Replayed bool
}

// HeldLease names a lease a worker believes it holds, for Heartbeat to check.
type HeldLease struct {
	Key   string
	Token fencing.Token
}
