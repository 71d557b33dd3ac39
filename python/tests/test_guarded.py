"""Guarded tools (intentd.guard) against a live intentd and the
effect-counting provider, without any framework: the five behaviours every
adapter's tests prove again through its framework, and the words the model
reads."""

from __future__ import annotations

import asyncio
import unittest

import intentd
import intentd.aio
from intent.v1 import intent_pb2
from tests.live import Intentd, Provider
from tests.shop import Conversation, Shop, crash, hang


def setUpModule() -> None:
    global server, provider
    server, provider = Intentd(), Provider()


def tearDownModule() -> None:
    provider.stop()
    server.stop()


LAMP = {"item": "desk lamp", "max_eur": 89}


class GuardedTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.client = intentd.aio.AsyncClient(server.address, report_timeout=10)
        self.ledger = intentd.Ledger(self.client, worker="guarded-test", ttl=3)
        self.shop = Shop(provider.url)
        self.tool = self.shop.tool
        self.ctx = Conversation()

    async def asyncTearDown(self) -> None:
        await self.ledger.close()
        await self.client.close()

    async def test_same_terms_twice_one_effect_and_the_statement(self) -> None:
        terms = await self.ledger.approve(self.tool, self.ctx, LAMP)
        first = await self.ledger.call(self.tool, self.ctx, LAMP)
        self.assertEqual((first.status, first.executed), ("executed", True))
        self.assertEqual(first.value["item"], "desk lamp")
        again = await self.ledger.call(self.tool, self.ctx, dict(LAMP))
        self.assertEqual((again.status, again.executed), ("replayed", False))
        self.assertTrue(again.text.startswith("already_completed: intent "), again.text)
        self.assertIn("action_taken: none", again.text)
        self.assertIn(first.value["order_id"], again.text)
        self.assertIn('"Buy desk lamp for at most 89 EUR"', again.text)  # the summary names it
        self.assertEqual(self.shop.effects(provider, terms.key), 1)

    async def test_crash_after_the_effect_is_reconciled(self) -> None:
        await self.ledger.approve(self.tool, self.ctx, LAMP)
        self.shop.after_effect = crash
        lost = await self.ledger.call(self.tool, self.ctx, LAMP)
        self.assertEqual(lost.status, "under_review")
        self.assertIn("under human review; do not retry", lost.text)
        self.assertIn("ConnectionResetError", lost.text)
        self.assertEqual((await self.client.get(lost.key)).state, intent_pb2.STATE_UNKNOWN)
        self.shop.after_effect = None
        again = await self.ledger.call(self.tool, self.ctx, LAMP)
        self.assertEqual((again.status, again.executed), ("replayed", False))
        self.assertIn("had taken effect in an earlier attempt", again.text)
        self.assertEqual(self.shop.effects(provider, lost.key), 1)

    async def test_cancelled_after_the_effect_is_reconciled(self) -> None:
        await self.ledger.approve(self.tool, self.ctx, LAMP)
        self.shop.after_effect = hang
        with self.assertRaises(TimeoutError):
            async with asyncio.timeout(1.5):
                await self.ledger.call(self.tool, self.ctx, LAMP)
        terms = await self.ledger.terms(self.tool, self.ctx, LAMP)
        self.assertEqual((await self.client.get(terms.key)).state, intent_pb2.STATE_UNKNOWN)
        self.shop.after_effect = None
        again = await self.ledger.call(self.tool, self.ctx, LAMP)
        self.assertEqual(again.status, "replayed")
        self.assertEqual(self.shop.effects(provider, terms.key), 1)

    async def test_two_at_once_one_effect(self) -> None:
        await self.ledger.approve(self.tool, self.ctx, LAMP)

        async def slow() -> None:
            await asyncio.sleep(0.3)

        self.shop.after_effect = slow
        other = intentd.Ledger(self.client, worker="other-host", ttl=3)
        answers = await asyncio.gather(self.ledger.call(self.tool, self.ctx, LAMP), other.call(self.tool, self.ctx, LAMP))
        await other.close()
        self.assertEqual(sorted(a.status for a in answers), ["executed", "replayed"])
        self.assertEqual(self.shop.effects(provider, answers[0].key), 1)

    async def test_other_terms_are_refused_and_nothing_is_sent(self) -> None:
        terms = await self.ledger.approve(self.tool, self.ctx, LAMP)
        edited = dict(LAMP, max_eur=890)
        refused = await self.ledger.call(self.tool, self.ctx, edited)
        self.assertEqual((refused.status, refused.reason), ("refused", "FINGERPRINT_MISMATCH"))
        self.assertIn("approved with other terms", refused.text)
        self.assertIn('"max_eur": 89', refused.text)
        self.assertIn("Ask the user", refused.text)
        self.assertEqual(self.shop.effects(provider, terms.key), 0)
        self.assertEqual((await self.client.get(terms.key)).state, intent_pb2.STATE_PENDING)

    async def test_not_approved_is_refused(self) -> None:
        refused = await self.ledger.call(self.tool, self.ctx, LAMP)
        self.assertEqual((refused.status, refused.reason), ("refused", "NOT_APPROVED"))
        self.assertIn("Ask the user to approve it first", refused.text)
        self.assertEqual(self.shop.effects(provider, refused.key), 0)

    async def test_in_progress_waits_then_says_so(self) -> None:
        await self.ledger.approve(self.tool, self.ctx, LAMP)
        self.shop.after_effect = hang
        first = asyncio.ensure_future(self.ledger.call(self.tool, self.ctx, LAMP))
        await asyncio.sleep(0.5)
        impatient = intentd.GuardedTool(**{**self.tool.__dict__, "wait_in_progress": 0.5})
        other = intentd.Ledger(self.client, worker="other-host", ttl=3)
        said = await other.call(impatient, self.ctx, LAMP)
        await other.close()
        self.assertEqual(said.status, "in_progress")
        self.assertIn("do not retry now", said.text)
        first.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await first
        self.assertEqual(self.shop.effects(provider, said.key), 1)

    async def test_a_hosts_mistakes_say_what_to_do(self) -> None:
        """A call without an argument its params name, and a Ledger given
        the thread client, raise errors that name the fix."""
        with self.assertRaisesRegex(TypeError, r"^buy_item: no argument 'max_eur', which its params name; the call's arguments: \['item'\]$"):
            await self.ledger.call(self.tool, self.ctx, {"item": "desk lamp"})
        with intentd.Client(server.address) as threads:
            with self.assertRaisesRegex(TypeError, "give it an intentd.aio.AsyncClient, not an intentd.Client"):
                intentd.Ledger(threads)

    async def test_the_key_is_the_identity_not_the_call(self) -> None:
        """The key is the action and the host's identity fields: another
        conversation is another intent; the same one is the same, whatever
        else the call carries."""
        a = await self.ledger.terms(self.tool, self.ctx, LAMP)
        b = await self.ledger.terms(self.tool, Conversation(), LAMP)
        c = await self.ledger.terms(self.tool, self.ctx, dict(LAMP, max_eur=5))
        self.assertNotEqual(a.key, b.key)
        self.assertEqual(a.key, c.key)
        self.assertNotEqual(a.fingerprint, c.fingerprint)
        self.assertEqual(a.key, (await self.client.derive_key("buy-item", {"conversation": self.ctx.conversation_id, "item": "desk lamp"})).key)



class RepeatedRunsTest(unittest.TestCase):
    """One Ledger (one client) across several asyncio.run calls, as a host
    that calls a framework's run_sync each turn: each loop gets its own
    channel and session, and the second turn reads the statement."""

    def test_ledger_across_asyncio_runs(self) -> None:
        client = intentd.aio.AsyncClient(server.address, report_timeout=10)
        ledger = intentd.Ledger(client, worker="turns", ttl=3)
        shop, ctx = Shop(provider.url), Conversation()

        async def turn(approve: bool) -> intentd.Answer:
            if approve:
                await ledger.approve(shop.tool, ctx, LAMP)
            try:
                return await ledger.call(shop.tool, ctx, LAMP)
            finally:
                await ledger.close()

        first = asyncio.run(turn(True))
        again = asyncio.run(turn(False))
        self.assertEqual((first.status, again.status), ("executed", "replayed"))
        self.assertEqual(provider.effects(f"{first.key}:create-order"), 1)

    def test_sessions_of_ended_loops_are_let_go(self) -> None:
        """A host that never closes the ledger between turns keeps one
        session, not one per turn."""
        client = intentd.aio.AsyncClient(server.address, report_timeout=10)
        ledger = intentd.Ledger(client, worker="turns", ttl=3)

        async def turn() -> str:
            return (await ledger.session()).id

        ids = {asyncio.run(turn()) for _ in range(3)}
        self.assertEqual(len(ids), 3)  # a session per loop
        self.assertLessEqual(len(ledger._sessions), 1)
        self.assertLessEqual(len(client._per_loop), 1)


if __name__ == "__main__":
    unittest.main()
