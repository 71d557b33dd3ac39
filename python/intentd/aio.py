"""intentd on asyncio: the same calls and the same claim → act → report loop
as :class:`intentd.Client`, on ``grpc.aio``, for agent hosts whose tools are
coroutines::

    import intentd.aio

    async with intentd.aio.AsyncClient("127.0.0.1:7650") as client:
        async with await client.open_session("agent-host", ttl=15) as session:
            out = await session.run(intentd.Task(key=key, execute=buy, reconcile=look_up))

``execute`` and ``reconcile`` may be coroutine functions (or plain ones,
which then run on the event loop: keep them short). The decisions are
:func:`intentd.run.plan`'s, the very ones the thread session makes; what
asyncio adds:

- The heartbeat is an asyncio task, and ``attempt.lost`` an
  ``asyncio.Event`` (``await attempt.lost.wait()`` races it against the
  work).
- Cancellation inside ``execute`` — ``task.cancel()``, ``asyncio.timeout``,
  a framework's own timeout — may come after the effect: run reports
  MarkUnknown (never Release) in a shielded task, waits for it, and lets
  the ``CancelledError`` go on. So is the give-back of a lease whose Acquire
  was cancelled in flight. A report that a cancellation interrupts (a
  Complete, say) is sent again, and the loop goes on to its end (a refused
  Complete's MarkUnknown included), in a task of its own, which a
  cancellation of the caller does not stop: intentd recognizes a report it
  already has.
- Channels belong to an event loop, so the client opens one lazily per
  running loop: a host that calls ``asyncio.run`` (or a framework's
  ``run_sync``) more than once reuses the client without "attached to a
  different loop" errors. A session belongs to the loop that opened it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import weakref
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Set, Tuple

import grpc
import grpc.aio

from intent.v1 import intent_pb2, intent_pb2_grpc

from .client import Calls, Retrying, watch_ended
from .errors import IntentdError, SessionLost, from_rpc_error
from .run import Op, Outcome, plan
from .session import Leases


def _channel_options(options: Sequence[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The channel options: the caller's, and gRPC's own retries off unless
    the caller says otherwise. Every call is retried by this library
    (:class:`intentd.client.Retrying`: every intentd call recognizes its own
    earlier effect), so gRPC's retry machinery would only cost each call
    CPU (docs/PERFORMANCE.md, "The Python library")."""
    out = list(options)
    if not any(name == "grpc.enable_retries" for name, _ in out):
        out.append(("grpc.enable_retries", 0))
    return out


class AsyncClient(Calls):
    """Calls intentd from coroutines: every method of :class:`intentd.Client`
    (``register``, ``derive_key``, ``fingerprint``, ``acquire``,
    ``complete``, …) is here with the same arguments, to be awaited, and the
    same retry policy (:class:`intentd.client.Retrying`); :meth:`watch` is
    an async iterator and :meth:`open_session` gives an
    :class:`AsyncSession`.

    Args:
        target: ``host:port`` of intentd.
        credentials: ``grpc.ChannelCredentials`` for TLS (default: plaintext).
        options: gRPC channel options; gRPC's own retries are off unless
            they name ``grpc.enable_retries`` (this client retries every
            call itself).
        interceptors: ``grpc.aio`` client interceptors.
        channel_factory: makes a ``grpc.aio.Channel`` instead of the three
            above; called once per event loop the client is used on.
        tenant, token, metadata, call_timeout, retry_timeout, backoff,
        report_timeout: as :class:`intentd.Client` takes them.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:7650",
        *,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Sequence[Tuple[str, Any]] = (),
        interceptors: Optional[Sequence[Any]] = None,
        channel_factory: Optional[Callable[[], grpc.aio.Channel]] = None,
        tenant: str = "",
        token: str = "",
        metadata: Sequence[Tuple[str, str]] = (),
        call_timeout: float = 10.0,
        retry_timeout: float = 60.0,
        backoff: Tuple[float, float] = (0.05, 2.0),
        report_timeout: float = 60.0,
    ) -> None:
        self.target = target
        self._credentials = credentials
        self._options = _channel_options(options)
        self._interceptors = list(interceptors) if interceptors else None
        self._channel_factory = channel_factory
        # One channel and stub per event loop. A channel refers to its
        # loop, so a weak key would never let go: the loops that ended are
        # dropped when a new one asks (forget_ended_loops).
        self._per_loop: Dict[asyncio.AbstractEventLoop, Tuple[grpc.aio.Channel, Any]] = {}
        self._last: Tuple[Any, Any] = (None, None)  # the last loop's (weak reference, stub): most calls come from it
        self._configure(tenant, token, metadata, call_timeout, retry_timeout, backoff, report_timeout)
        # grpc.aio turns a tuple into its Metadata on every call; one built
        # once costs less (docs/PERFORMANCE.md, "The Python library"). An
        # interceptor may change the metadata it is handed, so a channel
        # with interceptors (or from a factory, which may have them) gets
        # the tuple, and grpc.aio's copy of it, as before.
        self._call_metadata: Any = self._metadata or None
        if self._metadata and channel_factory is None and not self._interceptors:
            self._call_metadata = grpc.aio.Metadata(*self._metadata)

    def _new_channel(self) -> grpc.aio.Channel:
        if self._channel_factory is not None:
            return self._channel_factory()
        if self._credentials is not None:
            return grpc.aio.secure_channel(self.target, self._credentials, options=self._options, interceptors=self._interceptors)
        return grpc.aio.insecure_channel(self.target, options=self._options, interceptors=self._interceptors)

    @property
    def rpc(self) -> intent_pb2_grpc.IntentServiceStub:
        """The generated stub on the running loop's channel, for calls this
        class does not wrap."""
        loop = asyncio.get_running_loop()
        last_loop, stub = self._last
        if last_loop is not None and last_loop() is loop:
            return stub
        got = self._per_loop.get(loop)
        if got is None:
            forget_ended_loops(self._per_loop)
            channel = self._new_channel()
            got = (channel, intent_pb2_grpc.IntentServiceStub(channel))
            self._per_loop[loop] = got
        self._last = (weakref.ref(loop), got[1])
        return got[1]

    async def close(self) -> None:
        """Closes the running loop's channel (those of loops that ended went
        with them)."""
        got = self._per_loop.pop(asyncio.get_running_loop(), None)
        self._last = (None, None)
        if got is not None:
            await got[0].close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any, timeout: Optional[float] = None, then: Optional[Callable[[Any], Any]] = None) -> Any:
        """Sends request until intentd answers or timeout (seconds) runs out."""
        rpc = getattr(self.rpc, method)
        retrying = Retrying(self, timeout)
        while True:
            try:
                resp = await rpc(request, timeout=retrying.attempt_timeout(), metadata=self._call_metadata)
                return then(resp) if then is not None else resp
            except grpc.RpcError as e:
                wait = retrying.after(e)
            await asyncio.sleep(wait)

    async def open_session(self, worker: str, ttl: float = 0, *, timeout: Optional[float] = None) -> "AsyncSession":
        """Opens a worker session with a TTL in seconds (0: the server's
        default) and starts its heartbeat task on the running loop."""
        sent = time.monotonic()
        resp = await self._call("OpenSession", self._open_session_request(worker, ttl), timeout)
        return AsyncSession(self, resp.session_id, worker, resp.ttl.ToTimedelta().total_seconds(), sent)

    async def watch(self, request: intent_pb2.WatchRequest, *, timeout: Optional[float] = None) -> AsyncIterator[intent_pb2.WatchResponse]:
        """As :meth:`intentd.Client.watch`, as an async iterator."""
        call = self.rpc.Watch(self._watch_request(request), timeout=timeout, metadata=self._call_metadata)
        try:
            async for ev in call:
                yield ev
        except grpc.RpcError as e:
            if watch_ended(e, timeout):
                return
            raise from_rpc_error(e) from None
        finally:
            call.cancel()


def forget_ended_loops(per_loop: Dict[asyncio.AbstractEventLoop, Any]) -> None:
    """Drops what belonged to event loops that ended (closed, as
    ``asyncio.run`` leaves its loop): a host that calls ``asyncio.run`` or a
    framework's ``run_sync`` once per request would otherwise keep a
    channel, or a session, per call. A channel dropped so is closed when
    collected; a session's lease expires on the server."""
    for loop in [loop for loop in per_loop if loop.is_closed()]:
        del per_loop[loop]


class AsyncSession(Leases):
    """A worker's session on asyncio: :class:`intentd.Session`'s liveness
    rules, with the heartbeat an asyncio task and every event an
    ``asyncio.Event``. Opened by :meth:`AsyncClient.open_session`; use it
    as ``async with`` to close it."""

    def __init__(self, client: AsyncClient, session_id: str, worker: str, ttl: float, opened_at: float) -> None:
        super().__init__(session_id, worker, ttl, opened_at, asyncio.Event)
        self.client = client
        self._background: Set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        self._loop = weakref.ref(loop)
        self._beater = loop.create_task(self._beating(), name=f"intentd-heartbeat-{session_id}")

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, task: Any) -> Outcome:
        """Carries one intent through its life on this session: the
        decisions of :func:`intentd.run.plan`, with ``execute`` and
        ``reconcile`` awaited when they are coroutine functions. A
        cancellation inside them is reported as MarkUnknown, then raised.
        Only on the loop that opened the session, whose task heartbeats
        it: another loop (a second ``asyncio.run``) raises RuntimeError."""
        if asyncio.get_running_loop() is not self._loop():
            raise RuntimeError(
                f"intentd session {self.id} belongs to the event loop that opened it, and its heartbeat stops with that loop: "
                "open a session on this loop (the client can be reused; intentd.Ledger keeps a session per loop)"
            )
        return await _drive(self, task)

    async def close(self, timeout: Optional[float] = None) -> None:
        """Stops heartbeating and ends the session on the server: every lease
        it still holds becomes UNKNOWN there. Reports still under way are
        waited for first."""
        self._beater.cancel()
        try:
            await self._beater
        except asyncio.CancelledError:
            pass
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self._lose(SessionLost("session closed"))
        await self.client._call("CloseSession", intent_pb2.CloseSessionRequest(tenant=self.client.tenant, session_id=self.id), timeout)

    async def _beating(self) -> None:
        every = self._every()
        next_beat = time.monotonic() + every
        while not self.lost.is_set():
            if self._expired():
                return
            await asyncio.sleep(max(0.0, min(next_beat, self._expiry()) - time.monotonic()))
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + every
                await self._beat(every)

    async def _beat(self, every: float) -> None:
        req, sent, timeout = self._heartbeat(self.client.tenant, every)
        if timeout <= 0:
            return
        try:
            await self.client.rpc.Heartbeat(req, timeout=timeout, metadata=self.client._call_metadata)
        except grpc.RpcError as e:
            self._answered(sent, from_rpc_error(e))
            return
        self._answered(sent, None)

    def _keep(self, awaitable: Any) -> "asyncio.Task[Any]":
        """A task of its own, kept until done (and awaited by close)."""
        t = asyncio.ensure_future(awaitable)
        self._background.add(t)
        t.add_done_callback(self._background.discard)
        return t

    def _shielded(self, awaitable: Any) -> "asyncio.Future[Any]":
        """A report in a task of its own that a cancellation of the caller
        does not stop."""
        return asyncio.shield(self._keep(awaitable))


async def _drive(session: AsyncSession, task: Any) -> Outcome:
    """Drives :func:`intentd.run.plan` on an AsyncSession."""
    return await _go_on(session, plan(session, task))


async def _go_on(session: AsyncSession, steps: Any, op: Optional[Op] = None, cancelled: Optional[BaseException] = None) -> Outcome:
    """Drives steps to their end, from op when given (else from the plan's
    first). cancelled is the caller's cancellation once it came: from then
    on only the reports of what already happened go on."""
    answer: Any = None
    thrown: Optional[BaseException] = None
    while True:
        if op is None:
            try:
                op = steps.throw(thrown) if thrown is not None else steps.send(answer)
            except StopIteration as done:
                if cancelled is not None:
                    raise cancelled
                return done.value
            except BaseException as e:
                if cancelled is not None and e is not cancelled:
                    raise cancelled from e
                raise
            answer, thrown = None, None
        if cancelled is not None and not op.report and op.kind in ("call", "task", "wait"):
            # Cancelled: only the reports of what already happened go on.
            steps.close()
            raise cancelled
        current, op = op, None
        if current.kind == "task":
            answer = await _run_task(current)
            if isinstance(answer[1], asyncio.CancelledError):
                cancelled = answer[1]
            continue
        try:
            if current.kind == "call":
                send = functools.partial(getattr(session.client, current.name), *current.args, **current.kw)
                if current.report and cancelled is not None:
                    answer = await session._shielded(send())  # the caller waits for it
                else:
                    answer = await send()
            elif current.kind == "track":
                answer = session.track(*current.args)
            elif current.kind == "untrack":
                answer = session.untrack(*current.args)
            elif current.kind == "wait":
                answer = await _wait_while_held(session, *current.args)
            else:
                raise ValueError(f"unknown op {current.kind}")
        except asyncio.CancelledError as e:
            if current.report:
                # Cancelled while a report was on its way: it may or may not
                # have arrived. It is sent again (intentd recognizes a report
                # it already has) and the plan goes on to its end — a refused
                # Complete's MarkUnknown included — in a task of its own,
                # which this cancellation does not stop; the caller is told
                # at once.
                session._keep(_go_on_quietly(session, steps, current, e))
                raise
            # Into the plan: an Acquire cancelled in flight gives back the
            # lease it may have got (shielded reports), then re-raises.
            cancelled = thrown = e
        except Exception as e:
            thrown = e


async def _go_on_quietly(session: AsyncSession, steps: Any, op: Op, cancelled: BaseException) -> None:
    """_go_on for a caller that is gone: its end, an outcome or an error,
    has nobody to go to (a failed report leaves the intent to lapse into a
    reconcile, as a crash would)."""
    try:
        await _go_on(session, steps, op, cancelled)
    except BaseException:
        pass


async def _run_task(op: Op) -> Tuple[Any, Optional[BaseException]]:
    """The task's execute or reconcile, awaited when it is a coroutine; its
    exception, a cancellation included, is the answer, never raised here."""
    try:
        got = op.fn(op.attempt)  # type: ignore[misc]
        if inspect.isawaitable(got):
            got = await got
        return got, None
    except (Exception, asyncio.CancelledError) as e:
        return None, e


async def _wait_while_held(session: AsyncSession, key: str, acq: intent_pb2.AcquireResponse, deadline: float) -> None:
    """As the thread session's wait: watch the intent until it leaves
    IN_PROGRESS or deadline passes; a broken watch sleeps briefly."""
    c = session.client
    req = intent_pb2.WatchRequest(key=key, start_revision=acq.intent.revision + 1)
    try:
        async for ev in c.watch(req, timeout=max(deadline - time.monotonic(), 0.001)):
            if not ev.HasField("intent"):
                continue
            if ev.intent.state != intent_pb2.STATE_IN_PROGRESS:
                return
    except IntentdError:
        await asyncio.sleep(min(c.backoff_min, max(deadline - time.monotonic(), 0)))


__all__ = ["AsyncClient", "AsyncSession"]
