package intent

import (
	"time"

	"github.com/intentd/intentd/fencing"
)

// The fencing gateway's vocabulary (docs/GATEWAY.md; the rules are
// DESIGN.md's "The fencing gateway"). A worker sends a side-effecting HTTP
// call through the gateway; the gateway asks intentd to begin a submission
// of the call's operation under the worker's token (BeginSubmission), calls
// the upstream only when told to, and records what came back
// (RecordSubmission) before it answers the worker. The intent's record
// keeps one Submission per operation: its latest.

// The history entries of submissions. Values match the API's
// HistoryEntry.Kind enum numbers, like the kinds in intent.go.
const (
	// EventSubmissionStarted: a submission of an operation began
	// (accepted), or was refused under a superseded token (evidence).
	// RequestID is the submission's id, Reason says what was sent.
	EventSubmissionStarted EventKind = 13
	// EventSubmissionRecorded: the upstream's answer to a submission was
	// kept (or a lookup's, or the submission reached nobody). RequestID is
	// the submission's id, Reason what came back.
	EventSubmissionRecorded EventKind = 14
	// EventSubmissionUnknown: a submission's answer was lost after the
	// request may have reached the upstream. RequestID is the submission's
	// id, Reason what was sent, when, and what came back instead.
	EventSubmissionUnknown EventKind = 15
)

// SubmissionState is where one submission of an operation stands.
type SubmissionState int

// The states of a submission.
const (
	// SubmissionInFlight: begun; the gateway may be calling the upstream
	// until the submission's deadline.
	SubmissionInFlight SubmissionState = 1
	// SubmissionRecorded: the upstream's answer is kept; every later
	// submission of the operation under a current token replays it.
	SubmissionRecorded SubmissionState = 2
	// SubmissionRefused: the upstream answered with a status its
	// configuration calls a definite refusal (nothing was done): the
	// answer is kept, and the operation may be submitted again.
	SubmissionRefused SubmissionState = 3
	// SubmissionUnknown: the answer was lost after the request may have
	// reached the upstream. Nothing resends it: a lookup or a person
	// decides.
	SubmissionUnknown SubmissionState = 4
	// SubmissionAbsent: the request reached nobody (the connection failed
	// before it was written), or the upstream's lookup found no trace of
	// it: the operation may be submitted again.
	SubmissionAbsent SubmissionState = 5
)

func (s SubmissionState) String() string {
	switch s {
	case SubmissionInFlight:
		return "IN_FLIGHT"
	case SubmissionRecorded:
		return "RECORDED"
	case SubmissionRefused:
		return "REFUSED"
	case SubmissionUnknown:
		return "UNKNOWN"
	case SubmissionAbsent:
		return "ABSENT"
	}
	return "UNSPECIFIED"
}

// Submission is the latest submission of one operation of an intent, as
// its record keeps it.
type Submission struct {
	Operation string
	// ID is the gateway's id of the submission; a retried
	// BeginSubmission with the same id recognizes its own.
	ID string
	// Token is the lease it was begun under.
	Token fencing.Token
	State SubmissionState
	// Request is what was sent.
	Request SubmittedRequest
	// HasLookup says the upstream offered a lookup when the submission
	// began: a lost answer then leaves the intent UNKNOWN for a lookup to
	// settle, else it goes to review.
	HasLookup bool
	StartedAt time.Time
	// Deadline is when the gateway that began it will have given up: an
	// in-flight submission past it is unknown.
	Deadline time.Time
	// EndedAt is when its answer (or its loss) was recorded.
	EndedAt time.Time
	// Response is the upstream's answer (Recorded, Refused; a lookup's
	// for a looked-up one), nil otherwise.
	Response *UpstreamResponse
	// LookedUp says Response came from the upstream's lookup.
	LookedUp bool
	// Error is what came back instead of an answer (Unknown, Absent).
	Error string
}

// Settled reports whether s has an answer that later submissions of the
// operation replay.
func (s *Submission) Settled() bool { return s.State == SubmissionRecorded }

// Resendable reports whether the operation may be submitted again after s:
// nothing was done upstream, by the upstream's own word or because the
// request reached nobody.
func (s *Submission) Resendable() bool {
	return s.State == SubmissionRefused || s.State == SubmissionAbsent
}

// SubmittedRequest is what a submission sends upstream, as the record
// keeps it for reviewers: where, and the body's digest, size and first
// bytes.
type SubmittedRequest struct {
	// Upstream is the gateway's name of the upstream; Method and Target
	// (path and query) the HTTP request line.
	Upstream string
	Method   string
	Target   string
	// BodySHA256 is the hex SHA-256 of the whole body, BodyBytes its size,
	// and Body its first bytes (at most MaxKeptRequestBody).
	BodySHA256 string
	BodyBytes  int64
	Body       []byte
}

// UpstreamResponse is an upstream's answer as kept: its status, the
// headers the gateway keeps, and its body's first MaxKeptResponseBody
// bytes (BodyBytes is the whole body's size, larger when it was cut).
type UpstreamResponse struct {
	Status    int
	Header    []HeaderField
	Body      []byte
	BodyBytes int64
}

// HeaderField is one header line of an upstream's answer.
type HeaderField struct {
	Name  string
	Value string
}

// The bounds of what a record keeps of a submission. The API's rules on
// SubmittedRequest.body_kept, UpstreamResponse.body and .headers say the
// same (TestDomainLimitsMatchRules).
const (
	MaxKeptRequestBody  = 4 << 10
	MaxKeptResponseBody = 64 << 10
	MaxKeptHeaders      = 64
	// MaxSubmissions is how many operations one intent may submit through
	// the gateway: the record carries each one's latest submission.
	MaxSubmissions = 8
)

// SubmissionStart is a BeginSubmission: the gateway, for a worker holding
// Token, asks to send a request of Operation upstream (or, with Lookup, to
// ask the upstream about the operation's submission in doubt).
type SubmissionStart struct {
	Tenant    string
	Key       string
	Operation string
	Token     fencing.Token
	ID        string
	Lookup    bool
	HasLookup bool
	Request   SubmittedRequest
	// Timeout is how long the gateway may take, from now until its
	// RecordSubmission: the submission's deadline is intentd's now plus it.
	Timeout time.Duration
}

// SubmissionVerdict is what BeginSubmission tells the gateway to do.
type SubmissionVerdict int

// The verdicts.
const (
	// VerdictForward: send the request upstream now, then record the
	// answer.
	VerdictForward SubmissionVerdict = 1
	// VerdictReplay: the operation's answer is recorded; answer it, and
	// send nothing.
	VerdictReplay SubmissionVerdict = 2
	// VerdictBusy: a submission of the operation is in flight; send
	// nothing, and tell the worker to wait.
	VerdictBusy SubmissionVerdict = 3
	// VerdictUnknown: the outcome of the operation's submission is
	// unknown; send nothing (a lookup or a person decides).
	VerdictUnknown SubmissionVerdict = 4
	// VerdictLookup: ask the upstream's lookup about the submission in
	// doubt, then record what it says.
	VerdictLookup SubmissionVerdict = 5
)

func (v SubmissionVerdict) String() string {
	switch v {
	case VerdictForward:
		return "FORWARD"
	case VerdictReplay:
		return "REPLAY"
	case VerdictBusy:
		return "BUSY"
	case VerdictUnknown:
		return "UNKNOWN"
	case VerdictLookup:
		return "LOOKUP"
	}
	return "UNSPECIFIED"
}

// SubmissionBegun is BeginSubmission's answer: the verdict, the
// operation's submission it is about (the new one for Forward, the one
// with the answer for Replay, the one in flight or in doubt otherwise),
// and the intent as it stands after.
type SubmissionBegun struct {
	Verdict    SubmissionVerdict
	Submission *Submission
	Intent     *Intent
	// Replayed says the answer repeats an earlier BeginSubmission of the
	// same id (read back after an ambiguous commit, or retried).
	Replayed bool
}

// SubmissionOutcome is what the gateway learned of a submission.
type SubmissionOutcome int

// The outcomes RecordSubmission records.
const (
	// OutcomeAnswered: the upstream answered (Response).
	OutcomeAnswered SubmissionOutcome = 1
	// OutcomeRefusedUpstream: the upstream answered with a definite
	// refusal (Response): nothing was done, the operation may be sent
	// again.
	OutcomeRefusedUpstream SubmissionOutcome = 2
	// OutcomeLost: no answer, and the request may have reached the
	// upstream (Error says what happened).
	OutcomeLost SubmissionOutcome = 3
	// OutcomeNotSent: the request never left the gateway (the connection
	// failed before it was written; Error says how).
	OutcomeNotSent SubmissionOutcome = 4
	// OutcomeFound: the upstream's lookup found the submission's effect
	// (Response is the lookup's answer).
	OutcomeFound SubmissionOutcome = 5
	// OutcomeNotFound: the upstream's lookup found no trace of it.
	OutcomeNotFound SubmissionOutcome = 6
)

func (o SubmissionOutcome) String() string {
	switch o {
	case OutcomeAnswered:
		return "ANSWERED"
	case OutcomeRefusedUpstream:
		return "REFUSED"
	case OutcomeLost:
		return "LOST"
	case OutcomeNotSent:
		return "NOT_SENT"
	case OutcomeFound:
		return "FOUND"
	case OutcomeNotFound:
		return "NOT_FOUND"
	}
	return "UNSPECIFIED"
}

// SubmissionEnd is a RecordSubmission: what became of submission ID of
// Operation, begun under Token.
type SubmissionEnd struct {
	Tenant    string
	Key       string
	Operation string
	Token     fencing.Token
	ID        string
	Outcome   SubmissionOutcome
	Response  *UpstreamResponse
	Error     string
}

// SubmissionRecord is RecordSubmission's answer: the operation's
// submission and the intent as they stand after.
type SubmissionRecord struct {
	Submission *Submission
	Intent     *Intent
	// Replayed says the outcome had been recorded already (a retry).
	Replayed bool
}
