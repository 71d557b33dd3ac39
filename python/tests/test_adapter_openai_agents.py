"""intentd.adapters.openai_agents with an OpenAI Agents SDK agent, its
needs_approval interruptions and run state, and the SDK's own ScriptedModel
(no network, no model), against a live intentd and the effect-counting
provider."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import unittest
from typing import Any

from tests.frameworks import framework
from tests.live import Intentd, Provider
from tests.shop import Conversation, Shop, crash

agents, SKIP = framework("agents")

if agents is not None:
    from agents import Agent, RunContextWrapper, Runner, RunState
    from agents.testing import ScriptedModel, assistant_message, function_call

    import intentd
    import intentd.aio
    from intentd.adapters.openai_agents import approve, guarded_tool


def setUpModule() -> None:
    global server, provider
    if agents is None:
        return
    agents.set_tracing_disabled(True)  # no trace export: the tests reach nothing but this machine
    server, provider = Intentd(), Provider()


def tearDownModule() -> None:
    if agents is None:
        return
    provider.stop()
    server.stop()


LAMP = {"item": "desk lamp", "max_eur": 89}
_ids = itertools.count(1)


def buys(args: dict, answers: int = 1) -> "ScriptedModel":
    """The SDK's ScriptedModel: calls buy_item with args under a fresh call
    id (as a regenerated call has), then answers "done" (once per resume)."""
    return ScriptedModel([[function_call("buy_item", args, call_id=f"call-{next(_ids)}")]] + [[assistant_message("done")]] * answers)


@unittest.skipIf(agents is None, SKIP)
class OpenAIAgentsTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.client = intentd.aio.AsyncClient(server.address, report_timeout=10)
        self.ledger = intentd.Ledger(self.client, worker="openai-agents-host", ttl=3)
        self.shop = Shop(provider.url)
        self.spec = {"buy_item": self.shop.spec()}
        self.ctx = Conversation()

    async def asyncTearDown(self) -> None:
        await self.ledger.close()
        await self.client.close()

    def agent(self, model: Any, approval: bool = True) -> "Agent":
        shop = self.shop

        async def buy_item(ctx: RunContextWrapper[Conversation], item: str, max_eur: float) -> str:
            """Buy one item for at most max_eur euros."""
            return json.dumps(await shop.place(intentd.current_attempt(), item))

        tool = guarded_tool(self.ledger, self.spec["buy_item"], buy_item, needs_approval=approval)
        return Agent(name="shopper", model=model, tools=[tool])

    async def run_approved(self, args: dict) -> str:
        """The model calls buy_item, the run is interrupted for approval, a
        person approves (Register), the run resumes; the tool's output as
        the model read it."""
        agent = self.agent(buys(args))
        first = await Runner.run(agent, "buy the lamp", context=self.ctx)
        self.assertEqual(len(first.interruptions), 1)
        state = first.to_state()
        for item in first.interruptions:
            await approve(self.ledger, self.spec, self.ctx, state, item)
        done = await Runner.run(agent, state)
        return tool_text(done)

    async def key(self, args: dict = LAMP) -> str:
        return (await self.ledger.terms(self.spec["buy_item"], self.ctx, args)).key

    async def test_same_args_other_call_ids_one_effect(self) -> None:
        first = await self.run_approved(LAMP)
        self.assertIn("order_id", first)
        again = await self.run_approved(LAMP)
        self.assertTrue(again.startswith("already_completed: intent "), again)
        self.assertIn("action_taken: none", again)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)

    async def test_crash_after_the_effect_then_reconciled(self) -> None:
        self.shop.after_effect = crash
        said = await self.run_approved(LAMP)
        self.assertIn("under human review; do not retry", said)
        self.shop.after_effect = None
        again = await self.run_approved(LAMP)
        self.assertIn("had taken effect in an earlier attempt", again)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)

    async def test_two_runs_at_once_one_effect(self) -> None:
        async def slow() -> None:
            await asyncio.sleep(0.3)

        self.shop.after_effect = slow
        said = await asyncio.gather(self.run_approved(LAMP), self.run_approved(LAMP))
        self.assertEqual(sum(not s.startswith("already_completed") for s in said), 1, said)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)

    async def test_other_terms_than_approved_are_refused(self) -> None:
        await self.ledger.approve(self.spec["buy_item"], self.ctx, LAMP)  # approved earlier: 89 EUR
        done = await Runner.run(self.agent(buys(dict(LAMP, max_eur=890)), approval=False), "buy it anyway", context=self.ctx)
        said = tool_text(done)
        self.assertTrue(said.startswith("refused: FINGERPRINT_MISMATCH"), said)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 0)

    async def test_resuming_the_saved_state_again_does_not_repeat(self) -> None:
        """The run state saved after approval (to_json), resumed twice (a
        host that crashed after resuming and resumes again): the SDK runs
        the approved call again; intentd answers with the statement."""
        agent = self.agent(buys(LAMP, answers=2))
        first = await Runner.run(agent, "buy the lamp", context=self.ctx)
        state = first.to_state()
        for item in first.interruptions:
            await approve(self.ledger, self.spec, self.ctx, state, item)
        saved = json.dumps(state.to_json(context_serializer=dataclasses.asdict))
        said = []
        for _ in range(2):
            resumed = await RunState.from_json(agent, json.loads(saved), context_deserializer=lambda d: Conversation(**d))
            said.append(tool_text(await Runner.run(agent, resumed)))
        self.assertIn("order_id", said[0])
        self.assertTrue(said[1].startswith("already_completed: intent "), said[1])
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)


def tool_text(result: Any) -> str:
    """The last tool output the model read."""
    outputs = [item.output for item in result.new_items if getattr(item, "type", "") == "tool_call_output_item"]
    assert outputs, result.new_items
    return str(outputs[-1])


if __name__ == "__main__":
    unittest.main()
