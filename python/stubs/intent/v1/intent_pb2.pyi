import datetime

from buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from intent.v1 import rules_pb2 as _rules_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNSPECIFIED: _ClassVar[State]
    STATE_PENDING: _ClassVar[State]
    STATE_IN_PROGRESS: _ClassVar[State]
    STATE_UNKNOWN: _ClassVar[State]
    STATE_COMPLETED: _ClassVar[State]
    STATE_FAILED: _ClassVar[State]
    STATE_NEEDS_REVIEW: _ClassVar[State]
    STATE_CANCELLED: _ClassVar[State]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_EXECUTE: _ClassVar[Outcome]
    OUTCOME_RECONCILE: _ClassVar[Outcome]
    OUTCOME_COMPLETED: _ClassVar[Outcome]
    OUTCOME_FAILED: _ClassVar[Outcome]
    OUTCOME_CANCELLED: _ClassVar[Outcome]
    OUTCOME_IN_PROGRESS: _ClassVar[Outcome]
    OUTCOME_NEEDS_REVIEW: _ClassVar[Outcome]
    OUTCOME_EXPIRED: _ClassVar[Outcome]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_FIELD: _ClassVar[ErrorReason]
    ERROR_REASON_INTENT_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_FINGERPRINT_MISMATCH: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_TRANSITION: _ClassVar[ErrorReason]
    ERROR_REASON_RESULT_MISMATCH: _ClassVar[ErrorReason]
    ERROR_REASON_STALE_TOKEN: _ClassVar[ErrorReason]
    ERROR_REASON_STORE_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_INTENT_EXPIRED: _ClassVar[ErrorReason]
    ERROR_REASON_LEASE_HELD: _ClassVar[ErrorReason]
    ERROR_REASON_REVISION_COMPACTED: _ClassVar[ErrorReason]
    ERROR_REASON_TOO_LARGE: _ClassVar[ErrorReason]
    ERROR_REASON_STORE_FULL: _ClassVar[ErrorReason]
    ERROR_REASON_STORE_ROLLED_BACK: _ClassVar[ErrorReason]
    ERROR_REASON_INTERNAL: _ClassVar[ErrorReason]
    ERROR_REASON_UNAUTHENTICATED: _ClassVar[ErrorReason]
    ERROR_REASON_PERMISSION_DENIED: _ClassVar[ErrorReason]
    ERROR_REASON_RATE_LIMITED: _ClassVar[ErrorReason]
    ERROR_REASON_ARCHIVE_UNAVAILABLE: _ClassVar[ErrorReason]

class ActionTaken(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_TAKEN_UNSPECIFIED: _ClassVar[ActionTaken]
    ACTION_TAKEN_NONE: _ClassVar[ActionTaken]
    ACTION_TAKEN_LEASE_ISSUED: _ClassVar[ActionTaken]
    ACTION_TAKEN_RECORDED: _ClassVar[ActionTaken]
    ACTION_TAKEN_EVIDENCE_RECORDED: _ClassVar[ActionTaken]

class StatementStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATEMENT_STATUS_UNSPECIFIED: _ClassVar[StatementStatus]
    STATEMENT_STATUS_EXECUTE: _ClassVar[StatementStatus]
    STATEMENT_STATUS_RECONCILE: _ClassVar[StatementStatus]
    STATEMENT_STATUS_ALREADY_COMPLETED: _ClassVar[StatementStatus]
    STATEMENT_STATUS_ALREADY_FAILED: _ClassVar[StatementStatus]
    STATEMENT_STATUS_CANCELLED: _ClassVar[StatementStatus]
    STATEMENT_STATUS_IN_PROGRESS: _ClassVar[StatementStatus]
    STATEMENT_STATUS_NEEDS_REVIEW: _ClassVar[StatementStatus]
    STATEMENT_STATUS_EXPIRED: _ClassVar[StatementStatus]
    STATEMENT_STATUS_STALE_TOKEN: _ClassVar[StatementStatus]
    STATEMENT_STATUS_REFUSED: _ClassVar[StatementStatus]

class LeaseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_MODE_UNSPECIFIED: _ClassVar[LeaseMode]
    LEASE_MODE_EXECUTE: _ClassVar[LeaseMode]
    LEASE_MODE_RECONCILE: _ClassVar[LeaseMode]
    LEASE_MODE_REVIEW: _ClassVar[LeaseMode]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_COMPLETED: _ClassVar[Decision]
    DECISION_PENDING: _ClassVar[Decision]
    DECISION_FAILED: _ClassVar[Decision]
    DECISION_CANCELLED: _ClassVar[Decision]

class SubmissionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBMISSION_STATE_UNSPECIFIED: _ClassVar[SubmissionState]
    SUBMISSION_STATE_IN_FLIGHT: _ClassVar[SubmissionState]
    SUBMISSION_STATE_RECORDED: _ClassVar[SubmissionState]
    SUBMISSION_STATE_REFUSED: _ClassVar[SubmissionState]
    SUBMISSION_STATE_UNKNOWN: _ClassVar[SubmissionState]
    SUBMISSION_STATE_ABSENT: _ClassVar[SubmissionState]

class SubmissionVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBMISSION_VERDICT_UNSPECIFIED: _ClassVar[SubmissionVerdict]
    SUBMISSION_VERDICT_FORWARD: _ClassVar[SubmissionVerdict]
    SUBMISSION_VERDICT_REPLAY: _ClassVar[SubmissionVerdict]
    SUBMISSION_VERDICT_BUSY: _ClassVar[SubmissionVerdict]
    SUBMISSION_VERDICT_UNKNOWN: _ClassVar[SubmissionVerdict]
    SUBMISSION_VERDICT_LOOKUP: _ClassVar[SubmissionVerdict]

class SubmissionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBMISSION_OUTCOME_UNSPECIFIED: _ClassVar[SubmissionOutcome]
    SUBMISSION_OUTCOME_ANSWERED: _ClassVar[SubmissionOutcome]
    SUBMISSION_OUTCOME_REFUSED: _ClassVar[SubmissionOutcome]
    SUBMISSION_OUTCOME_LOST: _ClassVar[SubmissionOutcome]
    SUBMISSION_OUTCOME_NOT_SENT: _ClassVar[SubmissionOutcome]
    SUBMISSION_OUTCOME_FOUND: _ClassVar[SubmissionOutcome]
    SUBMISSION_OUTCOME_NOT_FOUND: _ClassVar[SubmissionOutcome]
STATE_UNSPECIFIED: State
STATE_PENDING: State
STATE_IN_PROGRESS: State
STATE_UNKNOWN: State
STATE_COMPLETED: State
STATE_FAILED: State
STATE_NEEDS_REVIEW: State
STATE_CANCELLED: State
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_EXECUTE: Outcome
OUTCOME_RECONCILE: Outcome
OUTCOME_COMPLETED: Outcome
OUTCOME_FAILED: Outcome
OUTCOME_CANCELLED: Outcome
OUTCOME_IN_PROGRESS: Outcome
OUTCOME_NEEDS_REVIEW: Outcome
OUTCOME_EXPIRED: Outcome
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_INVALID_FIELD: ErrorReason
ERROR_REASON_INTENT_NOT_FOUND: ErrorReason
ERROR_REASON_SESSION_NOT_FOUND: ErrorReason
ERROR_REASON_FINGERPRINT_MISMATCH: ErrorReason
ERROR_REASON_INVALID_TRANSITION: ErrorReason
ERROR_REASON_RESULT_MISMATCH: ErrorReason
ERROR_REASON_STALE_TOKEN: ErrorReason
ERROR_REASON_STORE_UNAVAILABLE: ErrorReason
ERROR_REASON_INTENT_EXPIRED: ErrorReason
ERROR_REASON_LEASE_HELD: ErrorReason
ERROR_REASON_REVISION_COMPACTED: ErrorReason
ERROR_REASON_TOO_LARGE: ErrorReason
ERROR_REASON_STORE_FULL: ErrorReason
ERROR_REASON_STORE_ROLLED_BACK: ErrorReason
ERROR_REASON_INTERNAL: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_PERMISSION_DENIED: ErrorReason
ERROR_REASON_RATE_LIMITED: ErrorReason
ERROR_REASON_ARCHIVE_UNAVAILABLE: ErrorReason
ACTION_TAKEN_UNSPECIFIED: ActionTaken
ACTION_TAKEN_NONE: ActionTaken
ACTION_TAKEN_LEASE_ISSUED: ActionTaken
ACTION_TAKEN_RECORDED: ActionTaken
ACTION_TAKEN_EVIDENCE_RECORDED: ActionTaken
STATEMENT_STATUS_UNSPECIFIED: StatementStatus
STATEMENT_STATUS_EXECUTE: StatementStatus
STATEMENT_STATUS_RECONCILE: StatementStatus
STATEMENT_STATUS_ALREADY_COMPLETED: StatementStatus
STATEMENT_STATUS_ALREADY_FAILED: StatementStatus
STATEMENT_STATUS_CANCELLED: StatementStatus
STATEMENT_STATUS_IN_PROGRESS: StatementStatus
STATEMENT_STATUS_NEEDS_REVIEW: StatementStatus
STATEMENT_STATUS_EXPIRED: StatementStatus
STATEMENT_STATUS_STALE_TOKEN: StatementStatus
STATEMENT_STATUS_REFUSED: StatementStatus
LEASE_MODE_UNSPECIFIED: LeaseMode
LEASE_MODE_EXECUTE: LeaseMode
LEASE_MODE_RECONCILE: LeaseMode
LEASE_MODE_REVIEW: LeaseMode
DECISION_UNSPECIFIED: Decision
DECISION_COMPLETED: Decision
DECISION_PENDING: Decision
DECISION_FAILED: Decision
DECISION_CANCELLED: Decision
SUBMISSION_STATE_UNSPECIFIED: SubmissionState
SUBMISSION_STATE_IN_FLIGHT: SubmissionState
SUBMISSION_STATE_RECORDED: SubmissionState
SUBMISSION_STATE_REFUSED: SubmissionState
SUBMISSION_STATE_UNKNOWN: SubmissionState
SUBMISSION_STATE_ABSENT: SubmissionState
SUBMISSION_VERDICT_UNSPECIFIED: SubmissionVerdict
SUBMISSION_VERDICT_FORWARD: SubmissionVerdict
SUBMISSION_VERDICT_REPLAY: SubmissionVerdict
SUBMISSION_VERDICT_BUSY: SubmissionVerdict
SUBMISSION_VERDICT_UNKNOWN: SubmissionVerdict
SUBMISSION_VERDICT_LOOKUP: SubmissionVerdict
SUBMISSION_OUTCOME_UNSPECIFIED: SubmissionOutcome
SUBMISSION_OUTCOME_ANSWERED: SubmissionOutcome
SUBMISSION_OUTCOME_REFUSED: SubmissionOutcome
SUBMISSION_OUTCOME_LOST: SubmissionOutcome
SUBMISSION_OUTCOME_NOT_SENT: SubmissionOutcome
SUBMISSION_OUTCOME_FOUND: SubmissionOutcome
SUBMISSION_OUTCOME_NOT_FOUND: SubmissionOutcome

class Intent(_message.Message):
    __slots__ = ("tenant", "key", "state", "params", "params_version", "fingerprint", "labels", "parent_key", "lease", "result", "failure", "history", "created_at", "updated_at", "completed_at", "revision", "retention", "retain_until", "children", "attempts", "max_attempts", "action", "identity", "summary")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    RETAIN_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    state: State
    params: _struct_pb2.Struct
    params_version: str
    fingerprint: str
    labels: _containers.ScalarMap[str, str]
    parent_key: str
    lease: Lease
    result: Result
    failure: Failure
    history: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    revision: int
    retention: _duration_pb2.Duration
    retain_until: _timestamp_pb2.Timestamp
    children: _containers.RepeatedCompositeFieldContainer[Child]
    attempts: int
    max_attempts: int
    action: str
    identity: _struct_pb2.Struct
    summary: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., state: _Optional[_Union[State, str]] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., params_version: _Optional[str] = ..., fingerprint: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., parent_key: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., history: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ..., retention: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retain_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., children: _Optional[_Iterable[_Union[Child, _Mapping]]] = ..., attempts: _Optional[int] = ..., max_attempts: _Optional[int] = ..., action: _Optional[str] = ..., identity: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., summary: _Optional[str] = ...) -> None: ...

class Child(_message.Message):
    __slots__ = ("key", "state")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    key: str
    state: State
    def __init__(self, key: _Optional[str] = ..., state: _Optional[_Union[State, str]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("token", "mode", "session_id", "worker", "acquired_at", "expires_at", "live")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    token: int
    mode: LeaseMode
    session_id: str
    worker: str
    acquired_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    live: bool
    def __init__(self, token: _Optional[int] = ..., mode: _Optional[_Union[LeaseMode, str]] = ..., session_id: _Optional[str] = ..., worker: _Optional[str] = ..., acquired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., live: bool = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("payload", "external_refs")
    class ExternalRefsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_REFS_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    external_refs: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[bytes] = ..., external_refs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("time", "kind", "token", "mode", "session_id", "worker", "accepted", "result", "failure", "reason", "principal", "resolved_state", "payload_sha256", "channel")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[HistoryEntry.Kind]
        KIND_REGISTERED: _ClassVar[HistoryEntry.Kind]
        KIND_ACQUIRED: _ClassVar[HistoryEntry.Kind]
        KIND_COMPLETED: _ClassVar[HistoryEntry.Kind]
        KIND_MARKED_UNKNOWN: _ClassVar[HistoryEntry.Kind]
        KIND_RELEASED: _ClassVar[HistoryEntry.Kind]
        KIND_FAILED: _ClassVar[HistoryEntry.Kind]
        KIND_HEARTBEAT: _ClassVar[HistoryEntry.Kind]
        KIND_LEASE_LAPSED: _ClassVar[HistoryEntry.Kind]
        KIND_ESCALATED: _ClassVar[HistoryEntry.Kind]
        KIND_RESOLVED: _ClassVar[HistoryEntry.Kind]
        KIND_CANCELLED: _ClassVar[HistoryEntry.Kind]
        KIND_CHILD_REGISTERED: _ClassVar[HistoryEntry.Kind]
        KIND_SUBMISSION_STARTED: _ClassVar[HistoryEntry.Kind]
        KIND_SUBMISSION_RECORDED: _ClassVar[HistoryEntry.Kind]
        KIND_SUBMISSION_UNKNOWN: _ClassVar[HistoryEntry.Kind]
    KIND_UNSPECIFIED: HistoryEntry.Kind
    KIND_REGISTERED: HistoryEntry.Kind
    KIND_ACQUIRED: HistoryEntry.Kind
    KIND_COMPLETED: HistoryEntry.Kind
    KIND_MARKED_UNKNOWN: HistoryEntry.Kind
    KIND_RELEASED: HistoryEntry.Kind
    KIND_FAILED: HistoryEntry.Kind
    KIND_HEARTBEAT: HistoryEntry.Kind
    KIND_LEASE_LAPSED: HistoryEntry.Kind
    KIND_ESCALATED: HistoryEntry.Kind
    KIND_RESOLVED: HistoryEntry.Kind
    KIND_CANCELLED: HistoryEntry.Kind
    KIND_CHILD_REGISTERED: HistoryEntry.Kind
    KIND_SUBMISSION_STARTED: HistoryEntry.Kind
    KIND_SUBMISSION_RECORDED: HistoryEntry.Kind
    KIND_SUBMISSION_UNKNOWN: HistoryEntry.Kind
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_STATE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA256_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    kind: HistoryEntry.Kind
    token: int
    mode: LeaseMode
    session_id: str
    worker: str
    accepted: bool
    result: Result
    failure: Failure
    reason: str
    principal: str
    resolved_state: State
    payload_sha256: str
    channel: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[_Union[HistoryEntry.Kind, str]] = ..., token: _Optional[int] = ..., mode: _Optional[_Union[LeaseMode, str]] = ..., session_id: _Optional[str] = ..., worker: _Optional[str] = ..., accepted: bool = ..., result: _Optional[_Union[Result, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., reason: _Optional[str] = ..., principal: _Optional[str] = ..., resolved_state: _Optional[_Union[State, str]] = ..., payload_sha256: _Optional[str] = ..., channel: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("tenant", "key", "params", "params_version", "labels", "parent_key", "retention", "request_id", "max_attempts", "action", "identity", "summary")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    params: _struct_pb2.Struct
    params_version: str
    labels: _containers.ScalarMap[str, str]
    parent_key: str
    retention: _duration_pb2.Duration
    request_id: str
    max_attempts: int
    action: str
    identity: _struct_pb2.Struct
    summary: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., params_version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., parent_key: _Optional[str] = ..., retention: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request_id: _Optional[str] = ..., max_attempts: _Optional[int] = ..., action: _Optional[str] = ..., identity: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., summary: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("intent", "created")
    INTENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    created: bool
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ..., created: bool = ...) -> None: ...

class DeriveKeyRequest(_message.Message):
    __slots__ = ("action", "identity", "params")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    action: str
    identity: _struct_pb2.Struct
    params: _struct_pb2.Struct
    def __init__(self, action: _Optional[str] = ..., identity: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class DeriveKeyResponse(_message.Message):
    __slots__ = ("key", "canonical", "fingerprint", "canonical_params")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    key: str
    canonical: str
    fingerprint: str
    canonical_params: str
    def __init__(self, key: _Optional[str] = ..., canonical: _Optional[str] = ..., fingerprint: _Optional[str] = ..., canonical_params: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("tenant", "worker", "ttl")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    worker: str
    ttl: _duration_pb2.Duration
    def __init__(self, tenant: _Optional[str] = ..., worker: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "ttl")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    ttl: _duration_pb2.Duration
    def __init__(self, session_id: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("tenant", "session_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("tenant", "key", "session_id", "request_id", "expected_fingerprint", "register")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    session_id: str
    request_id: str
    expected_fingerprint: str
    register: RegisterRequest
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., expected_fingerprint: _Optional[str] = ..., register: _Optional[_Union[RegisterRequest, _Mapping]] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("outcome", "intent", "lease", "action_taken", "statement")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ACTION_TAKEN_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    intent: Intent
    lease: Lease
    action_taken: str
    statement: Statement
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., intent: _Optional[_Union[Intent, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., action_taken: _Optional[str] = ..., statement: _Optional[_Union[Statement, _Mapping]] = ...) -> None: ...

class Statement(_message.Message):
    __slots__ = ("status", "intent_key", "state", "result", "completed_at", "action_taken", "current_token", "text")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INTENT_KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTION_TAKEN_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    status: str
    intent_key: str
    state: State
    result: Result
    completed_at: _timestamp_pb2.Timestamp
    action_taken: str
    current_token: int
    text: str
    def __init__(self, status: _Optional[str] = ..., intent_key: _Optional[str] = ..., state: _Optional[_Union[State, str]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action_taken: _Optional[str] = ..., current_token: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class HeldLease(_message.Message):
    __slots__ = ("key", "token")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    token: int
    def __init__(self, key: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("tenant", "session_id", "leases")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    leases: _containers.RepeatedCompositeFieldContainer[HeldLease]
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., leases: _Optional[_Iterable[_Union[HeldLease, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("ttl",)
    TTL_FIELD_NUMBER: _ClassVar[int]
    ttl: _duration_pb2.Duration
    def __init__(self, ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("tenant", "key", "token", "result", "children")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    token: int
    result: Result
    children: _containers.RepeatedCompositeFieldContainer[RegisterRequest]
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., children: _Optional[_Iterable[_Union[RegisterRequest, _Mapping]]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("intent", "action_taken")
    INTENT_FIELD_NUMBER: _ClassVar[int]
    ACTION_TAKEN_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    action_taken: str
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ..., action_taken: _Optional[str] = ...) -> None: ...

class MarkUnknownRequest(_message.Message):
    __slots__ = ("tenant", "key", "token", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    token: int
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class MarkUnknownResponse(_message.Message):
    __slots__ = ("intent",)
    INTENT_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("tenant", "key", "token", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    token: int
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("intent",)
    INTENT_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("tenant", "key", "token", "failure")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    token: int
    failure: Failure
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class FailResponse(_message.Message):
    __slots__ = ("intent",)
    INTENT_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("tenant", "key")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("intent",)
    INTENT_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ...) -> None: ...

class EscalateRequest(_message.Message):
    __slots__ = ("tenant", "key", "token", "reason", "actor", "force")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    token: int
    reason: str
    actor: str
    force: bool
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., force: bool = ...) -> None: ...

class EscalateResponse(_message.Message):
    __slots__ = ("intent",)
    INTENT_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ...) -> None: ...

class ResolveRequest(_message.Message):
    __slots__ = ("tenant", "key", "decision", "result", "failure", "actor", "reason", "force", "request_id", "channel", "expected_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    decision: Decision
    result: Result
    failure: Failure
    actor: str
    reason: str
    force: bool
    request_id: str
    channel: str
    expected_token: int
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., decision: _Optional[_Union[Decision, str]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., force: bool = ..., request_id: _Optional[str] = ..., channel: _Optional[str] = ..., expected_token: _Optional[int] = ...) -> None: ...

class ResolveResponse(_message.Message):
    __slots__ = ("intent", "action_taken")
    INTENT_FIELD_NUMBER: _ClassVar[int]
    ACTION_TAKEN_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    action_taken: str
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ..., action_taken: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("tenant", "key", "actor", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    actor: str
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("intent",)
    INTENT_FIELD_NUMBER: _ClassVar[int]
    intent: Intent
    def __init__(self, intent: _Optional[_Union[Intent, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("tenant", "states", "label", "parent_key", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    states: _containers.RepeatedScalarFieldContainer[State]
    label: str
    parent_key: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., states: _Optional[_Iterable[_Union[State, str]]] = ..., label: _Optional[str] = ..., parent_key: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("intents", "next_page_token", "revision")
    INTENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    intents: _containers.RepeatedCompositeFieldContainer[Intent]
    next_page_token: str
    revision: int
    def __init__(self, intents: _Optional[_Iterable[_Union[Intent, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("tenant", "key", "states", "label", "parent_key", "start_revision", "created_notify")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    CREATED_NOTIFY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    states: _containers.RepeatedScalarFieldContainer[State]
    label: str
    parent_key: str
    start_revision: int
    created_notify: bool
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., states: _Optional[_Iterable[_Union[State, str]]] = ..., label: _Optional[str] = ..., parent_key: _Optional[str] = ..., start_revision: _Optional[int] = ..., created_notify: bool = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("type", "intent", "revision")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[WatchResponse.Type]
        TYPE_PUT: _ClassVar[WatchResponse.Type]
        TYPE_DELETED: _ClassVar[WatchResponse.Type]
        TYPE_CREATED: _ClassVar[WatchResponse.Type]
    TYPE_UNSPECIFIED: WatchResponse.Type
    TYPE_PUT: WatchResponse.Type
    TYPE_DELETED: WatchResponse.Type
    TYPE_CREATED: WatchResponse.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    type: WatchResponse.Type
    intent: Intent
    revision: int
    def __init__(self, type: _Optional[_Union[WatchResponse.Type, str]] = ..., intent: _Optional[_Union[Intent, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class SubmittedRequest(_message.Message):
    __slots__ = ("upstream", "method", "target", "body_sha256", "body_bytes", "body_kept")
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BODY_SHA256_FIELD_NUMBER: _ClassVar[int]
    BODY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BODY_KEPT_FIELD_NUMBER: _ClassVar[int]
    upstream: str
    method: str
    target: str
    body_sha256: str
    body_bytes: int
    body_kept: bytes
    def __init__(self, upstream: _Optional[str] = ..., method: _Optional[str] = ..., target: _Optional[str] = ..., body_sha256: _Optional[str] = ..., body_bytes: _Optional[int] = ..., body_kept: _Optional[bytes] = ...) -> None: ...

class UpstreamResponse(_message.Message):
    __slots__ = ("status", "headers", "body", "body_bytes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    BODY_BYTES_FIELD_NUMBER: _ClassVar[int]
    status: int
    headers: _containers.RepeatedCompositeFieldContainer[HeaderField]
    body: bytes
    body_bytes: int
    def __init__(self, status: _Optional[int] = ..., headers: _Optional[_Iterable[_Union[HeaderField, _Mapping]]] = ..., body: _Optional[bytes] = ..., body_bytes: _Optional[int] = ...) -> None: ...

class HeaderField(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Submission(_message.Message):
    __slots__ = ("operation", "submission_id", "token", "state", "request", "started_at", "deadline", "ended_at", "response", "looked_up", "error", "has_lookup")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    LOOKED_UP_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HAS_LOOKUP_FIELD_NUMBER: _ClassVar[int]
    operation: str
    submission_id: str
    token: int
    state: SubmissionState
    request: SubmittedRequest
    started_at: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    response: UpstreamResponse
    looked_up: bool
    error: str
    has_lookup: bool
    def __init__(self, operation: _Optional[str] = ..., submission_id: _Optional[str] = ..., token: _Optional[int] = ..., state: _Optional[_Union[SubmissionState, str]] = ..., request: _Optional[_Union[SubmittedRequest, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., response: _Optional[_Union[UpstreamResponse, _Mapping]] = ..., looked_up: bool = ..., error: _Optional[str] = ..., has_lookup: bool = ...) -> None: ...

class BeginSubmissionRequest(_message.Message):
    __slots__ = ("tenant", "key", "operation", "token", "submission_id", "lookup", "upstream_has_lookup", "request", "timeout")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_HAS_LOOKUP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    operation: str
    token: int
    submission_id: str
    lookup: bool
    upstream_has_lookup: bool
    request: SubmittedRequest
    timeout: _duration_pb2.Duration
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., operation: _Optional[str] = ..., token: _Optional[int] = ..., submission_id: _Optional[str] = ..., lookup: bool = ..., upstream_has_lookup: bool = ..., request: _Optional[_Union[SubmittedRequest, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BeginSubmissionResponse(_message.Message):
    __slots__ = ("verdict", "submission", "intent", "statement")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    verdict: SubmissionVerdict
    submission: Submission
    intent: Intent
    statement: Statement
    def __init__(self, verdict: _Optional[_Union[SubmissionVerdict, str]] = ..., submission: _Optional[_Union[Submission, _Mapping]] = ..., intent: _Optional[_Union[Intent, _Mapping]] = ..., statement: _Optional[_Union[Statement, _Mapping]] = ...) -> None: ...

class RecordSubmissionRequest(_message.Message):
    __slots__ = ("tenant", "key", "operation", "token", "submission_id", "outcome", "response", "error")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    operation: str
    token: int
    submission_id: str
    outcome: SubmissionOutcome
    response: UpstreamResponse
    error: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., operation: _Optional[str] = ..., token: _Optional[int] = ..., submission_id: _Optional[str] = ..., outcome: _Optional[_Union[SubmissionOutcome, str]] = ..., response: _Optional[_Union[UpstreamResponse, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class RecordSubmissionResponse(_message.Message):
    __slots__ = ("submission", "intent", "statement")
    SUBMISSION_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    submission: Submission
    intent: Intent
    statement: Statement
    def __init__(self, submission: _Optional[_Union[Submission, _Mapping]] = ..., intent: _Optional[_Union[Intent, _Mapping]] = ..., statement: _Optional[_Union[Statement, _Mapping]] = ...) -> None: ...
