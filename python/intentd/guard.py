"""Guarded tools: an agent's side-effecting tool tied to one approved,
keyed, durable execution, for any framework's host-side seam around a tool
call (the adapters in :mod:`intentd.adapters` are thin layers over this).

A tool is declared once::

    @intentd.guarded(
        action="buy-item",
        identity=lambda ctx, args: {"conversation": ctx.conversation_id, "item": args["item"]},
        params=lambda ctx, args: {"item": args["item"], "max_eur": args["max_eur"]},
        reconcile=find_order,
    )
    async def buy_item(attempt, args):
        return await merchant.create_order(idempotency_key=attempt.operation_key("create-order"), **args)

and run through a :class:`Ledger` (an :class:`intentd.aio.AsyncClient` and
a worker session per event loop)::

    ledger = intentd.Ledger(intentd.aio.AsyncClient("127.0.0.1:7650"))
    await ledger.approve(buy_item, ctx, args)     # the host's approval step: Register
    answer = await ledger.call(buy_item, ctx, args)  # the tool call: Acquire with the approved fingerprint
    return answer.text                            # what the model reads

The key is the business identity — the action and the identity fields the
host takes from its own context and the tool's arguments, never a
tool-call id or anything the model invents — and intentd derives it. The
approved terms (``params``) are registered at approval; a call acquires
with their expected fingerprint, so arguments edited after approval fail
closed, and nothing is sent. What the model reads, by outcome:

========================  ==================================================
EXECUTE                   the tool runs once, its result is recorded
                          (Complete) and returned
completed before          intentd's statement: "already_completed … action_taken: none"
in progress elsewhere     waits up to ``wait_in_progress``, then says so
UNKNOWN, NEEDS_REVIEW     "… under human review; do not retry"
other terms               "refused: FINGERPRINT_MISMATCH … ask the user"
not approved              "refused: NOT_APPROVED … ask the user"
========================  ==================================================
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import json
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from google.protobuf import json_format

from intent.v1 import intent_pb2

from .aio import AsyncClient, AsyncSession, forget_ended_loops
from .client import Client, fill
from .errors import FingerprintMismatch, IntentNotFound
from .run import LEFT_UNKNOWN, RELEASED, Attempt, Evidence, Outcome, Task

Fields = Union[Callable[[Any, Mapping[str, Any]], Mapping[str, Any]], Sequence[str]]
"""How a tool names identity fields or approved terms: a function of the
host's context and the tool's arguments, or the names of arguments to take."""


@dataclasses.dataclass
class GuardedTool:
    """A side-effecting tool and what makes one call of it one approved
    intent. Made by :func:`guarded`."""

    action: str
    """The business action ("buy-item", "refund.issue"): part of the key."""
    identity: Fields
    """The fields that make the action distinct (the conversation, the
    order, the return authorization), from the host's context and the
    arguments: with the action, the key. Never a tool-call id."""
    params: Fields
    """The approved terms (item, amount, merchant): their fingerprint is
    what the approval binds the execution to."""
    execute: Optional[Callable[[Attempt, Mapping[str, Any]], Any]] = None
    """Performs the effect once, sending ``attempt.operation_key(...)``
    downstream; returns the tool's result (a str, a JSON-able value, or an
    ``intent.v1.Result``). May be a coroutine function. None where the
    framework's own tool is the effect (an adapter's middleware runs it, and
    the tool reads its attempt from :func:`current_attempt`)."""
    reconcile: Optional[Callable[[Attempt, Mapping[str, Any]], Any]] = None
    """Asks the provider by operation key whether an earlier attempt took
    effect: :func:`intentd.found`, :func:`intentd.absent` or
    :func:`intentd.undecided`. Without it an unknown outcome goes to a
    human."""
    summary: Optional[Callable[[Any, Mapping[str, Any]], str]] = None
    """The approver's one-line sentence, registered for reviewers."""
    name: str = ""
    """The tool's name for the model (default: the function's)."""
    wait_in_progress: float = 5.0
    """How long a call waits for another worker's attempt, in seconds."""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = getattr(self.execute, "__name__", "") or self.action

    def identity_of(self, ctx: Any, args: Mapping[str, Any]) -> Dict[str, Any]:
        return self._fields("identity", self.identity, ctx, args)

    def params_of(self, ctx: Any, args: Mapping[str, Any]) -> Dict[str, Any]:
        return self._fields("params", self.params, ctx, args)

    def _fields(self, what: str, spec: Fields, ctx: Any, args: Mapping[str, Any]) -> Dict[str, Any]:
        if callable(spec):
            return dict(spec(ctx, args))
        try:
            return {name: args[name] for name in spec}
        except KeyError as e:
            raise TypeError(f"{self.name}: no argument {e.args[0]!r}, which its {what} name; the call's arguments: {sorted(args)}") from None


def guarded(
    *,
    action: str,
    identity: Fields,
    params: Fields,
    reconcile: Optional[Callable[[Attempt, Mapping[str, Any]], Any]] = None,
    summary: Optional[Callable[[Any, Mapping[str, Any]], str]] = None,
    name: str = "",
    wait_in_progress: float = 5.0,
) -> Callable[[Callable[[Attempt, Mapping[str, Any]], Any]], GuardedTool]:
    """Declares a guarded tool around ``execute(attempt, args)``; see
    :class:`GuardedTool` for the fields."""

    def wrap(execute: Callable[[Attempt, Mapping[str, Any]], Any]) -> GuardedTool:
        return GuardedTool(action, identity, params, execute, reconcile, summary, name, wait_in_progress)

    return wrap


_attempt: "contextvars.ContextVar[Optional[Attempt]]" = contextvars.ContextVar("intentd_attempt", default=None)


def current_attempt() -> Attempt:
    """The attempt a guarded call is executing under, for a framework's own
    tool function run by an adapter: send ``current_attempt().operation_key(
    "create-order")`` downstream. Raises LookupError outside a guarded call."""
    att = _attempt.get()
    if att is None:
        raise LookupError("not inside a guarded tool call: run the tool through intentd's adapter")
    return att


@dataclasses.dataclass
class Terms:
    """One call's intent: its key and the fingerprint of its terms, as
    intentd derives them."""

    key: str
    fingerprint: str
    identity: Dict[str, Any]
    params: Dict[str, Any]


@dataclasses.dataclass
class Answer:
    """What a guarded call came to. ``text`` is for the model; the rest is
    for the host."""

    text: str
    status: str
    """``executed``, ``replayed``, ``in_progress``, ``under_review``,
    ``failed``, ``not_done``, ``refused`` (``reason`` says which), or the
    statement's status of a final intent (``cancelled``, ``expired``)."""
    key: str
    executed: bool = False
    """True when this call ran the tool."""
    value: Any = None
    """The tool's return value, when this call ran it."""
    reason: str = ""
    """For ``refused``: ``FINGERPRINT_MISMATCH`` or ``NOT_APPROVED``."""
    outcome: Optional[Outcome] = None

    def __str__(self) -> str:
        return self.text


class Ledger:
    """Runs guarded tools on intentd: one :class:`intentd.aio.AsyncClient`
    and a worker session per running event loop (opened at first use,
    opened again when lost). Safe for one host calling ``asyncio.run`` or a
    framework's ``run_sync`` many times."""

    def __init__(self, client: AsyncClient, *, worker: str = "agent-host", ttl: float = 15) -> None:
        if isinstance(client, Client):
            raise TypeError("intentd.Ledger runs on asyncio: give it an intentd.aio.AsyncClient, not an intentd.Client")
        self.client = client
        self.worker = worker
        self.ttl = ttl
        # A session refers to its loop: the loops that ended are dropped
        # when a new one asks, as the client's channels are.
        self._sessions: Dict[asyncio.AbstractEventLoop, Tuple[asyncio.Lock, list]] = {}
        self._terms: Dict[str, Terms] = {}

    async def session(self) -> AsyncSession:
        """The running loop's worker session."""
        loop = asyncio.get_running_loop()
        slot = self._sessions.get(loop)
        if slot is None:
            forget_ended_loops(self._sessions)
            slot = (asyncio.Lock(), [])
            self._sessions[loop] = slot
        lock, held = slot
        async with lock:
            if not held or held[0].lost.is_set():
                held[:] = [await self.client.open_session(self.worker, ttl=self.ttl)]
            return held[0]

    async def close(self) -> None:
        """Closes the running loop's session."""
        slot = self._sessions.pop(asyncio.get_running_loop(), None)
        if slot is not None and slot[1] and not slot[1][0].lost.is_set():
            await slot[1][0].close()

    async def terms(self, tool: GuardedTool, ctx: Any, args: Mapping[str, Any]) -> Terms:
        """The key and fingerprint of a call, from one DeriveKey (kept for
        the same fields: a pure function of them)."""
        identity, params = tool.identity_of(ctx, args), tool.params_of(ctx, args)
        memo = json.dumps([tool.action, identity, params], sort_keys=True, default=str)
        got = self._terms.get(memo)
        if got is None:
            req = intent_pb2.DeriveKeyRequest(action=tool.action)
            fill(req.identity, identity, f"{tool.name}'s identity")
            fill(req.params, params, f"{tool.name}'s params")
            resp = await self.client._call("DeriveKey", req)
            got = Terms(resp.key, resp.fingerprint, identity, params)
            if len(self._terms) > 4096:
                self._terms.clear()
            self._terms[memo] = got
        return got

    async def approve(self, tool: GuardedTool, ctx: Any, args: Mapping[str, Any], *, summary: str = "") -> Terms:
        """The host's approval step: registers these terms as the approved
        intent (idempotent; other terms for the same identity raise
        :class:`intentd.FingerprintMismatch`)."""
        terms = await self.terms(tool, ctx, args)
        if not summary and tool.summary is not None:
            summary = tool.summary(ctx, args)
        await self.client.register("", terms.params, action=tool.action, identity=terms.identity, summary=summary[:200])
        return terms

    async def call(
        self, tool: GuardedTool, ctx: Any, args: Mapping[str, Any], *, execute: Optional[Callable[[Attempt], Any]] = None
    ) -> Answer:
        """The tool call: acquires the intent with the fingerprint of these
        arguments' terms and answers as the module doc says. ``execute``
        (the attempt → the result) stands in for ``tool.execute``, as an
        adapter runs the framework's own tool. A cancellation while the tool
        runs is reported as unknown and raised."""
        if execute is None and tool.execute is None:
            raise ValueError(f"guarded tool {tool.name} has no execute: pass execute= (its adapter does)")
        terms = await self.terms(tool, ctx, args)
        ran: Dict[str, Any] = {}
        effect = execute if execute is not None else (lambda att: tool.execute(att, args))  # type: ignore[misc]

        async def execute_once(att: Attempt) -> intent_pb2.Result:
            token = _attempt.set(att)
            try:
                value = effect(att)
                if inspect.isawaitable(value):
                    value = await value
            finally:
                _attempt.reset(token)
            ran["value"] = value
            return to_result(value)

        async def reconcile(att: Attempt) -> Evidence:
            got = tool.reconcile(att, args)  # type: ignore[misc]
            return await got if inspect.isawaitable(got) else got

        task = Task(
            key=terms.key,
            execute=execute_once,
            reconcile=reconcile if tool.reconcile is not None else None,
            expected_fingerprint=terms.fingerprint,
            wait_in_progress=tool.wait_in_progress,
        )
        session = await self.session()
        try:
            out = await session.run(task)
        except FingerprintMismatch:
            approved = await self._approved_params(terms.key)
            return Answer(
                f"refused: FINGERPRINT_MISMATCH: {tool.name} was approved with other terms ({_json(approved)}) than these "
                f"({_json(terms.params)}); nothing was sent. Ask the user to approve the new terms, or call it with the approved ones.",
                "refused", terms.key, reason="FINGERPRINT_MISMATCH",
            )
        except IntentNotFound:
            return Answer(
                f"refused: NOT_APPROVED: {tool.name} with these terms ({_json(terms.params)}) has not been approved; "
                "nothing was sent. Ask the user to approve it first.",
                "refused", terms.key, reason="NOT_APPROVED",
            )
        return answer(tool, terms, out, ran)

    async def _approved_params(self, key: str) -> Any:
        try:
            intent = await self.client.get(key)
        except IntentNotFound:
            return None
        return _whole(json.loads(_struct_json(intent.params)))


def to_result(value: Any) -> intent_pb2.Result:
    """A tool's return value as the Result intentd records: an
    ``intent.v1.Result`` as it is; anything else as its JSON payload, with
    the scalar fields of a mapping as external references (which replays
    name)."""
    if isinstance(value, intent_pb2.Result):
        return value
    r = intent_pb2.Result(payload=json.dumps(value, default=str).encode())
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(v, (str, int, float, bool)):
                r.external_refs[str(k)] = str(v)
    return r


def answer(tool: GuardedTool, terms: Terms, out: Outcome, ran: Mapping[str, Any]) -> Answer:
    """The words for the model of one run's outcome."""
    O = intent_pb2
    key, said = terms.key, out.statement.text if out.statement is not None else ""
    if out.name == LEFT_UNKNOWN or out.outcome == O.OUTCOME_NEEDS_REVIEW:
        why = f" ({type(out.error).__name__}: {out.error})" if out.error is not None else ""
        return Answer(
            f"under_review: {tool.name} may or may not have taken effect{why}; it is under human review; do not retry, "
            "and tell the user a person will confirm it.",
            "under_review", key, executed=out.executed, outcome=out,
        )
    if out.name == RELEASED:
        return Answer(
            f"not_done: {tool.name} was not carried out ({out.error}); nothing was sent. You may call it again.",
            "not_done", key, executed=out.executed, outcome=out,
        )
    if out.outcome == O.OUTCOME_COMPLETED:
        if out.executed and "value" in ran:
            value = ran["value"]
            text = value if isinstance(value, str) else _json(value)
            return Answer(text, "executed", key, executed=True, value=value, outcome=out)
        if said:
            return Answer(said, "replayed", key, outcome=out)
        refs = dict(out.result.external_refs)
        return Answer(
            f"already_completed: {tool.name} had taken effect in an earlier attempt{' with ' + _json(refs) if refs else ''}; "
            "it was recorded, not repeated; action_taken: none",
            "replayed", key, outcome=out,
        )
    if out.outcome == O.OUTCOME_IN_PROGRESS:
        return Answer(
            f"in_progress: {tool.name} is being carried out by another worker and was not started again; do not retry now, "
            f"check again later. ({said})",
            "in_progress", key, outcome=out,
        )
    if out.outcome == O.OUTCOME_FAILED:
        if out.executed and out.error is not None:
            f = out.intent.failure
            return Answer(f"failed: {tool.name} failed for good ({f.code}: {f.message}); do not retry with the same terms.",
                          "failed", key, executed=True, outcome=out)
        return Answer(said or f"already_failed: {tool.name} failed before; action_taken: none", "failed", key, outcome=out)
    status = out.statement.status if out.statement is not None and out.statement.status else out.name.lower()
    return Answer(said or f"{status}: {tool.name} was not carried out", status, key, outcome=out)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _whole(v: Any) -> Any:
    """A Struct's numbers come back as doubles: 89.0 reads as 89, as it was approved."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return int(v)
    if isinstance(v, dict):
        return {k: _whole(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_whole(x) for x in v]
    return v


def _struct_json(s: Any) -> str:
    return json_format.MessageToJson(s)


__all__ = ["Answer", "GuardedTool", "Ledger", "Terms", "answer", "current_attempt", "guarded", "to_result"]
