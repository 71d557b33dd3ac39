"""Errors intentd returns, one exception class per ErrorInfo reason.

Every call intentd refuses or cannot answer raises an :class:`IntentdError`
subclass chosen by the ``google.rpc.ErrorInfo`` reason of the status (domain
``intentd.dev``), or by the gRPC code when there is none (a transport
failure). Each carries the code, the reason, the ErrorInfo metadata, the
offending field of an invalid argument, and the ``Statement`` intentd attaches
to refusals of fenced calls::

    try:
        client.complete(key, token, result)
    except intentd.StaleToken as e:
        print(e.current_token, e.statement.text)
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Type

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

from intent.v1 import intent_pb2

DOMAIN = "intentd.dev"


def reason_name(reason: int) -> str:
    """The ErrorInfo reason on the wire for a value of the proto's
    ``ErrorReason``: its name without the ``ERROR_REASON_`` prefix
    (``ERROR_REASON_STALE_TOKEN`` is ``"STALE_TOKEN"``)."""
    return intent_pb2.ErrorReason.Name(reason)[len("ERROR_REASON_"):]


class IntentdError(Exception):
    """A call intentd refused or could not answer.

    Attributes:
        code: the gRPC status code.
        reason: the ErrorInfo reason, e.g. ``"STALE_TOKEN"``; empty if none.
        metadata: the ErrorInfo metadata, e.g. ``{"current_token": "42"}``.
        field: the request field an invalid argument names, else ``""``.
        statement: what became of the intent (``intent.v1.Statement``), when
            intentd says so (refusals of fenced calls), else ``None``.
        message: intentd's message.
    """

    #: The ErrorInfo reason this class stands for ("" for code-only classes).
    REASON = ""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        metadata: Optional[Mapping[str, str]] = None,
        field: str = "",
        statement: Optional[intent_pb2.Statement] = None,
    ) -> None:
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata: Dict[str, str] = dict(metadata or {})
        self.field = field
        self.statement = statement
        super().__init__(str(self))

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)
        if self.reason:
            return f"intentd: {self.message} ({name}, {self.reason})"
        return f"intentd: {self.message} ({name})"

    @property
    def current_token(self) -> int:
        """The intent's newest fencing token, for a STALE_TOKEN refusal (else 0)."""
        try:
            return int(self.metadata.get("current_token", "0"))
        except ValueError:
            return 0


# Code-only classes: the fallback when a status carries no known reason.
class InvalidArgument(IntentdError):
    """INVALID_ARGUMENT: the request is malformed; fix it, do not retry it."""


class NotFound(IntentdError):
    """NOT_FOUND: no such intent or session."""


class FailedPrecondition(IntentdError):
    """FAILED_PRECONDITION: the intent's state forbids the call."""


class Aborted(IntentdError):
    """ABORTED: the caller lost a race; acquire again."""


class Unavailable(IntentdError):
    """UNAVAILABLE or DEADLINE_EXCEEDED: intentd did not answer; the same call may be sent again."""


class ResourceExhausted(IntentdError):
    """RESOURCE_EXHAUSTED: a limit was reached."""


class Unauthenticated(IntentdError):
    """UNAUTHENTICATED: no or unknown credentials."""

    REASON = reason_name(intent_pb2.ERROR_REASON_UNAUTHENTICATED)


class PermissionDenied(IntentdError):
    """PERMISSION_DENIED: a role or tenant the principal lacks."""

    REASON = reason_name(intent_pb2.ERROR_REASON_PERMISSION_DENIED)


class Internal(IntentdError):
    """INTERNAL: a bug in intentd; its log has the details."""

    REASON = reason_name(intent_pb2.ERROR_REASON_INTERNAL)


# One class per reason.
class InvalidField(InvalidArgument):
    """A request field is malformed; ``field`` names it (e.g. ``"register.params"``)."""

    REASON = reason_name(intent_pb2.ERROR_REASON_INVALID_FIELD)


class IntentNotFound(NotFound):
    """No approved intent with this key."""

    REASON = reason_name(intent_pb2.ERROR_REASON_INTENT_NOT_FOUND)


class SessionNotFound(NotFound):
    """The session expired, was closed or never existed: open a new one."""

    REASON = reason_name(intent_pb2.ERROR_REASON_SESSION_NOT_FOUND)


class FingerprintMismatch(FailedPrecondition):
    """Same key, other approved terms: stop and escalate, never act."""

    REASON = reason_name(intent_pb2.ERROR_REASON_FINGERPRINT_MISMATCH)


class InvalidTransition(FailedPrecondition):
    """The intent's state does not allow this call (``statement`` says which state)."""

    REASON = reason_name(intent_pb2.ERROR_REASON_INVALID_TRANSITION)


class ResultMismatch(FailedPrecondition):
    """Complete retried under the same token with another result."""

    REASON = reason_name(intent_pb2.ERROR_REASON_RESULT_MISMATCH)


class IntentExpired(FailedPrecondition):
    """The record outlived its retention: a new approval is needed."""

    REASON = reason_name(intent_pb2.ERROR_REASON_INTENT_EXPIRED)


class LeaseHeld(FailedPrecondition):
    """A reviewer call on an intent under a live lease, without force."""

    REASON = reason_name(intent_pb2.ERROR_REASON_LEASE_HELD)


class RevisionCompacted(FailedPrecondition):
    """A page token or watch revision etcd no longer has: list again."""

    REASON = reason_name(intent_pb2.ERROR_REASON_REVISION_COMPACTED)


class StaleToken(Aborted):
    """A newer lease superseded the caller's token (``current_token``); the
    report changed nothing and is kept as evidence. Acquire again to learn
    what became of the intent."""

    REASON = reason_name(intent_pb2.ERROR_REASON_STALE_TOKEN)


class RateLimited(ResourceExhausted):
    """Over a rate limit; RetryInfo says when to try again."""

    REASON = reason_name(intent_pb2.ERROR_REASON_RATE_LIMITED)


class TooLarge(ResourceExhausted):
    """A change too large for one etcd transaction."""

    REASON = reason_name(intent_pb2.ERROR_REASON_TOO_LARGE)


class StoreFull(ResourceExhausted):
    """etcd's backend quota is exhausted; reads are still served."""

    REASON = reason_name(intent_pb2.ERROR_REASON_STORE_FULL)


class StoreUnavailable(Unavailable):
    """etcd did not answer in time; the same call may be sent again."""

    REASON = reason_name(intent_pb2.ERROR_REASON_STORE_UNAVAILABLE)


class StoreRolledBack(Unavailable):
    """etcd's revision went back (a restore without a revision bump): nothing is decided."""

    REASON = reason_name(intent_pb2.ERROR_REASON_STORE_ROLLED_BACK)


class ArchiveUnavailable(Unavailable):
    """The call needed the archive (PostgreSQL: an intent that left etcd) and
    it did not answer; calls on live intents still work, and the same call
    may be sent again once it is back."""

    REASON = reason_name(intent_pb2.ERROR_REASON_ARCHIVE_UNAVAILABLE)


def _reason_classes() -> Dict[str, Type[IntentdError]]:
    out: Dict[str, Type[IntentdError]] = {}
    todo = [IntentdError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.REASON:
            out[cls.REASON] = cls
    return out


#: Every ErrorInfo reason intentd sends, and the class raised for it.
BY_REASON: Dict[str, Type[IntentdError]] = _reason_classes()

_BY_CODE: Dict[grpc.StatusCode, Type[IntentdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.INTERNAL: Internal,
}


def _status_messages():
    """google.rpc.Status, ErrorInfo and BadRequest, built from a descriptor in
    a private pool: Debian has no googleapis-common-protos, and a private pool
    cannot clash with it where it is installed."""
    T = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(
        name="intentd/google_rpc_status.proto",
        package="google.rpc",
        syntax="proto3",
        dependency=["google/protobuf/any.proto"],
    )

    def field(msg, name, number, typ, label=T.LABEL_OPTIONAL, type_name=""):
        f = msg.field.add(name=name, number=number, type=typ, label=label, json_name=name)
        if type_name:
            f.type_name = type_name

    status = fd.message_type.add(name="Status")
    field(status, "code", 1, T.TYPE_INT32)
    field(status, "message", 2, T.TYPE_STRING)
    field(status, "details", 3, T.TYPE_MESSAGE, T.LABEL_REPEATED, ".google.protobuf.Any")
    info = fd.message_type.add(name="ErrorInfo")
    field(info, "reason", 1, T.TYPE_STRING)
    field(info, "domain", 2, T.TYPE_STRING)
    entry = info.nested_type.add(name="MetadataEntry")
    entry.options.map_entry = True
    field(entry, "key", 1, T.TYPE_STRING)
    field(entry, "value", 2, T.TYPE_STRING)
    field(info, "metadata", 3, T.TYPE_MESSAGE, T.LABEL_REPEATED, ".google.rpc.ErrorInfo.MetadataEntry")
    bad = fd.message_type.add(name="BadRequest")
    violation = bad.nested_type.add(name="FieldViolation")
    field(violation, "field", 1, T.TYPE_STRING)
    field(violation, "description", 2, T.TYPE_STRING)
    field(bad, "field_violations", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED, ".google.rpc.BadRequest.FieldViolation")

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(any_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    descriptors = [pool.FindMessageTypeByName("google.rpc." + n) for n in ("Status", "ErrorInfo", "BadRequest")]
    if hasattr(message_factory, "GetMessageClass"):  # protobuf 4.22 and newer (GetPrototype is gone from 5)
        return tuple(message_factory.GetMessageClass(d) for d in descriptors)
    factory = message_factory.MessageFactory(pool)  # Debian's protobuf 4.21
    return tuple(factory.GetPrototype(d) for d in descriptors)


_Status, _ErrorInfo, _BadRequest = _status_messages()
_STATUS_DETAILS_KEY = "grpc-status-details-bin"


def _type_name(detail: any_pb2.Any) -> str:
    return detail.type_url.rsplit("/", 1)[-1]


def from_rpc_error(err: grpc.RpcError) -> IntentdError:
    """Turns a gRPC error into the IntentdError subclass for its reason (or code)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    reason, metadata, field, statement = "", {}, "", None
    for key, value in (err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else ():
        if key != _STATUS_DETAILS_KEY:
            continue
        status = _Status.FromString(value)
        for detail in status.details:
            name = _type_name(detail)
            if name == "google.rpc.ErrorInfo":
                info = _ErrorInfo.FromString(detail.value)
                if info.domain in (DOMAIN, ""):
                    reason, metadata = info.reason, dict(info.metadata)
            elif name == "google.rpc.BadRequest":
                bad = _BadRequest.FromString(detail.value)
                if bad.field_violations:
                    field = bad.field_violations[0].field
            elif name == "intent.v1.Statement":
                statement = intent_pb2.Statement.FromString(detail.value)
    if not field:
        field = metadata.get("field", "") if reason == InvalidField.REASON else ""
    cls = BY_REASON.get(reason) or _BY_CODE.get(code, IntentdError)
    return cls(code, message or "", reason=reason, metadata=metadata, field=field, statement=statement)


class SessionLost(Exception):
    """The session is gone here (expired, closed, or no heartbeat confirmed
    for a whole TTL): every lease it held may have lapsed; work under them
    must stop. Not an answer of intentd: the worker's own conclusion."""


class LeaseLost(Exception):
    """A lease was lost (superseded, or its session lost) while the task ran
    under it and nobody took over; the report was still sent and accepted
    as the best evidence there is."""
