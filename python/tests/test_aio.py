"""intentd.aio against a live intentd: the thread session's decisions on
asyncio, cancellation turned into UNKNOWN, heartbeats as a task, and one
client across repeated asyncio.run calls."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
import unittest
import uuid

import grpc
import grpc.aio

import intentd
import intentd.aio
from intent.v1 import intent_pb2
from tests import merchant
from tests.live import Intentd, Provider

O = intent_pb2


def setUpModule() -> None:
    global server, provider
    server, provider = Intentd(), Provider()


def tearDownModule() -> None:
    provider.stop()
    server.stop()


def fresh_key(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


async def place(url: str, att: intentd.Attempt) -> intent_pb2.Result:
    """One order at the merchant, off the event loop."""
    order = await asyncio.to_thread(merchant.create_order, url, att.operation_key("create-order"))
    return merchant.order_result(order)


async def look_up(att: intentd.Attempt) -> intentd.Evidence:
    return await asyncio.to_thread(merchant.reconcile(provider.url), att)


class HoldAcquire(grpc.aio.UnaryUnaryClientInterceptor):
    """Lets a call (Acquire) reach intentd, then holds its answer back until
    released: it took effect while the caller is still waiting."""

    def __init__(self, method: str = "/Acquire", before: bool = False) -> None:
        self.method = method
        self.before = before
        """Hold the call back before it is sent: it never reaches intentd."""
        self.answered = asyncio.Event()
        self.hold = True

    async def intercept_unary_unary(self, continuation, details, request):
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if self.before and self.hold and method.endswith(self.method):
            self.answered.set()
            await asyncio.sleep(3600)
        call = await continuation(details, request)
        if self.hold and method.endswith(self.method):
            await call  # intentd answered: the lease exists
            self.answered.set()
            await asyncio.sleep(3600)
        return call


class AioTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.client = intentd.aio.AsyncClient(server.address, report_timeout=10)
        self.sync = intentd.Client(server.address)

    async def asyncTearDown(self) -> None:
        await self.client.close()
        self.sync.close()

    async def test_run_replay_and_decisions(self) -> None:
        """EXECUTE → the coroutine runs once → COMPLETED; the same task again
        is replayed with the statement and runs nothing; Final, NotAttempted
        and any other exception decide as the thread session's run does."""
        key = fresh_key("aio")
        await self.client.register(key, {"item": "lamp", "max_eur": 89})
        ran = []

        async def execute(att: intentd.Attempt) -> intent_pb2.Result:
            ran.append(att.token)
            self.assertIsInstance(att.lost, asyncio.Event)
            return await place(provider.url, att)

        async with await self.client.open_session("aio-worker", ttl=3) as session:
            first = await session.run(intentd.Task(key=key, execute=execute, reconcile=look_up))
            self.assertEqual((first.name, first.executed), ("OUTCOME_COMPLETED", True))
            again = await session.run(intentd.Task(key=key, execute=execute, reconcile=look_up))
            self.assertEqual((again.name, again.executed), ("OUTCOME_COMPLETED", False))
            self.assertIn("action_taken: none", again.statement.text)
            self.assertEqual(again.result.payload, first.result.payload)
            self.assertEqual(len(ran), 1)
            self.assertEqual(provider.effects(f"{key}:create-order"), 1)

            cases = [
                ("final", intentd.Final("card_declined", "no"), "OUTCOME_FAILED", O.STATE_FAILED),
                ("none", intentd.NotAttempted("refused before sending"), "RELEASED", O.STATE_PENDING),
                ("timeout", TimeoutError("merchant did not answer"), "LEFT_UNKNOWN", O.STATE_UNKNOWN),
            ]
            for name, exc, want, state in cases:
                with self.subTest(name):
                    k = fresh_key(name)
                    await self.client.register(k, {"case": name})

                    async def fails(att: intentd.Attempt, exc: Exception = exc) -> intent_pb2.Result:
                        raise exc

                    out = await session.run(intentd.Task(key=k, execute=fails))
                    self.assertEqual((out.name, out.intent.state), (want, state))
                    self.assertIs(out.error, exc)

    async def test_cancelled_inside_execute_is_unknown_then_reconciled(self) -> None:
        """A cancellation after the effect (task.cancel(), asyncio.timeout)
        is reported as MarkUnknown, never Release, and the CancelledError
        (TimeoutError from asyncio.timeout) reaches the caller; the next run
        reconciles by operation key and records the one effect."""
        for how in ("cancel", "timeout"):
            with self.subTest(how):
                key = fresh_key(how)
                await self.client.register(key, {"item": "lamp"})
                effected = asyncio.Event()

                async def slow(att: intentd.Attempt) -> intent_pb2.Result:
                    await place(provider.url, att)
                    effected.set()
                    await asyncio.sleep(3600)  # the answer never comes
                    raise AssertionError("not reached")

                async with await self.client.open_session("cancelled", ttl=3) as session:
                    if how == "cancel":
                        running = asyncio.ensure_future(session.run(intentd.Task(key=key, execute=slow)))
                        await effected.wait()
                        running.cancel()
                        with self.assertRaises(asyncio.CancelledError):
                            await running
                    else:
                        with self.assertRaises(TimeoutError):
                            async with asyncio.timeout(1.0):
                                await session.run(intentd.Task(key=key, execute=slow))
                    got = await self.client.get(key)
                    self.assertEqual(got.state, O.STATE_UNKNOWN, intent_pb2.State.Name(got.state))
                    marked = [h for h in got.history if h.kind == O.HistoryEntry.KIND_MARKED_UNKNOWN]
                    self.assertEqual(len(marked), 1, got.history)
                    self.assertIn("cancelled while executing", marked[0].reason)

                    async def never(att: intentd.Attempt) -> intent_pb2.Result:
                        raise AssertionError("EXECUTE after a cancellation")

                    out = await session.run(intentd.Task(key=key, execute=never, reconcile=look_up))
                    self.assertEqual((out.name, out.executed), ("OUTCOME_COMPLETED", False))
                    self.assertEqual(provider.effects(f"{key}:create-order"), 1)

    async def test_acquire_cancelled_in_flight_gives_the_lease_back(self) -> None:
        """intentd issued the lease but the caller was cancelled before the
        answer arrived: run asks again with the same request id and
        releases it (shielded), so the intent is PENDING, not held by a
        worker that does nothing."""
        hold = HoldAcquire()
        client = intentd.aio.AsyncClient(channel_factory=lambda: grpc.aio.insecure_channel(server.address, interceptors=[hold]))
        key = fresh_key("held")
        await client.register(key, {"item": "lamp"})
        async with await client.open_session("held", ttl=3) as session:
            running = asyncio.ensure_future(session.run(intentd.Task(key=key, execute=lambda att: intent_pb2.Result())))
            await hold.answered.wait()
            hold.hold = False
            running.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await running
            got = await client.get(key)
            self.assertEqual(got.state, O.STATE_PENDING, intent_pb2.State.Name(got.state))
            self.assertTrue(any(h.kind == O.HistoryEntry.KIND_RELEASED for h in got.history), got.history)
        await client.close()

    async def test_complete_cancelled_in_flight_is_sent_again(self) -> None:
        """The caller is cancelled while Complete is on its way (held before
        it reaches intentd): the report is sent again in a task of its own,
        so the effect is recorded (COMPLETED), not left to a reconcile."""
        hold = HoldAcquire("/Complete", before=True)
        client = intentd.aio.AsyncClient(channel_factory=lambda: grpc.aio.insecure_channel(server.address, interceptors=[hold]))
        key = fresh_key("complete")
        await client.register(key, {"item": "lamp"})
        async with await client.open_session("completing", ttl=3) as session:
            running = asyncio.ensure_future(session.run(intentd.Task(key=key, execute=lambda att: place(provider.url, att))))
            await hold.answered.wait()
            hold.hold = False
            running.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await running
        got = await client.get(key)  # close waited for the report sent again
        self.assertEqual(got.state, O.STATE_COMPLETED, intent_pb2.State.Name(got.state))
        self.assertEqual(provider.effects(f"{key}:create-order"), 1)
        await client.close()

    async def test_refused_complete_cancelled_in_flight_is_marked_unknown(self) -> None:
        """As above, with a result intentd refuses to record: the plan goes
        on in the background past the refusal to its MarkUnknown, so the
        intent is UNKNOWN, not held by the session's lease."""
        hold = HoldAcquire("/Complete", before=True)
        client = intentd.aio.AsyncClient(channel_factory=lambda: grpc.aio.insecure_channel(server.address, interceptors=[hold]))
        key = fresh_key("refused")
        await client.register(key, {"item": "lamp"})
        async with await client.open_session("completing", ttl=3) as session:
            running = asyncio.ensure_future(session.run(intentd.Task(key=key, execute=lambda att: intent_pb2.Result(payload=bytes(300_000)))))
            await hold.answered.wait()
            hold.hold = False
            running.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await running
            await asyncio.gather(*session._background, return_exceptions=True)  # what close waits for, before the session ends
            got = await client.get(key)
            self.assertEqual(got.state, O.STATE_UNKNOWN, intent_pb2.State.Name(got.state))
            self.assertTrue(got.history[-1].reason.startswith("the result could not be recorded: "), got.history[-1].reason)
        await client.close()

    async def test_lease_loss_is_an_event(self) -> None:
        """The session ended elsewhere: the next heartbeat sets attempt.lost,
        which execute can await."""
        key = fresh_key("lost")
        await self.client.register(key, {"item": "lamp"})
        session = await self.client.open_session("doomed", ttl=2)
        told = []
        session.on_lost(told.append)

        async def execute(att: intentd.Attempt) -> intent_pb2.Result:
            self.sync.rpc.CloseSession(intent_pb2.CloseSessionRequest(session_id=session.id))
            await asyncio.wait_for(att.lost.wait(), 5)
            raise intentd.NotAttempted("lease lost before sending")

        out = await session.run(intentd.Task(key=key, execute=execute))
        self.assertTrue(out.lease_lost, out)  # the report still went in: the best evidence there is
        self.assertTrue(session.lost.is_set())
        self.assertIsInstance(session.error, intentd.SessionNotFound)
        self.assertEqual(len(told), 1)

    async def test_heartbeat_task_keeps_the_session(self) -> None:
        """A session with a 2 s TTL outlives two TTLs while the loop does
        other work, and then runs a task."""
        async with await self.client.open_session("beating", ttl=2) as session:
            await asyncio.sleep(4.5)
            self.assertFalse(session.lost.is_set())
            key = fresh_key("beat")
            await self.client.register(key, {"item": "lamp"})
            out = await session.run(intentd.Task(key=key, execute=lambda att: place(provider.url, att)))
            self.assertEqual(out.name, "OUTCOME_COMPLETED")

    async def test_unrecordable_reports_hand_the_intent_back(self) -> None:
        """As the thread session's run: a report intentd would refuse for its
        content does not leave the lease held by this live session. Free
        text is cut to intentd's limits in UTF-8 bytes; a refused Complete
        or Fail after execute becomes MarkUnknown (the next worker gets
        RECONCILE at once, not IN_PROGRESS); a refused Complete of a found
        result becomes Escalate."""
        euros = "€" * 2000  # 2000 characters, 6000 bytes

        def raising(exc: Exception):
            async def execute(att: intentd.Attempt) -> intent_pb2.Result:
                raise exc
            return execute

        async def history(key: str, kind: int) -> list:
            return [h for h in (await self.client.get(key)).history if h.kind == kind]

        async def state(key: str) -> int:
            return (await self.client.get(key)).state

        async with await self.client.open_session("unrecordable", ttl=3) as s, await self.client.open_session("other", ttl=3) as other:
            with self.subTest("oversize result"):
                key = fresh_key("oversize")
                await self.client.register(key, {"case": "oversize"})

                async def oversize(att: intentd.Attempt) -> intent_pb2.Result:
                    return intent_pb2.Result(payload=b"x" * 300_000)

                out = await s.run(intentd.Task(key=key, execute=oversize, wait_in_progress=0))
                self.assertEqual((out.name, out.executed), ("LEFT_UNKNOWN", True), str(out))
                self.assertIsInstance(out.error, intentd.InvalidField)
                self.assertEqual(await state(key), O.STATE_UNKNOWN)
                marked = await history(key, O.HistoryEntry.KIND_MARKED_UNKNOWN)
                self.assertEqual(len(marked), 1)
                self.assertTrue(marked[0].reason.startswith("the result could not be recorded: intentd: "), marked[0].reason)
                looked = []

                async def reconcile(att: intentd.Attempt) -> intentd.Evidence:
                    looked.append(att.reconciling)
                    return intentd.found(intent_pb2.Result(external_refs={"order_id": "o-1"}))

                again = await other.run(intentd.Task(key=key, execute=raising(AssertionError("executed again")), reconcile=reconcile, wait_in_progress=0))
                self.assertEqual(looked, [True])
                self.assertEqual((again.name, again.executed), ("OUTCOME_COMPLETED", False))

            with self.subTest("non-ASCII exception"):
                key = fresh_key("euros")
                await self.client.register(key, {"case": "euros"})
                out = await s.run(intentd.Task(key=key, execute=raising(RuntimeError(euros))))
                self.assertEqual(out.name, "LEFT_UNKNOWN", str(out))
                self.assertEqual(await state(key), O.STATE_UNKNOWN)
                reason = (await history(key, O.HistoryEntry.KIND_MARKED_UNKNOWN))[0].reason
                self.assertTrue(reason.startswith("RuntimeError: €€€"), reason[:40])
                self.assertLessEqual(len(reason.encode()), 1024)

            with self.subTest("non-ASCII NotAttempted"):
                key = fresh_key("released")
                await self.client.register(key, {"case": "released"})
                out = await s.run(intentd.Task(key=key, execute=raising(intentd.NotAttempted(euros))))
                self.assertEqual(out.name, "RELEASED", str(out))
                self.assertEqual(await state(key), O.STATE_PENDING)

            with self.subTest("long Final code and message"):
                key = fresh_key("final")
                await self.client.register(key, {"case": "final"})
                code = "card_declined_" + "é" * 93  # 200 bytes
                out = await s.run(intentd.Task(key=key, execute=raising(intentd.Final(code, euros))))
                self.assertEqual(out.name, "OUTCOME_FAILED", str(out))
                got = await self.client.get(key)
                self.assertEqual((got.failure.code, got.failure.message), (code[:71], "€" * 341))  # 128 and 1023 bytes

            with self.subTest("bad Final code"):
                key = fresh_key("nocode")
                await self.client.register(key, {"case": "nocode"})
                out = await s.run(intentd.Task(key=key, execute=raising(intentd.Final("", "no code"))))
                self.assertEqual(out.name, "LEFT_UNKNOWN", str(out))
                self.assertIsInstance(out.error, intentd.InvalidField)
                self.assertEqual(await state(key), O.STATE_UNKNOWN)
                reason = (await history(key, O.HistoryEntry.KIND_MARKED_UNKNOWN))[0].reason
                self.assertTrue(reason.startswith("the failure could not be recorded: intentd: "), reason)

            with self.subTest("found, oversize"):
                key = fresh_key("found")
                await self.client.register(key, {"case": "found"})
                await s.run(intentd.Task(key=key, execute=raising(TimeoutError("lost answer"))))

                async def found_oversize(att: intentd.Attempt) -> intentd.Evidence:
                    return intentd.found(intent_pb2.Result(payload=b"x" * 300_000))

                out = await s.run(intentd.Task(key=key, execute=raising(AssertionError("executed again")), reconcile=found_oversize, wait_in_progress=0))
                self.assertEqual((out.name, out.executed), ("OUTCOME_NEEDS_REVIEW", False), str(out))
                self.assertIsInstance(out.error, intentd.InvalidField)
                self.assertEqual(await state(key), O.STATE_NEEDS_REVIEW)
                reason = (await history(key, O.HistoryEntry.KIND_ESCALATED))[0].reason
                self.assertTrue(reason.startswith("found downstream, but the result could not be recorded: intentd: "), reason)

    async def test_concurrent_runs_one_effect(self) -> None:
        """Two coroutines run the same intent at once: one executes, the
        other waits for it and gets the replay; one effect."""
        key = fresh_key("race")
        await self.client.register(key, {"item": "lamp"})

        async def execute(att: intentd.Attempt) -> intent_pb2.Result:
            await asyncio.sleep(0.3)
            return await place(provider.url, att)

        async with await self.client.open_session("a", ttl=3) as a, await self.client.open_session("b", ttl=3) as b:
            outs = await asyncio.gather(*(s.run(intentd.Task(key=key, execute=execute, wait_in_progress=10)) for s in (a, b)))
        self.assertEqual(sorted(o.executed for o in outs), [False, True])
        self.assertEqual({o.name for o in outs}, {"OUTCOME_COMPLETED"})
        self.assertEqual(provider.effects(f"{key}:create-order"), 1)


class RepeatedLoopsTest(unittest.TestCase):
    """One AsyncClient used from several asyncio.run calls, as a host that
    calls a framework's run_sync twice does: each loop gets its own
    channel."""

    def test_two_asyncio_runs(self) -> None:
        client = intentd.aio.AsyncClient(server.address)
        keys = []

        async def once() -> str:
            key = fresh_key("loops")
            await client.register(key, {"n": len(keys)})
            async with await client.open_session("loops", ttl=3) as s:
                out = await s.run(intentd.Task(key=key, execute=lambda att: intent_pb2.Result(external_refs={"n": str(len(keys))})))
            keys.append(key)
            return out.name

        for _ in range(3):
            self.assertEqual(asyncio.run(once()), "OUTCOME_COMPLETED")
        self.assertEqual(len(keys), 3)
        # The channels of the loops that ended are let go: one call per
        # asyncio.run must not keep one channel per call.
        self.assertLessEqual(len(client._per_loop), 1)
        asyncio.run(client.close())

    def test_a_session_stays_on_its_loop(self) -> None:
        """A session carried into a second asyncio.run has no heartbeat
        there (its task ended with the first loop): run refuses it, naming
        the fix, and executes nothing."""
        client = intentd.aio.AsyncClient(server.address)
        key = fresh_key("other-loop")
        ran = []

        async def open_one() -> intentd.aio.AsyncSession:
            await client.register(key, {"n": 1})
            return await client.open_session("other-loop", ttl=3)

        session = asyncio.run(open_one())

        async def run_there() -> None:
            await session.run(intentd.Task(key=key, execute=lambda att: ran.append(att) or intent_pb2.Result()))

        with self.assertRaisesRegex(RuntimeError, "belongs to the event loop that opened it"):
            asyncio.run(run_there())
        self.assertEqual(ran, [])

        async def still_pending() -> int:
            try:
                return (await client.get(key)).state
            finally:
                await client.close()

        self.assertEqual(asyncio.run(still_pending()), intent_pb2.STATE_PENDING)


class CallSettingsTest(unittest.TestCase):
    """What every call of an AsyncClient carries: the bearer token and the
    caller's metadata (built into grpc.aio's Metadata once, not per call),
    and the channel options (gRPC's own retries off unless the caller
    names them)."""

    def test_token_and_metadata_on_every_call(self) -> None:
        token = "aio-" + uuid.uuid4().hex
        with tempfile.TemporaryDirectory() as d:
            tokens = os.path.join(d, "tokens.json")
            with open(tokens, "w") as f:
                json.dump({"principals": [{"name": "aio-worker", "tenants": ["*"], "roles": ["admin"],
                                           "token_sha256": [hashlib.sha256(token.encode()).hexdigest()]}]}, f)
            guarded = Intentd("--tokens-file", tokens)
            try:
                async def calls(client: intentd.aio.AsyncClient) -> str:
                    key = fresh_key("aio-token")
                    async with await client.open_session("aio-token", ttl=3) as s:
                        out = await s.run(intentd.Task(key=key, execute=lambda att: intent_pb2.Result(),
                                                       register=intentd.Client.register_request(key, {"n": 1})))
                    return out.name

                trace = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
                with_token = intentd.aio.AsyncClient(guarded.address, token=token, metadata=[("traceparent", trace)])
                self.assertIsInstance(with_token._call_metadata, grpc.aio.Metadata)
                for _ in range(2):  # the same Metadata on every call, and on a second loop's channel
                    self.assertEqual(asyncio.run(calls(with_token)), "OUTCOME_COMPLETED")
                self.assertEqual(list(with_token._call_metadata), [("traceparent", trace), ("authorization", "Bearer " + token)])

                async def refused() -> None:
                    async with intentd.aio.AsyncClient(guarded.address) as client:
                        await client.derive_key("buy-item", {"item": "desk lamp"})

                with self.assertRaises(intentd.IntentdError):
                    asyncio.run(refused())
            finally:
                guarded.stop()

    def test_grpc_retries_off_unless_named(self) -> None:
        self.assertIn(("grpc.enable_retries", 0), intentd.aio.AsyncClient(server.address)._options)
        own = intentd.aio.AsyncClient(server.address, options=[("grpc.enable_retries", 1), ("grpc.keepalive_time_ms", 20000)])
        self.assertEqual(own._options, [("grpc.enable_retries", 1), ("grpc.keepalive_time_ms", 20000)])

        async def works() -> str:
            async with intentd.aio.AsyncClient(server.address) as client:
                return (await client.derive_key("buy-item", {"item": "desk lamp"})).key

        self.assertEqual(len(asyncio.run(works())), 64)


if __name__ == "__main__":
    unittest.main()
