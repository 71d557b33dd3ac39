"""The Python worker library against a live intentd (see tests/live.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import unittest
import uuid

import grpc

import intentd
from intent.v1 import intent_pb2
from tests import merchant
from tests.live import PYTHON, REPO, TESTS_ROOT, Intentd, Provider, child_env

O = intent_pb2


def setUpModule() -> None:
    global server, provider
    server, provider = Intentd(), Provider()


def tearDownModule() -> None:
    provider.stop()
    server.stop()


def fresh_key(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


def buying(url: str):
    """A task's execute: one order at the merchant under the operation key."""

    def execute(att: intentd.Attempt) -> intent_pb2.Result:
        return merchant.order_result(merchant.create_order(url, att.operation_key("create-order")))

    return execute


class Counting(grpc.UnaryUnaryClientInterceptor):
    """Counts the attempts the client sends."""

    def __init__(self) -> None:
        self.calls = 0

    def intercept_unary_unary(self, continuation, details, request):
        self.calls += 1
        return continuation(details, request)


class Seeing(grpc.UnaryUnaryClientInterceptor):
    """Keeps the metadata of every call the client sends."""

    def __init__(self) -> None:
        self.metadata: list = []

    def intercept_unary_unary(self, continuation, details, request):
        self.metadata.append(list(details.metadata or ()))
        return continuation(details, request)


class Unanswered(grpc.RpcError):
    """UNAVAILABLE, as when intentd does not answer."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "cut off by the test"

    def trailing_metadata(self):
        return ()


class CutHeartbeats(grpc.UnaryUnaryClientInterceptor):
    """Lets heartbeats through until cut is set, then answers none."""

    def __init__(self) -> None:
        self.cut = threading.Event()

    def intercept_unary_unary(self, continuation, details, request):
        if self.cut.is_set() and details.method.endswith("/Heartbeat"):
            raise Unanswered()
        return continuation(details, request)


class CutTest(unittest.TestCase):
    def test_cut_utf8(self) -> None:
        """At most the limit in UTF-8 bytes, at a character boundary; text
        UTF-8 cannot encode (a lone surrogate) becomes "?"."""
        cut = intentd.client.cut_utf8
        self.assertEqual(cut("abc", 3), "abc")
        self.assertEqual(cut("abc€", 5), "abc")  # "€" is 3 bytes: not cut in half
        self.assertEqual(cut("abc€", 6), "abc€")
        self.assertEqual(cut("€" * 2000, 1024), "€" * 341)
        self.assertEqual(cut("", 0), "")
        self.assertEqual(cut("a\udcffb", 10), "a?b")

    def test_params_that_are_not_json_say_where(self) -> None:
        """A Decimal, a datetime, a key that is not a string: a TypeError
        naming where it is, not protobuf's bare "Unexpected type"."""
        import datetime
        import decimal

        for params, where in [
            ({"max_eur": decimal.Decimal("89.00")}, "params.max_eur is a Decimal"),
            ({"items": [{"sku": "L-1"}, {"at": datetime.date(2026, 12, 7)}]}, "params.items[1].at is a date"),
            ({"by_id": {1: "lamp"}}, "params.by_id has the key 1, not a string"),
        ]:
            with self.subTest(where=where):
                with self.assertRaises(TypeError) as got:
                    intentd.Client.register_request("k", params)
                self.assertIn(where, str(got.exception))
        self.assertEqual(intentd.Client.register_request("k", {"n": 1, "l": [None, True, "x"]}).params["n"], 1)


class LiveTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = intentd.Client(server.address, report_timeout=10)
        self.addCleanup(self.client.close)

    def session(self, worker: str, ttl: float = 3) -> intentd.Session:
        s = self.client.open_session(worker, ttl=ttl)
        self.addCleanup(lambda: s.close() if s.error is None else None)
        return s

    def test_flow(self) -> None:
        """register → run (EXECUTE, complete) → replay with no action and the
        same result bytes → stale refusal → fingerprint mismatch → a worker
        that stops heartbeating is reconciled, never executed again → one
        effect per intent at the provider."""
        key = fresh_key("lamp")
        params = {"merchant": "m-1", "item": "desk-lamp", "max_eur": 89}
        reg = self.client.register(key, params)
        self.assertTrue(reg.created)
        self.assertEqual(reg.intent.state, O.STATE_PENDING)
        w1 = self.session("w1")
        task = intentd.Task(key=key, execute=buying(provider.url), reconcile=merchant.reconcile(provider.url))

        first = w1.run(task)
        self.assertEqual(first.name, "OUTCOME_COMPLETED")
        self.assertTrue(first.executed)
        self.assertEqual(provider.effects(f"{key}:create-order"), 1)

        replay = w1.run(task)
        self.assertEqual(replay.name, "OUTCOME_COMPLETED")
        self.assertFalse(replay.executed)
        self.assertEqual(replay.statement.action_taken, "none")
        self.assertEqual(replay.result.payload, first.result.payload)
        self.assertIn("action_taken: none", replay.statement.text)

        raw = self.client.acquire(key, w1.id)
        self.assertEqual(raw.action_taken, "none")
        self.assertEqual(raw.intent.result.SerializeToString(), first.intent.result.SerializeToString())

        with self.assertRaises(intentd.FingerprintMismatch) as cm:
            self.client.register(key, dict(params, max_eur=900))
        self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(cm.exception.metadata["registered_fingerprint"], reg.intent.fingerprint)
        with self.assertRaises(intentd.FingerprintMismatch):
            self.client.acquire(key, w1.id, expected_fingerprint="0" * 64)

        # A worker that stops heartbeating: a session opened with the bare
        # stub, so nothing keeps it alive. It places the order and goes quiet.
        key2 = fresh_key("lamp")
        self.client.register(key2, params)
        silent = self.client.rpc.OpenSession(intent_pb2.OpenSessionRequest(worker="silent", ttl={"seconds": 2}))
        held = self.client.acquire(key2, silent.session_id)
        self.assertEqual(held.outcome, O.OUTCOME_EXECUTE)
        old = held.lease.token
        order = merchant.create_order(provider.url, f"{key2}:create-order")

        executed = []
        w2 = self.session("w2")

        def never(att: intentd.Attempt) -> intent_pb2.Result:
            executed.append(att.token)
            raise AssertionError("EXECUTE after a worker went quiet")

        out = w2.run(intentd.Task(key=key2, execute=never, reconcile=merchant.reconcile(provider.url), wait_in_progress=20))
        self.assertEqual(out.name, "OUTCOME_COMPLETED")
        self.assertFalse(out.executed)
        self.assertEqual(executed, [])
        self.assertEqual(out.result.external_refs["order_id"], order)
        self.assertEqual(provider.effects(f"{key2}:create-order"), 1)

        # The quiet worker wakes up and reports: refused, kept as evidence.
        with self.assertRaises(intentd.StaleToken) as cm:
            self.client.complete(key2, old, merchant.order_result(order))
        stale = cm.exception
        self.assertEqual(stale.code, grpc.StatusCode.ABORTED)
        self.assertGreater(stale.current_token, old)
        self.assertEqual(stale.statement.status, "stale_token")
        history = self.client.get(key2).history
        self.assertTrue(any(h.kind == O.HistoryEntry.KIND_COMPLETED and h.token == old and not h.accepted for h in history))

    def test_seed_scenario(self) -> None:
        """Worker A pauses after the effect; B reconciles and completes; A's
        late report is refused and kept as evidence; one order."""
        key = fresh_key("seed")
        self.client.register(key, {"merchant": "m-1", "item": "lamp"})
        a = self.spawn(key)
        token = self.wait_effect(a)
        a.send_signal(signal.SIGSTOP)  # paused: its heartbeats stop too
        try:
            b = self.session("b")
            out = b.run(intentd.Task(key=key, execute=buying(provider.url), reconcile=merchant.reconcile(provider.url), wait_in_progress=20))
        finally:
            a.send_signal(signal.SIGCONT)
        self.assertEqual(out.name, "OUTCOME_COMPLETED")
        self.assertFalse(out.executed)
        a.stdin.write("go\n")
        a.stdin.flush()
        last = a.stdout.readline().split()
        a.wait(20)
        self.assertEqual(last[0], "REFUSED", last)  # its session or lease is gone
        history = self.client.get(key).history
        refused = [h for h in history if h.kind == O.HistoryEntry.KIND_COMPLETED and h.token == token and not h.accepted]
        accepted = [h for h in history if h.kind == O.HistoryEntry.KIND_COMPLETED and h.accepted]
        self.assertEqual(len(refused), 1, history)
        self.assertEqual(len(accepted), 1, history)
        self.assertEqual(provider.effects(f"{key}:create-order"), 1)

    def test_crash_between_effect_and_record(self) -> None:
        """A worker process killed after the effect, before the record: the
        next worker reconciles (never executes) and records that effect."""
        key = fresh_key("crash")
        self.client.register(key, {"merchant": "m-1", "item": "lamp"})
        a = self.spawn(key)
        self.wait_effect(a)
        a.kill()
        a.wait(10)
        b = self.session("b")
        out = b.run(intentd.Task(key=key, execute=buying(provider.url), reconcile=merchant.reconcile(provider.url), wait_in_progress=20))
        self.assertEqual(out.name, "OUTCOME_COMPLETED")
        self.assertFalse(out.executed)
        self.assertEqual(provider.effects(f"{key}:create-order"), 1)
        self.assertEqual(self.client.get(key).state, O.STATE_COMPLETED)

    def spawn(self, key: str) -> subprocess.Popen:
        p = subprocess.Popen(
            [PYTHON, "-m", "tests.worker_child", server.address, key, provider.url, "2"],
            cwd=TESTS_ROOT, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        def end() -> None:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdin.close()
            p.stdout.close()

        self.addCleanup(end)
        return p

    def wait_effect(self, p: subprocess.Popen) -> int:
        line = p.stdout.readline().split()
        self.assertEqual(line[:1], ["EFFECT"], line)
        return int(line[1])

    def test_decisions(self) -> None:
        """Final → FAILED; NotAttempted → PENDING; any other exception →
        UNKNOWN, and the next run reconciles; no reconcile → NEEDS_REVIEW;
        a MarkUnknown that reaches max_attempts → NEEDS_REVIEW. An intent
        run handed back used to be named OUTCOME_UNSPECIFIED, which told a
        worker author nothing: its name and its sentence say what happened
        (the outcome field keeps OUTCOME_UNSPECIFIED, as before)."""
        cases = [
            ("final", intentd.Final("card_declined", "issuer said no"), "OUTCOME_FAILED", O.OUTCOME_FAILED, O.STATE_FAILED, "FAILED"),
            ("none", intentd.NotAttempted("merchant rejected the request before sending"), "RELEASED", O.OUTCOME_UNSPECIFIED, O.STATE_PENDING,
             "is PENDING again after NotAttempted: merchant rejected the request before sending; nothing was sent, so the next Acquire executes it"),
            ("timeout", TimeoutError("merchant did not answer in 30s"), "LEFT_UNKNOWN", O.OUTCOME_UNSPECIFIED, O.STATE_UNKNOWN,
             "is UNKNOWN after TimeoutError: merchant did not answer in 30s; it may have taken effect, so the next worker reconciles"),
        ]
        s = self.session("decider")
        for name, exc, want_name, want_outcome, want_state, want_said in cases:
            with self.subTest(name):
                key = fresh_key(name)
                self.client.register(key, {"case": name})

                def execute(att: intentd.Attempt, exc: Exception = exc) -> intent_pb2.Result:
                    raise exc

                out = s.run(intentd.Task(key=key, execute=execute))
                self.assertEqual(out.name, want_name)
                self.assertEqual(out.outcome, want_outcome)
                self.assertEqual(out.intent.state, want_state)
                self.assertEqual(out.left_unknown, want_name == "LEFT_UNKNOWN")
                self.assertEqual(out.released, want_name == "RELEASED")
                self.assertIn(want_said, str(out))
                self.assertTrue(str(out).startswith(f"{want_name}: intent {key} is "), str(out))
                self.assertIn(f"name={want_name!r}", repr(out))
                self.assertNotIn("UNSPECIFIED", str(out) + repr(out))
                self.assertTrue(out.executed)
        key = fresh_key("poison")
        self.client.register(key, {"case": "one attempt allowed"}, max_attempts=1)
        out = s.run(intentd.Task(key=key, execute=lambda att: (_ for _ in ()).throw(TimeoutError("lost answer"))))
        self.assertEqual(out.name, "OUTCOME_NEEDS_REVIEW")  # that MarkUnknown reached max_attempts
        self.assertIsInstance(out.error, TimeoutError)
        key = fresh_key("timeout")
        self.client.register(key, {"case": "unknown-then-review"})
        s.run(intentd.Task(key=key, execute=lambda att: (_ for _ in ()).throw(TimeoutError("lost answer"))))
        out = s.run(intentd.Task(key=key, execute=buying(provider.url)))  # no reconcile
        self.assertEqual(out.name, "OUTCOME_NEEDS_REVIEW")
        self.assertFalse(out.executed)
        self.assertEqual(provider.effects(f"{key}:create-order"), 0)

    def test_unrecordable_reports_hand_the_intent_back(self) -> None:
        """A report intentd would refuse for its content does not leave the
        lease held by this live session (every other caller would get
        IN_PROGRESS for as long as it heartbeats): free text is cut to
        intentd's limits in UTF-8 bytes, a refused Complete or Fail after
        execute becomes MarkUnknown, a refused Complete of a found result
        Escalate."""
        s = self.session("unrecordable")
        euros = "€" * 2000  # 2000 characters, 6000 bytes

        def raising(exc: Exception):
            def execute(att: intentd.Attempt) -> intent_pb2.Result:
                raise exc
            return execute

        def history(key: str, kind: int) -> list:
            return [h for h in self.client.get(key).history if h.kind == kind]

        with self.subTest("oversize result"):
            key = fresh_key("oversize")
            self.client.register(key, {"case": "oversize"})
            out = s.run(intentd.Task(key=key, execute=lambda att: intent_pb2.Result(payload=b"x" * 300_000), wait_in_progress=0))
            self.assertEqual(out.name, "LEFT_UNKNOWN", str(out))
            self.assertTrue(out.executed)
            self.assertIsInstance(out.error, intentd.InvalidField)
            self.assertEqual(self.client.get(key).state, O.STATE_UNKNOWN)
            marked = history(key, O.HistoryEntry.KIND_MARKED_UNKNOWN)
            self.assertEqual(len(marked), 1)
            self.assertTrue(marked[0].reason.startswith("the result could not be recorded: intentd: "), marked[0].reason)
            # Another worker at once: RECONCILE, not IN_PROGRESS.
            other = self.session("other")
            looked = []

            def reconcile(att: intentd.Attempt) -> intentd.Evidence:
                looked.append(att.reconciling)
                return intentd.found(intent_pb2.Result(external_refs={"order_id": "o-1"}))

            again = other.run(intentd.Task(key=key, execute=raising(AssertionError("executed again")), reconcile=reconcile, wait_in_progress=0))
            self.assertEqual(looked, [True])
            self.assertEqual((again.name, again.executed), ("OUTCOME_COMPLETED", False))

        with self.subTest("non-ASCII exception"):
            key = fresh_key("euros")
            self.client.register(key, {"case": "euros"})
            out = s.run(intentd.Task(key=key, execute=raising(RuntimeError(euros))))
            self.assertEqual(out.name, "LEFT_UNKNOWN", str(out))
            self.assertIsInstance(out.error, RuntimeError)
            self.assertEqual(self.client.get(key).state, O.STATE_UNKNOWN)
            reason = history(key, O.HistoryEntry.KIND_MARKED_UNKNOWN)[0].reason
            self.assertTrue(reason.startswith("RuntimeError: €€€"), reason[:40])
            self.assertLessEqual(len(reason.encode()), 1024)
            self.assertGreater(len(reason.encode()), 1024 - 3)  # cut at the last whole "€"

        with self.subTest("non-ASCII NotAttempted"):
            key = fresh_key("released")
            self.client.register(key, {"case": "released"})
            out = s.run(intentd.Task(key=key, execute=raising(intentd.NotAttempted(euros))))
            self.assertEqual(out.name, "RELEASED", str(out))
            self.assertEqual(self.client.get(key).state, O.STATE_PENDING)

        with self.subTest("long Final code and message"):
            key = fresh_key("final")
            self.client.register(key, {"case": "final"})
            code = "card_declined_" + "é" * 93  # 200 bytes
            out = s.run(intentd.Task(key=key, execute=raising(intentd.Final(code, euros))))
            self.assertEqual(out.name, "OUTCOME_FAILED", str(out))
            got = self.client.get(key)
            self.assertEqual(got.state, O.STATE_FAILED)
            self.assertEqual(got.failure.code, code[:71])  # 128 bytes: 14 + 57 "é"
            self.assertEqual(got.failure.message, "€" * 341)  # 1023 bytes

        with self.subTest("bad Final code"):
            key = fresh_key("nocode")
            self.client.register(key, {"case": "nocode"})
            out = s.run(intentd.Task(key=key, execute=raising(intentd.Final("", "no code"))))
            self.assertEqual(out.name, "LEFT_UNKNOWN", str(out))
            self.assertIsInstance(out.error, intentd.InvalidField)
            self.assertEqual(self.client.get(key).state, O.STATE_UNKNOWN)
            reason = history(key, O.HistoryEntry.KIND_MARKED_UNKNOWN)[0].reason
            self.assertTrue(reason.startswith("the failure could not be recorded: intentd: "), reason)

        with self.subTest("found, oversize"):
            key = fresh_key("found")
            self.client.register(key, {"case": "found"})
            s.run(intentd.Task(key=key, execute=raising(TimeoutError("lost answer"))))
            out = s.run(intentd.Task(key=key, execute=raising(AssertionError("executed again")),
                                     reconcile=lambda att: intentd.found(intent_pb2.Result(payload=b"x" * 300_000)), wait_in_progress=0))
            self.assertEqual(out.name, "OUTCOME_NEEDS_REVIEW", str(out))
            self.assertFalse(out.executed)
            self.assertIsInstance(out.error, intentd.InvalidField)
            self.assertEqual(self.client.get(key).state, O.STATE_NEEDS_REVIEW)
            reason = history(key, O.HistoryEntry.KIND_ESCALATED)[0].reason
            self.assertTrue(reason.startswith("found downstream, but the result could not be recorded: intentd: "), reason)

        with self.subTest("non-ASCII undecided"):
            key = fresh_key("undecided")
            self.client.register(key, {"case": "undecided"})
            s.run(intentd.Task(key=key, execute=raising(TimeoutError("lost answer"))))
            out = s.run(intentd.Task(key=key, execute=raising(AssertionError("executed again")),
                                     reconcile=lambda att: intentd.undecided(euros), wait_in_progress=0))
            self.assertEqual(out.name, "OUTCOME_NEEDS_REVIEW", str(out))
            self.assertEqual(self.client.get(key).state, O.STATE_NEEDS_REVIEW)

    def test_session_lost_is_told(self) -> None:
        """A session ended elsewhere is lost here at the next heartbeat: the
        event is set and the callbacks run."""
        s = self.client.open_session("doomed", ttl=2)
        told = threading.Event()
        s.on_lost(lambda err: told.set())
        self.client.rpc.CloseSession(intent_pb2.CloseSessionRequest(session_id=s.id))
        self.assertTrue(told.wait(5))
        self.assertIsInstance(s.error, intentd.SessionNotFound)
        self.assertTrue(s.lost.is_set())

    def test_session_ttl_counts_from_last_confirmed_send(self) -> None:
        """With heartbeats unanswered, the session is lost one TTL after the
        sending of the last heartbeat intentd confirmed: never later (etcd
        may expire it then), and not much earlier."""
        cut = CutHeartbeats()
        c = intentd.Client(channel=grpc.intercept_channel(grpc.insecure_channel(server.address), cut))
        opened = time.monotonic()
        s = c.open_session("cut-off", ttl=2)
        time.sleep(1.0)  # a heartbeat or two confirmed (every TTL/3)
        cut.cut.set()
        self.assertTrue(s.lost.wait(5))
        lost_at = time.monotonic()
        last_sent = s._last_ok
        self.assertIsInstance(s.error, intentd.SessionLost)
        self.assertGreater(last_sent, opened + 0.5)  # a heartbeat was confirmed
        self.assertLessEqual(lost_at, last_sent + 2 + 0.5)  # scheduling slack
        self.assertGreaterEqual(lost_at, last_sent + 2 - 0.05)

    def test_errors(self) -> None:
        """Each refusal is its reason's class, with code, field and reason."""
        with self.assertRaises(intentd.InvalidField) as cm:
            self.client.register("bad key with spaces", {"a": 1})
        self.assertEqual((cm.exception.code, cm.exception.reason, cm.exception.field), (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "key"))
        with self.assertRaises(intentd.IntentNotFound):
            self.client.get(fresh_key("missing"))
        with self.assertRaises(intentd.SessionNotFound):
            self.client.acquire(fresh_key("missing"), "ffff0000")

    def test_retries_only_while_unanswered(self) -> None:
        """A refusal is sent once; a call intentd does not answer is sent
        again with backoff until its timeout."""
        count = Counting()
        c = intentd.Client(channel=grpc.intercept_channel(grpc.insecure_channel(server.address), count))
        with self.assertRaises(intentd.IntentNotFound):
            c.get(fresh_key("missing"))
        self.assertEqual(count.calls, 1)
        dead = Counting()
        c = intentd.Client(channel=grpc.intercept_channel(grpc.insecure_channel("127.0.0.1:1"), dead), call_timeout=0.2, backoff=(0.02, 0.1))
        start = time.monotonic()
        with self.assertRaises(intentd.Unavailable) as cm:
            c.get("k", timeout=1.0)
        self.assertIn("no answer in 1s of retries", str(cm.exception))  # not a silent wait, then a transport error
        self.assertGreater(dead.calls, 2)
        self.assertLess(time.monotonic() - start, 3)

    def test_metadata_goes_with_every_call(self) -> None:
        """Client(metadata=...) sends it on every call, beside the bearer
        token: how a traceparent reaches intentd without OpenTelemetry."""
        seen = Seeing()
        trace = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
        c = intentd.Client(channel=grpc.intercept_channel(grpc.insecure_channel(server.address), seen), metadata=[("traceparent", trace)])
        c.derive_key("buy-item", {"item": "desk lamp"})
        with self.assertRaises(intentd.IntentNotFound):
            c.get(fresh_key("missing"))
        self.assertEqual(seen.metadata, [[("traceparent", trace)]] * 2)

    def test_every_reason_has_a_class(self) -> None:
        """The proto's ErrorReason and intentd.BY_REASON agree."""
        declared = {
            intentd.errors.reason_name(v)
            for v in intent_pb2.ErrorReason.values()
            if v != intent_pb2.ERROR_REASON_UNSPECIFIED
        }
        self.assertTrue(declared)
        self.assertEqual(sorted(set(intentd.BY_REASON)), sorted(declared))
        self.assertEqual(intentd.BY_REASON["STALE_TOKEN"], intentd.StaleToken)

    def test_agent_host_example(self) -> None:
        """The example's tool, called twice by the model, buys once and
        tells the model so the second time."""
        out = subprocess.run(
            [PYTHON, os.path.join(REPO, "python", "examples", "agent_host.py"), "--target", server.address],
            env=child_env(), capture_output=True, text=True, timeout=60, check=True,
        ).stdout.splitlines()
        self.assertEqual(len(out), 3, out)
        self.assertIn("action_taken: recorded", out[0])
        self.assertTrue(out[1].startswith("tool -> already_completed"), out[1])
        self.assertIn("action_taken: none", out[1])
        self.assertEqual(out[2], "orders at the merchant: 1")

    def test_canonical_vectors(self) -> None:
        """The server derives the key (and the fingerprint of the identity
        as params, from DeriveKey and as Register stores it) of every vector in api/canonical-vectors.json, or refuses
        it naming the field."""
        with open(os.path.join(REPO, "api", "canonical-vectors.json")) as f:
            table = json.load(f)
        for v in table["vectors"]:
            with self.subTest(v["name"]):
                identity = json.loads(v["identity"], parse_int=float)  # every JSON number is a double
                if "refused" in v:
                    with self.assertRaises(intentd.InvalidField) as cm:
                        self.client.derive_key(v["action"], identity)
                    self.assertEqual(cm.exception.field, v["refused"]["derive_key"])
                    with self.assertRaises(intentd.InvalidField) as cm:
                        self.client.fingerprint(identity)
                    self.assertEqual(cm.exception.field, v["refused"]["register"])
                    with self.assertRaises(intentd.InvalidField) as cm:
                        self.client.register(fresh_key("vector"), identity)
                    self.assertEqual(cm.exception.field, v["refused"]["register"])
                    continue
                got = self.client.derive_key(v["action"], identity)
                self.assertEqual(got.canonical, v["canonical"])
                self.assertEqual(got.key, v["key"])
                fp = self.client.rpc.DeriveKey(intent_pb2.DeriveKeyRequest(params=intentd.struct(identity)))
                self.assertEqual((fp.canonical_params, fp.fingerprint), (v["canonical_params"], v["fingerprint"]))
                self.assertEqual(self.client.fingerprint(identity), v["fingerprint"])
                reg = self.client.register(fresh_key("vector"), identity)
                self.assertEqual(reg.intent.fingerprint, v["fingerprint"])


if __name__ == "__main__":
    unittest.main()
