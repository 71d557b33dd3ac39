"""run: the safe claim → act → report loop, with the Go client's decisions.

:meth:`Session.run` executes an intent only when intentd says EXECUTE, which
it says once per approval (and again only after a confirmed absence). A
completed intent's stored result is returned without executing. The task's
``execute`` runs under a lease the session heartbeats; the moment the lease
is lost, ``attempt.lost`` is set (Python cannot interrupt a call: long
work should check it). Its outcome is reported under the lease's token:
a result → Complete; :class:`Final` → Fail; :class:`NotAttempted` → Release;
any other exception (a timeout, a reset) → MarkUnknown — never a fresh
attempt. The next worker then gets RECONCILE and must ask the downstream
system, by the same operation key, what happened: :func:`found` → Complete,
:func:`absent` → Release and execute, :func:`undecided` → Escalate to a
human. Reports are retried while intentd does not answer, under the same
token, for up to the client's ``report_timeout``: an effect that happened
gets recorded. A report refused as STALE_TOKEN (another worker or a
reviewer took over) makes run acquire again, a bounded number of times, to
learn what became of the intent; ``Outcome.superseded`` then says so.

A report's free text (a reason, a failure's code and message) is cut to
intentd's limits, which are in UTF-8 bytes. A report intentd refuses for
its content (:class:`InvalidField`) does not leave the lease held for as
long as the session lives: after execute, a refused Complete (a payload
over 256 KiB, more than 32 external refs, a ref over 256 bytes) becomes
MarkUnknown under the same token, reason "the result could not be
recorded: <the refusal>", and a refused Fail (an empty :class:`Final` code)
MarkUnknown, "the failure could not be recorded: <the refusal>": the
outcome is ``LEFT_UNKNOWN`` (NEEDS_REVIEW when that MarkUnknown reached
max_attempts) with the refusal as ``Outcome.error``, and the next worker
reconciles. After :func:`found`, a refused Complete becomes Escalate under
the same token, "found downstream, but the result could not be recorded:
<the refusal>": NEEDS_REVIEW, with the refusal as ``Outcome.error``.

When execute raises, the outcome is named for what run left behind, not for
an API answer: ``LEFT_UNKNOWN`` (MarkUnknown: the effect may have happened,
and the next worker reconciles; also after a report that could not be
recorded, above) or ``RELEASED`` (NotAttempted: back to PENDING, the next
Acquire executes). ``str(outcome)`` says it in a sentence.

What it cannot guarantee: intentd decides who may act; it cannot stop an act
already under way. A worker paused past its lease may still reach the
provider after another worker took over. What keeps that from becoming a
second order is the provider: it must deduplicate on the operation key
(``attempt.operation_key("create-order")``, the same for every attempt and
worker), or check the fencing token ``attempt.token``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Generator, List, Optional, Tuple

from intent.v1 import intent_pb2

from .ids import new_request_id
from .errors import IntentdError, InvalidField, LeaseLost, SessionLost, StaleToken, Unavailable

if TYPE_CHECKING:
    from .session import Session

Outcomes = intent_pb2.Outcome
# The outcomes as module constants: the plan compares with them on every
# cycle, and the enum wrapper's attribute lookup is slow.
_EXECUTE, _RECONCILE, _IN_PROGRESS = intent_pb2.OUTCOME_EXECUTE, intent_pb2.OUTCOME_RECONCILE, intent_pb2.OUTCOME_IN_PROGRESS

# How often one run re-acquires after its lease was superseded, so that two
# parties cannot bounce an intent forever.
MAX_TAKEOVERS = 3

# The names of the outcomes run makes itself (Outcome.name): the API has no
# outcome for an intent a worker handed back, so Outcome.outcome is
# OUTCOME_UNSPECIFIED for both, as it always was.
LEFT_UNKNOWN = "LEFT_UNKNOWN"
"""execute raised after it may have acted: MarkUnknown; the next worker reconciles."""
RELEASED = "RELEASED"
"""execute raised NotAttempted: Release, back to PENDING; the next Acquire executes."""


class Final(Exception):
    """Raise from execute for a definite failure (a declined card): the intent FAILS for good."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"final failure {code}: {message}")
        self.code = code
        self.message = message


class NotAttempted(Exception):
    """Raise from execute when nothing was sent downstream: the intent returns to PENDING."""


@dataclasses.dataclass
class Evidence:
    """What reconcile found out; make one with :func:`found`, :func:`absent` or :func:`undecided`."""

    verdict: str
    result: Optional[intent_pb2.Result] = None
    reason: str = ""


def found(result: intent_pb2.Result) -> Evidence:
    """The effect exists downstream; result records it (the order id, as external refs)."""
    return Evidence("found", result=result)


def absent(reason: str) -> Evidence:
    """The downstream system confirmed the effect does not exist: execute again, with the same operation keys."""
    return Evidence("absent", reason=reason)


def undecided(reason: str) -> Evidence:
    """The answer cannot be told: a human decides."""
    return Evidence("undecided", reason=reason)


@dataclasses.dataclass
class Attempt:
    """The caller's lease on an intent while execute or reconcile runs."""

    key: str
    """The intent's key."""
    token: int
    """The lease's fencing token: send it to resources that check tokens."""
    reconciling: bool
    """True in reconcile: an earlier attempt may have taken effect."""
    intent: intent_pb2.Intent
    """The intent as acquired: its params are the approved terms."""
    lost: Any
    """Set the moment the lease is lost: stop, the report will say so (a
    ``threading.Event``; an ``asyncio.Event`` under :mod:`intentd.aio`)."""
    children: List[intent_pb2.RegisterRequest] = dataclasses.field(default_factory=list)

    def operation_key(self, operation: str) -> str:
        """``<key>:<operation>``, the idempotency key to send downstream for
        one kind of call: the same for every attempt and worker, which is
        what makes a retry a retry. The model never invents it."""
        return f"{self.key}:{operation}"

    def register_child(self, child: intent_pb2.RegisterRequest) -> None:
        """Registers child in the same transaction as this attempt's Complete (the outbox)."""
        self.children.append(child)


@dataclasses.dataclass
class Task:
    """One intent to carry through its life with :meth:`Session.run`.

    Any object with these attributes will do (``execute`` and ``reconcile``
    as methods, for instance).
    """

    key: str
    execute: Callable[[Attempt], intent_pb2.Result]
    """Performs the side effect, once, under the attempt's lease, sending
    ``attempt.operation_key(...)`` downstream as the idempotency key."""
    reconcile: Optional[Callable[[Attempt], Evidence]] = None
    """Asks the downstream system, by operation key, whether an earlier
    attempt took effect. None escalates every RECONCILE; an exception leaves
    the intent UNKNOWN for the next reconcile."""
    register: Optional[intent_pb2.RegisterRequest] = None
    """Registers the intent in the same transaction as the first Acquire."""
    expected_fingerprint: str = ""
    """When set, must equal the stored fingerprint."""
    wait_in_progress: float = 30.0
    """How long to wait for another worker's attempt to finish, in seconds."""


@dataclasses.dataclass
class Outcome:
    """How run left the intent: ``name`` says it in a word, ``str()`` in a
    sentence."""

    outcome: int
    """COMPLETED, FAILED, CANCELLED, IN_PROGRESS, NEEDS_REVIEW (escalated,
    or this run's MarkUnknown was one attempt too many: see
    ``intent.attempts``) or EXPIRED (``intent_pb2.OUTCOME_*``), or
    OUTCOME_UNSPECIFIED when this run handed the intent back, UNKNOWN or
    PENDING: ``name`` is then LEFT_UNKNOWN or RELEASED (see ``error``)."""
    intent: intent_pb2.Intent
    """The intent as run last saw it."""
    executed: bool = False
    """True when this run called execute."""
    superseded: bool = False
    """True when a lease of this run was taken over: its report was kept as evidence only."""
    statement: Optional[intent_pb2.Statement] = None
    """intentd's account of the last Acquire (``statement.text`` for a model)."""
    error: Optional[BaseException] = None
    """Why the intent was left UNKNOWN or PENDING: the task's exception, or
    the :class:`InvalidField` refusal of a Complete or Fail that could not be
    recorded (also for the NEEDS_REVIEW of a found result that could not)."""
    lease_lost: bool = False
    """True when the lease was lost while the task ran and nobody took over."""

    @property
    def result(self) -> intent_pb2.Result:
        """The stored result of a COMPLETED intent."""
        return self.intent.result

    @property
    def left_unknown(self) -> bool:
        """True when execute (or reconcile) raised after it may have acted,
        or its Complete or Fail was refused for its content, and run
        reported MarkUnknown: the intent is UNKNOWN, and the next worker
        reconciles, never executes blindly."""
        return self.outcome == Outcomes.OUTCOME_UNSPECIFIED and self.intent.state == intent_pb2.STATE_UNKNOWN

    @property
    def released(self) -> bool:
        """True when execute raised :class:`NotAttempted` and run reported
        Release: the intent is PENDING again, and the next Acquire
        executes it."""
        return self.outcome == Outcomes.OUTCOME_UNSPECIFIED and self.intent.state == intent_pb2.STATE_PENDING

    @property
    def name(self) -> str:
        """The outcome in a word: the enum name of ``outcome``
        (``"OUTCOME_COMPLETED"``), or, for an intent this run handed back,
        ``"LEFT_UNKNOWN"`` or ``"RELEASED"``. Only the enum names are API
        words; those two are run's."""
        if self.left_unknown:
            return LEFT_UNKNOWN
        if self.released:
            return RELEASED
        return Outcomes.Name(self.outcome)

    def __str__(self) -> str:
        state = intent_pb2.State.Name(self.intent.state).removeprefix("STATE_")
        s = f"{self.name}: intent {self.intent.key} is {state}"
        err = f"{type(self.error).__name__}: {self.error}" if self.error is not None else ""
        if self.left_unknown:
            s += f" after {err or 'an error'}; it may have taken effect, so the next worker reconciles (asks the provider by operation key) instead of executing again"
        elif self.released:
            s += f" again after {err or 'NotAttempted'}; nothing was sent, so the next Acquire executes it"
        elif err:
            s += f" ({err})"
        if self.executed:
            s += "; this run executed it"
        if self.superseded:
            s += "; another worker or a reviewer took over a lease of this run"
        if self.lease_lost:
            s += "; the lease was lost while the task ran"
        return s

    def __repr__(self) -> str:
        fields = [f"name={self.name!r}", f"key={self.intent.key!r}", f"state={intent_pb2.State.Name(self.intent.state)!r}",
                  f"executed={self.executed}", f"superseded={self.superseded}"]
        if self.error is not None:
            fields.append(f"error={self.error!r}")
        if self.lease_lost:
            fields.append("lease_lost=True")
        return f"Outcome({', '.join(fields)})"


# The plan: run's decisions, written once, without I/O. It is a generator
# that yields the operations it needs (an Op) and is sent each one's
# answer, or has its exception thrown in; run below drives it with the
# thread Session, intentd.aio with the asyncio one, so both decide alike.


@dataclasses.dataclass
class Op:
    """One operation the plan needs done, and what the driver sends back."""

    kind: str
    """``call`` (a client method: ``name``, ``args``, ``kw``; sends its
    response, throws its error), ``task`` (``fn(attempt)``, the task's
    execute or reconcile: sends ``(value, None)`` or ``(None, exception)``,
    never throws), ``track`` / ``untrack`` (the session's, with ``args``),
    or ``wait`` (while the intent is IN_PROGRESS: ``args`` are the key, the
    AcquireResponse and the monotonic deadline)."""
    name: str = ""
    args: tuple = ()
    kw: dict = dataclasses.field(default_factory=dict)
    fn: Optional[Callable[[Attempt], Any]] = None
    attempt: Optional[Attempt] = None
    report: bool = False
    """True for a report after the task ran (Complete, Fail, Release,
    MarkUnknown, Escalate, and the give-back of an unwanted lease): it must
    reach intentd even when the caller is cancelled meanwhile."""


def _call(name: str, *args: Any, report: bool = False, **kw: Any) -> Op:
    return Op("call", name=name, args=args, kw=kw, report=report)


Plan = Generator[Op, Any, Outcome]


def plan(session: Any, task: Any) -> Plan:
    """run's decisions for one task on session (anything with ``id``,
    ``error`` and ``client``): acquire; if done, the stored result without
    executing; if another worker holds it, wait up to
    ``task.wait_in_progress``; if an earlier attempt's outcome is unknown,
    reconcile; otherwise execute once and report. It never executes on a
    doubt."""
    deadline = time.monotonic() + getattr(task, "wait_in_progress", 30.0)
    executed = superseded = False
    takeovers = 0
    prev: Optional[BaseException] = None
    while True:
        if session.error is not None:
            # A lost session would hand out leases it cannot keep.
            raise prev or session.error
        acq = yield from _acquire(session, task)
        out: Optional[Outcome] = None
        try:
            if acq.outcome == _EXECUTE:
                executed = True
                out = yield from _execute(session, task, acq)
            elif acq.outcome == _RECONCILE:
                out = yield from _reconcile(session, task, acq)
                if out is None:
                    continue  # confirmed absent: acquire again and execute
            elif acq.outcome == _IN_PROGRESS and time.monotonic() < deadline:
                yield Op("wait", args=(task.key, acq, deadline))
                continue
            else:  # final, needs review, expired, or still in progress: nothing to do
                out = Outcome(acq.outcome, acq.intent, statement=acq.statement)
        except StaleToken as e:
            # Someone took over: acquire again to learn what became of the intent.
            if takeovers >= MAX_TAKEOVERS:
                raise
            superseded, takeovers, prev = True, takeovers + 1, e
            continue
        out.executed, out.superseded = executed, superseded
        return out


def run(session: "Session", task: Any) -> Outcome:
    """Carries one intent through its life on session (see :func:`plan`
    for the decisions). Refusals raise their :mod:`intentd.errors` class; a
    lost session raises :class:`SessionLost`."""
    steps = plan(session, task)
    answer: Any = None
    thrown: Optional[BaseException] = None
    while True:
        try:
            op = steps.throw(thrown) if thrown is not None else steps.send(answer)
        except StopIteration as done:
            return done.value
        answer, thrown = None, None
        if op.kind == "task":
            try:
                answer = (op.fn(op.attempt), None)
            except Exception as e:  # the task's failure decides the report
                answer = (None, e)
            continue
        try:
            answer = _perform(session, op)
        except Exception as e:
            thrown = e


def _perform(session: "Session", op: Op) -> Any:
    if op.kind == "call":
        return getattr(session.client, op.name)(*op.args, **op.kw)
    if op.kind == "track":
        return session.track(*op.args)
    if op.kind == "untrack":
        return session.untrack(*op.args)
    if op.kind == "wait":
        return _wait_while_held(session, *op.args)
    raise ValueError(f"unknown op {op.kind}")


def _acquire(session: Any, task: Any) -> Generator[Op, Any, intent_pb2.AcquireResponse]:
    """Sends Acquire. If intentd stops answering before the reply arrives
    (or the caller is cancelled meanwhile), the lease may have been issued
    all the same: it asks once more with the same request id, within the
    report timeout, and gives back a lease it got (Release for EXECUTE,
    MarkUnknown for RECONCILE), so the intent is not held by a worker that
    is not working on it."""
    c = session.client
    rid = new_request_id()
    kw = dict(request_id=rid, expected_fingerprint=getattr(task, "expected_fingerprint", ""), register=getattr(task, "register", None))
    try:
        return (yield _call("acquire", task.key, session.id, **kw))
    except (Unavailable, asyncio.CancelledError):
        try:
            got = yield _call("acquire", task.key, session.id, timeout=c.report_timeout, report=True, **kw)
        except IntentdError:
            got = None
        if got is not None and got.lease.session_id == session.id:
            if got.outcome == Outcomes.OUTCOME_EXECUTE:
                yield _call("release", task.key, got.lease.token, "caller gave up before acting", timeout=c.report_timeout, report=True)
            elif got.outcome == Outcomes.OUTCOME_RECONCILE:
                yield _call("mark_unknown", task.key, got.lease.token, "caller gave up before reconciling", timeout=c.report_timeout, report=True)
        raise


def _attempt(session: Any, key: str, acq: intent_pb2.AcquireResponse, reconciling: bool) -> Generator[Op, Any, Attempt]:
    token = acq.lease.token
    lost = yield Op("track", args=(key, token))
    return Attempt(key=key, token=token, reconciling=reconciling, intent=acq.intent, lost=lost)


def _under_lease(att: Attempt, fn: Callable[[Attempt], Any]) -> Generator[Op, Any, Tuple[Any, Optional[BaseException]]]:
    """Runs fn(att) with att.lost tracking the lease; a lease already lost
    (the session was lost meanwhile) does not run fn at all."""
    if att.lost.is_set():
        got: Tuple[Any, Optional[BaseException]] = (None, NotAttempted("lease lost before it started"))
    else:
        got = yield Op("task", fn=fn, attempt=att)
    yield Op("untrack", args=(att.key, att.token))
    return got


def _execute(session: Any, task: Any, acq: intent_pb2.AcquireResponse) -> Generator[Op, Any, Outcome]:
    c, key = session.client, task.key
    att = yield from _attempt(session, key, acq, reconciling=False)
    result, err = yield from _under_lease(att, task.execute)
    lost, t, rt = att.lost.is_set(), att.token, c.report_timeout
    try:
        if err is None:
            try:
                resp = yield _call("complete", key, t, result if result is not None else intent_pb2.Result(), children=att.children, timeout=rt, report=True)
            except InvalidField as refused:
                # execute may have acted, and its result cannot be recorded
                # as it is (too large, too many refs): hand the intent back
                # UNKNOWN rather than hold the lease while the session lives.
                return (yield from _unrecorded(key, t, rt, "the result could not be recorded", refused, lost))
            return Outcome(Outcomes.OUTCOME_COMPLETED, resp.intent, lease_lost=lost)
        if isinstance(err, Final):
            try:
                resp = yield _call("fail", key, t, err.code, err.message, timeout=rt, report=True)
            except InvalidField as refused:  # a bad code (an empty one)
                return (yield from _unrecorded(key, t, rt, "the failure could not be recorded", refused, lost))
            return Outcome(Outcomes.OUTCOME_FAILED, resp.intent, error=err, lease_lost=lost)
        if isinstance(err, NotAttempted):
            resp = yield _call("release", key, t, f"not attempted: {err}", timeout=rt, report=True)
        else:
            # Anything else — a timeout, a reset, a cancellation — may have
            # happened after the effect: UNKNOWN, never a Release.
            resp = yield _call("mark_unknown", key, t, _reason(err), timeout=rt, report=True)
            return Outcome(_marked_unknown(resp.intent), resp.intent, error=err, lease_lost=lost)
    except IntentdError as rerr:
        raise _lease_err(lost, rerr) from rerr
    return Outcome(Outcomes.OUTCOME_UNSPECIFIED, resp.intent, error=err, lease_lost=lost)


def _unrecorded(key: str, token: int, rt: float, what: str, refused: InvalidField, lost: bool) -> Generator[Op, Any, Outcome]:
    """After execute, a report intentd refused for its content: MarkUnknown
    under the same token (the next worker reconciles), with the refusal as
    the reason and as the outcome's error."""
    resp = yield _call("mark_unknown", key, token, f"{what}: {refused}", timeout=rt, report=True)
    return Outcome(_marked_unknown(resp.intent), resp.intent, error=refused, lease_lost=lost)


def _reason(err: BaseException) -> str:
    if isinstance(err, asyncio.CancelledError):
        return f"cancelled while executing ({type(err).__name__}{': ' + str(err) if str(err) else ''}): it may have taken effect"
    return f"{type(err).__name__}: {err}"


def _marked_unknown(intent: intent_pb2.Intent) -> int:
    """The outcome of an accepted MarkUnknown: UNSPECIFIED (left UNKNOWN), or
    NEEDS_REVIEW when that attempt reached the intent's max_attempts."""
    if intent.state == intent_pb2.STATE_NEEDS_REVIEW:
        return Outcomes.OUTCOME_NEEDS_REVIEW
    return Outcomes.OUTCOME_UNSPECIFIED


def _reconcile(session: Any, task: Any, acq: intent_pb2.AcquireResponse) -> Generator[Op, Any, Optional[Outcome]]:
    """Asks task.reconcile what became of an earlier attempt and reports it;
    None after a confirmed absence (acquire again and execute)."""
    c, key = session.client, task.key
    att = yield from _attempt(session, key, acq, reconciling=True)
    reconcile = getattr(task, "reconcile", None)
    ev: Any = undecided("no reconcile function")
    err: Optional[BaseException] = None
    if reconcile is not None:
        got, err = yield from _under_lease(att, reconcile)
        if err is None:
            ev = got
    else:
        yield Op("untrack", args=(key, att.token))
    lost, t, rt = att.lost.is_set(), att.token, c.report_timeout
    try:
        if err is not None:
            # The lookup itself failed: nothing was learned. Leave the intent
            # UNKNOWN for the next reconcile rather than for a human.
            resp = yield _call("mark_unknown", key, t, f"reconcile failed: {_reason(err)}", timeout=rt, report=True)
            return Outcome(_marked_unknown(resp.intent), resp.intent, error=err, lease_lost=lost)
        if ev.verdict == "found":
            try:
                resp = yield _call("complete", key, t, ev.result or intent_pb2.Result(), children=att.children, timeout=rt, report=True)
            except InvalidField as refused:
                # The effect exists but cannot be recorded as found: a
                # human decides, rather than a reconcile that finds it again.
                why = f"found downstream, but the result could not be recorded: {refused}"
                resp = yield _call("escalate", key, why, token=t, actor="intentd.run", timeout=rt, report=True)
                return Outcome(Outcomes.OUTCOME_NEEDS_REVIEW, resp.intent, error=refused, lease_lost=lost)
            return Outcome(Outcomes.OUTCOME_COMPLETED, resp.intent, lease_lost=lost)
        if ev.verdict == "absent":
            yield _call("release", key, t, ev.reason, timeout=rt, report=True)
            return None
        resp = yield _call("escalate", key, ev.reason or "undecided", token=t, actor="intentd.run", timeout=rt, report=True)
        return Outcome(Outcomes.OUTCOME_NEEDS_REVIEW, resp.intent, lease_lost=lost)
    except IntentdError as rerr:
        raise _lease_err(lost, rerr) from rerr


def _lease_err(lost: bool, err: IntentdError) -> BaseException:
    """A refused report, as LeaseLost when the lease was lost meanwhile
    (the refusal is its __cause__); StaleToken stays StaleToken, so that run
    acquires again."""
    if lost and not isinstance(err, StaleToken):
        return LeaseLost(f"lease lost: {err}")
    return err


def _wait_while_held(session: "Session", key: str, acq: intent_pb2.AcquireResponse, deadline: float) -> None:
    """Waits until the intent leaves IN_PROGRESS, watching its record from
    the revision Acquire saw, or until deadline. A message with no intent
    (the watch saying it is established) is skipped. A broken watch falls
    back to a short sleep: the next Acquire tells the truth anyway."""
    c = session.client
    req = intent_pb2.WatchRequest(key=key, start_revision=acq.intent.revision + 1)
    try:
        for ev in c.watch(req, timeout=max(deadline - time.monotonic(), 0.001)):
            if not ev.HasField("intent"):
                continue
            if ev.intent.state != intent_pb2.STATE_IN_PROGRESS:
                return
    except IntentdError:
        time.sleep(min(c.backoff_min, max(deadline - time.monotonic(), 0)))


__all__ = [
    "LEFT_UNKNOWN",
    "RELEASED",
    "Attempt",
    "Evidence",
    "Final",
    "NotAttempted",
    "Outcome",
    "Op",
    "Task",
    "absent",
    "found",
    "plan",
    "run",
    "undecided",
    "LeaseLost",
    "SessionLost",
]
