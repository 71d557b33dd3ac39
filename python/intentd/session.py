"""Session: a worker's liveness, heartbeated in a background thread; Leases,
its bookkeeping, which the asyncio session shares."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import grpc

from intent.v1 import intent_pb2

from .errors import SessionLost, SessionNotFound, StaleToken, from_rpc_error
from .run import Outcome, Task
from .run import run as _run

if TYPE_CHECKING:
    from .client import Client


class _Held:
    __slots__ = ("token", "lost")

    def __init__(self, token: int, lost: Any) -> None:
        self.token = token
        self.lost = lost


class Leases:
    """What a session knows of its liveness, kept the same way by the thread
    session (:class:`Session`) and the asyncio one
    (:class:`intentd.aio.AsyncSession`): the leases it names in heartbeats,
    when it was last confirmed alive, and whether it is lost. ``event``
    makes the events that are set on a loss (``threading.Event`` or
    ``asyncio.Event``)."""

    def __init__(self, session_id: str, worker: str, ttl: float, opened_at: float, event: Callable[[], Any]) -> None:
        self.id = session_id
        """The session id intentd knows it by."""
        self.worker = worker
        self.ttl = ttl
        """The session's time to live without a heartbeat, in seconds."""
        self._event = event
        self.lost = event()
        """Set when the session is lost; :attr:`error` says why."""
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._held: Dict[str, _Held] = {}
        self._last_ok = opened_at
        self._callbacks: List[Callable[[BaseException], None]] = []

    def on_lost(self, callback: Callable[[BaseException], None]) -> None:
        """Calls callback(error) once when the session is lost (at once if it already is)."""
        with self._lock:
            if self.error is None:
                self._callbacks.append(callback)
                return
            err = self.error
        callback(err)

    def track(self, key: str, token: int) -> Any:
        """Starts naming a lease in heartbeats; the event is set when the
        lease is lost (superseded, or the session lost)."""
        h = _Held(token, self._event())
        with self._lock:
            if self.error is not None:
                h.lost.set()
                return h.lost
            old = self._held.get(key)
            if old is not None:
                old.lost.set()
            self._held[key] = h
        return h.lost

    def untrack(self, key: str, token: int) -> None:
        """Stops naming a lease (it was reported on)."""
        with self._lock:
            h = self._held.get(key)
            if h is not None and h.token == token:
                del self._held[key]

    def _lose(self, err: BaseException) -> None:
        with self._lock:
            if self.error is not None:
                return
            self.error = err
            for h in self._held.values():
                h.lost.set()
            self._held.clear()
            callbacks, self._callbacks = self._callbacks, []
            self.lost.set()
        for cb in callbacks:
            cb(err)

    def _expiry(self) -> float:
        with self._lock:
            return self._last_ok + self.ttl

    def _every(self) -> float:
        """How often to heartbeat: every TTL/3."""
        return max(self.ttl / 3, 0.1)

    def _heartbeat(self, tenant: str, every: float) -> Tuple[intent_pb2.HeartbeatRequest, float, float]:
        """The next heartbeat naming the tracked leases, when it is sent, and
        its deadline in seconds: it gives up when the session would expire
        before the answer (a deadline ≤ 0: do not send). Not retried: the
        next beat is the retry."""
        with self._lock:
            req = intent_pb2.HeartbeatRequest(tenant=tenant, session_id=self.id)
            for key, h in self._held.items():
                req.leases.add(key=key, token=h.token)
            expiry = self._last_ok + self.ttl
        sent = time.monotonic()
        return req, sent, min(sent + every, expiry) - sent

    def _answered(self, sent: float, err: Optional[BaseException]) -> None:
        """Takes in a heartbeat's answer (err None: confirmed)."""
        if err is None:
            with self._lock:
                self._last_ok = sent
        elif isinstance(err, StaleToken):
            # The session is alive (intentd keeps it so before checking),
            # but a lease was superseded: that attempt must stop.
            key = err.statement.intent_key if err.statement is not None else ""
            with self._lock:
                self._last_ok = sent
                for k in [k for k, h in self._held.items() if h.token < err.current_token and (not key or k == key)]:
                    self._held.pop(k).lost.set()
        elif isinstance(err, SessionNotFound):
            self._lose(err)

    def _expired(self) -> bool:
        """True (and the session lost) once no heartbeat was confirmed for a
        whole TTL, counted from the sending of the last confirmed one."""
        if time.monotonic() >= self._expiry():
            self._lose(SessionLost("no heartbeat confirmed within the session TTL"))
            return True
        return False


class Session(Leases):
    """A worker's session: the unit of liveness of every lease it holds.

    Opened by :meth:`Client.open_session`. A daemon thread heartbeats every
    TTL/3, naming the leases the session tracks. A lease found superseded is
    lost at once (its :class:`Attempt` sees ``lost`` set); when the session
    itself is gone — SESSION_NOT_FOUND, :meth:`close`, or no heartbeat
    confirmed for a whole TTL — every lease is lost, :attr:`lost` is set and
    the :meth:`on_lost` callbacks run. The TTL is counted from the *sending*
    of the last heartbeat intentd confirmed (etcd restarts it later than
    that, never earlier), so the worker gives up its leases no later than
    etcd can expire them. Use it as a context manager to close it.
    """

    def __init__(self, client: "Client", session_id: str, worker: str, ttl: float, opened_at: float) -> None:
        super().__init__(session_id, worker, ttl, opened_at, threading.Event)
        self.client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beating, name=f"intentd-heartbeat-{session_id}", daemon=True)
        self._thread.start()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, task: "Task") -> "Outcome":
        """Carries one intent through its life on this session; see :func:`intentd.run.run`."""
        return _run(self, task)

    def close(self, timeout: Optional[float] = None) -> None:
        """Stops heartbeating and ends the session on the server: every lease
        it still holds becomes UNKNOWN there ("I stopped", never "I did
        nothing")."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._lose(SessionLost("session closed"))
        self.client._call("CloseSession", intent_pb2.CloseSessionRequest(tenant=self.client.tenant, session_id=self.id), timeout)

    def _beating(self) -> None:
        """Runs until the session is lost or close() is called."""
        every = self._every()
        next_beat = time.monotonic() + every
        while not self.lost.is_set():
            if self._expired():
                return
            now = time.monotonic()
            if self._stop.wait(max(0.0, min(next_beat, self._expiry()) - now)):
                return
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + every
                self._beat(every)

    def _beat(self, every: float) -> None:
        req, sent, timeout = self._heartbeat(self.client.tenant, every)
        if timeout <= 0:
            return
        try:
            self.client.rpc.Heartbeat(req, timeout=timeout, metadata=self.client._metadata)
        except grpc.RpcError as e:
            self._answered(sent, from_rpc_error(e))
            return
        self._answered(sent, None)
