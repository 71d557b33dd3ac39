"""Client: typed calls to intentd that retry only while intentd did not answer."""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Tuple

import grpc
from google.protobuf import duration_pb2, struct_pb2

from intent.v1 import intent_pb2, intent_pb2_grpc

from .errors import from_rpc_error
from .ids import new_request_id
from .session import Session

_RETRIABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Retrying:
    """One call's retry budget, the same for :class:`Client` and
    :class:`intentd.aio.AsyncClient`: the deadline of each attempt, and,
    after an error, either the wait before sending again (intentd did not
    answer: UNAVAILABLE or the attempt's deadline) or the error's
    :mod:`intentd.errors` class raised (a refusal, or the budget spent)."""

    def __init__(self, client: "Calls", timeout: Optional[float]) -> None:
        self._client = client
        self.budget = client.retry_timeout if timeout is None else timeout
        self.deadline = time.monotonic() + self.budget
        self._wait = client.backoff_min

    def attempt_timeout(self) -> float:
        """The deadline of the next attempt, in seconds from now."""
        return max(min(self._client.call_timeout, self.deadline - time.monotonic()), 0.001)

    def after(self, e: grpc.RpcError) -> float:
        """The jittered wait before the next attempt; raises instead when
        intentd answered (a refusal is never resent) or time ran out."""
        err = from_rpc_error(e)
        if e.code() not in _RETRIABLE:
            raise err from None
        left = self.deadline - time.monotonic()
        if left <= 0:
            # Say how long it was tried: an intentd that is not running is
            # otherwise a silent wait of retry_timeout, then this error.
            err.message += f"; no answer in {self.budget:g}s of retries (the call's timeout, else the client's retry_timeout)"
            err.args = (str(err),)
            raise err from None
        wait = min(left, self._wait / 2 + random.uniform(0, self._wait / 2))
        self._wait = min(2 * self._wait, self._client.backoff_max)
        return wait


# intentd's limits on the free text of a report, in UTF-8 bytes (the
# proto's rules): a reason (MarkUnknown, Release, Escalate) and a failure's
# message, and a failure's code.
MAX_REASON_BYTES = 1024
MAX_FAILURE_CODE_BYTES = 128


def cut_utf8(text: str, limit: int) -> str:
    """text cut to at most limit UTF-8 bytes, at a character boundary.

    intentd's limits are in bytes, not characters: 1000 characters of
    French or of "€" are more than 1024 bytes, and a report refused for its
    length leaves the lease held. A character UTF-8 cannot encode (a lone
    surrogate, as from a file name decoded with ``surrogateescape``) becomes
    "?": protobuf would refuse to send it at all."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "replace")
        text = data.decode("utf-8")
    if len(data) <= limit:
        return text
    # A prefix of valid UTF-8 is invalid only in its last, cut character.
    return data[:limit].decode("utf-8", "ignore")


def struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    """A google.protobuf.Struct holding a JSON-like mapping (numbers become doubles)."""
    s = struct_pb2.Struct()
    fill(s, value, "value")
    return s


def fill(target: struct_pb2.Struct, value: Mapping[str, Any], what: str) -> None:
    """Sets target (params, identity) from a JSON-like mapping. A value
    that is not JSON — a Decimal, a datetime, a set — is a TypeError naming
    where it is (``params.max_eur is a Decimal``), rather than protobuf's
    bare "Unexpected type"."""
    try:
        target.update(value)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{_not_json(value, what) or what}: not JSON ({e}); give strings, numbers, booleans, None, lists and dicts with string keys (a Decimal as a string, say)") from None


def _not_json(value: Any, path: str) -> Optional[str]:
    """Where in value the first thing that is not JSON is, in words."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path} has the key {k!r}, not a string"
            got = _not_json(v, f"{path}.{k}")
            if got:
                return got
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            got = _not_json(v, f"{path}[{i}]")
            if got:
                return got
    elif not isinstance(value, (str, int, float, bool, type(None))):
        return f"{path} is a {type(value).__name__}"
    return None


class Calls:
    """The calls of intentd, built once for both clients: each method builds
    its request and hands it to ``_call``, which :class:`Client` sends and
    answers at once, and :class:`intentd.aio.AsyncClient` returns as an
    awaitable. The retry policy is :class:`Retrying`."""

    tenant: str
    call_timeout: float
    retry_timeout: float
    backoff_min: float
    backoff_max: float
    report_timeout: float
    _metadata: Sequence[Tuple[str, str]]

    def _configure(
        self,
        tenant: str,
        token: str,
        metadata: Sequence[Tuple[str, str]],
        call_timeout: float,
        retry_timeout: float,
        backoff: Tuple[float, float],
        report_timeout: float,
    ) -> None:
        self.tenant = tenant
        self.call_timeout = call_timeout
        self.retry_timeout = retry_timeout
        self.backoff_min, self.backoff_max = backoff
        self.report_timeout = report_timeout
        auth = (("authorization", "Bearer " + token),) if token else ()
        self._metadata = tuple(metadata) + auth

    def _call(self, method: str, request: Any, timeout: Optional[float] = None, then: Optional[Callable[[Any], Any]] = None) -> Any:
        """Sends request to the method named, retrying as :class:`Retrying`
        says; ``then`` maps the response."""
        raise NotImplementedError

    def _tenant(self, request: Any) -> Any:
        if not request.tenant:
            request.tenant = self.tenant
        return request

    def register(
        self,
        key: str,
        params: Mapping[str, Any],
        *,
        labels: Optional[Mapping[str, str]] = None,
        params_version: str = "",
        parent_key: str = "",
        request_id: str = "",
        timeout: Optional[float] = None,
        **fields: Any,
    ) -> intent_pb2.RegisterResponse:
        """Approves an intent: idempotent for the same key and params; other
        params raise :class:`FingerprintMismatch`. The request id (fresh
        unless given) is kept across this call's retries, so ``created``
        stays true when a reply was lost. Extra keyword arguments are further
        RegisterRequest fields (e.g. ``max_attempts`` where the server has it),
        and ``action``, ``identity`` and ``summary`` as
        :meth:`register_request` takes them (``key=""`` to have it derived)."""
        req = self.register_request(key, params, labels=labels, params_version=params_version, parent_key=parent_key, **fields)
        req.request_id = request_id or new_request_id()
        return self._call("Register", self._tenant(req), timeout)

    @staticmethod
    def register_request(
        key: str,
        params: Mapping[str, Any],
        *,
        labels: Optional[Mapping[str, str]] = None,
        action: str = "",
        identity: Optional[Mapping[str, Any]] = None,
        summary: str = "",
        **fields: Any,
    ) -> intent_pb2.RegisterRequest:
        """A RegisterRequest, for :class:`Task.register` and outbox children.

        ``action`` and ``identity`` (the fields that make the action distinct)
        tell reviewers what the intent is: with them intentd derives an empty
        ``key`` as :meth:`derive_key` does, and refuses a given one that is not
        that key. ``summary`` is a one-line sentence for reviewers (at most 200
        characters). None of the three is part of the fingerprint."""
        req = intent_pb2.RegisterRequest(key=key or "", labels=dict(labels or {}), action=action, summary=summary, **{k: v for k, v in fields.items() if v})
        fill(req.params, params, "params")
        if identity:
            fill(req.identity, identity, "identity")
        return req

    def derive_key(self, action: str, identity: Mapping[str, Any], *, timeout: Optional[float] = None) -> intent_pb2.DeriveKeyResponse:
        """The canonical key for an action and its identity fields, as intentd
        derives it: ask the server rather than reimplement the canonical form."""
        req = intent_pb2.DeriveKeyRequest(action=action)
        fill(req.identity, identity, "identity")
        return self._call("DeriveKey", req, timeout)

    def fingerprint(self, params: Mapping[str, Any], *, timeout: Optional[float] = None) -> str:
        """The fingerprint intentd gives params (the one Register stores), for
        :meth:`acquire`'s ``expected_fingerprint``: ask the server rather than
        reimplement the canonical form."""
        req = intent_pb2.DeriveKeyRequest()
        fill(req.params, params, "params")
        return self._call("DeriveKey", req, timeout, then=lambda r: r.fingerprint)

    def _open_session_request(self, worker: str, ttl: float) -> intent_pb2.OpenSessionRequest:
        req = intent_pb2.OpenSessionRequest(tenant=self.tenant, worker=worker)
        if ttl:
            req.ttl.CopyFrom(_duration(ttl))
        return req

    def acquire(
        self,
        key: str,
        session_id: str,
        *,
        request_id: str = "",
        expected_fingerprint: str = "",
        register: Optional[intent_pb2.RegisterRequest] = None,
        timeout: Optional[float] = None,
    ) -> intent_pb2.AcquireResponse:
        """Asks for the right to act on an intent. The same request id (fresh
        unless given) returns the same lease on every retry."""
        req = intent_pb2.AcquireRequest(
            key=key, session_id=session_id, request_id=request_id or new_request_id(), expected_fingerprint=expected_fingerprint
        )
        self._tenant(req)
        if register is not None:
            req.register.CopyFrom(register)
            req.register.key, req.register.tenant = key, req.tenant
        return self._call("Acquire", req, timeout)

    def complete(
        self,
        key: str,
        token: int,
        result: intent_pb2.Result,
        *,
        children: Sequence[intent_pb2.RegisterRequest] = (),
        timeout: Optional[float] = None,
    ) -> intent_pb2.CompleteResponse:
        """Records the result under the caller's token."""
        req = intent_pb2.CompleteRequest(key=key, token=token, result=result, children=list(children))
        return self._call("Complete", self._tenant(req), timeout)

    def mark_unknown(self, key: str, token: int, reason: str, *, timeout: Optional[float] = None) -> intent_pb2.MarkUnknownResponse:
        """Records that the outcome is unknown, under the caller's token: the next Acquire reconciles.
        The reason is cut to intentd's 1024 UTF-8 bytes (:func:`cut_utf8`)."""
        req = intent_pb2.MarkUnknownRequest(key=key, token=token, reason=cut_utf8(reason, MAX_REASON_BYTES))
        return self._call("MarkUnknown", self._tenant(req), timeout)

    def release(self, key: str, token: int, reason: str, *, timeout: Optional[float] = None) -> intent_pb2.ReleaseResponse:
        """Records a confirmed absence, under the caller's token: the intent is PENDING again.
        The reason is cut to intentd's 1024 UTF-8 bytes (:func:`cut_utf8`)."""
        req = intent_pb2.ReleaseRequest(key=key, token=token, reason=cut_utf8(reason, MAX_REASON_BYTES))
        return self._call("Release", self._tenant(req), timeout)

    def fail(self, key: str, token: int, code: str, message: str = "", *, timeout: Optional[float] = None) -> intent_pb2.FailResponse:
        """Records a definite failure, under the caller's token. The code is cut
        to intentd's 128 UTF-8 bytes and the message to 1024 (:func:`cut_utf8`);
        an empty code is refused (:class:`intentd.InvalidField`)."""
        req = intent_pb2.FailRequest(key=key, token=token, failure=intent_pb2.Failure(code=cut_utf8(code, MAX_FAILURE_CODE_BYTES), message=cut_utf8(message, MAX_REASON_BYTES)))
        return self._call("Fail", self._tenant(req), timeout)

    def escalate(self, key: str, reason: str, *, token: int = 0, actor: str = "", force: bool = False, timeout: Optional[float] = None) -> intent_pb2.EscalateResponse:
        """Hands an intent to a human (under the worker's token, or as a reviewer with token 0).
        The reason, required, is cut to intentd's 1024 UTF-8 bytes (:func:`cut_utf8`)."""
        req = intent_pb2.EscalateRequest(key=key, token=token, reason=cut_utf8(reason, MAX_REASON_BYTES), actor=actor, force=force)
        return self._call("Escalate", self._tenant(req), timeout)

    def resolve(self, request: intent_pb2.ResolveRequest, *, timeout: Optional[float] = None) -> intent_pb2.ResolveResponse:
        """Records a reviewer's decision; a fresh request id is set unless given."""
        if not request.request_id:
            request.request_id = new_request_id()
        return self._call("Resolve", self._tenant(request), timeout)

    def cancel(self, key: str, *, actor: str = "", reason: str = "", timeout: Optional[float] = None) -> intent_pb2.CancelResponse:
        """Withdraws a PENDING intent."""
        req = intent_pb2.CancelRequest(key=key, actor=actor, reason=reason)
        return self._call("Cancel", self._tenant(req), timeout)

    def get(self, key: str, *, timeout: Optional[float] = None) -> intent_pb2.Intent:
        """Reads an intent with its history."""
        return self._call("Get", self._tenant(intent_pb2.GetRequest(key=key)), timeout, then=lambda r: r.intent)

    def list(self, request: intent_pb2.ListRequest, *, timeout: Optional[float] = None) -> intent_pb2.ListResponse:
        """Reads one page of intents."""
        return self._call("List", self._tenant(request), timeout)

    def _watch_request(self, request: intent_pb2.WatchRequest) -> intent_pb2.WatchRequest:
        return self._tenant(request)


class Client(Calls):
    """Calls intentd. Safe for use from many threads.

    Every call is sent again, with jittered exponential backoff and a deadline
    per attempt, while intentd does not answer (UNAVAILABLE, or the attempt's
    deadline passed) — every intentd call recognizes its own earlier effect,
    so that is safe — until the call's own ``timeout`` (default
    ``retry_timeout``) runs out. A refusal (any other code) is raised at once
    as the :mod:`intentd.errors` class for its reason, and never resent.
    :class:`intentd.aio.AsyncClient` is the same on asyncio.

    Args:
        target: ``host:port`` of intentd, used when ``channel`` is not given.
        channel: a ready ``grpc.Channel`` (TLS, interceptors: the caller's).
        tenant: the tenant of every request that names none.
        token: a bearer token, sent as ``authorization: Bearer <token>``.
        metadata: more gRPC metadata sent with every call, such as a W3C
            ``traceparent`` so that intentd's spans join the caller's trace
            (with OpenTelemetry for Python, instrument ``channel`` instead).
        call_timeout: the deadline of each attempt, in seconds.
        retry_timeout: how long one call keeps retrying, in seconds.
        backoff: the first and the longest wait between attempts, in seconds.
        report_timeout: how long :meth:`Session.run` keeps retrying a report
            after the side effect ran: an effect that happened gets recorded.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:7650",
        *,
        channel: Optional[grpc.Channel] = None,
        tenant: str = "",
        token: str = "",
        metadata: Sequence[Tuple[str, str]] = (),
        call_timeout: float = 10.0,
        retry_timeout: float = 60.0,
        backoff: Tuple[float, float] = (0.05, 2.0),
        report_timeout: float = 60.0,
    ) -> None:
        self._own_channel = channel is None
        self._channel = channel if channel is not None else grpc.insecure_channel(target)
        self.rpc = intent_pb2_grpc.IntentServiceStub(self._channel)
        """The generated stub, for calls this class does not wrap."""
        self._configure(tenant, token, metadata, call_timeout, retry_timeout, backoff, report_timeout)

    def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: Optional[float] = None, then: Optional[Callable[[Any], Any]] = None) -> Any:
        """Sends request until intentd answers or timeout (seconds) runs out."""
        rpc = getattr(self.rpc, method)
        retrying = Retrying(self, timeout)
        while True:
            try:
                resp = rpc(request, timeout=retrying.attempt_timeout(), metadata=self._metadata)
                return then(resp) if then is not None else resp
            except grpc.RpcError as e:
                wait = retrying.after(e)
            time.sleep(wait)

    def open_session(self, worker: str, ttl: float = 0, *, timeout: Optional[float] = None) -> "Session":
        """Opens a worker session with a TTL in seconds (0: the server's
        default) and starts its heartbeat thread. See :class:`Session`."""
        sent = time.monotonic()
        resp = self._call("OpenSession", self._open_session_request(worker, ttl), timeout)
        return Session(self, resp.session_id, worker, resp.ttl.ToTimedelta().total_seconds(), sent)

    def watch(self, request: intent_pb2.WatchRequest, *, timeout: Optional[float] = None) -> Iterator[intent_pb2.WatchResponse]:
        """Yields the changes the stream reports until ``timeout`` (seconds)
        passes or the stream breaks. A broken stream raises
        and is not resumed here: resume from the last revision + 1, or list
        again on :class:`RevisionCompacted`. The end of ``timeout`` ends the
        iteration without an error. A message without an intent (the server
        saying the watch is established) is yielded too: skip it."""
        stream = self.rpc.Watch(self._watch_request(request), timeout=timeout, metadata=self._metadata)
        try:
            for ev in stream:
                yield ev
        except grpc.RpcError as e:
            if watch_ended(e, timeout):
                return
            raise from_rpc_error(e) from None
        finally:
            stream.cancel()


def watch_ended(e: grpc.RpcError, timeout: Optional[float]) -> bool:
    """True when a watch stream's error is its normal end: cancelled, or
    its own ``timeout`` passed."""
    return e.code() == grpc.StatusCode.CANCELLED or (e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


__all__ = ["Calls", "Client", "Retrying", "cut_utf8", "new_request_id", "struct"]
