"""intentd.adapters.pydantic_ai with a Pydantic AI agent, its deferred-tool
approvals and its own FunctionModel (no network, no model), against a live
intentd and the effect-counting provider."""

from __future__ import annotations

import asyncio
import itertools
import json
import unittest
from typing import Any, List

from tests.frameworks import framework
from tests.live import Intentd, Provider
from tests.shop import Conversation, Shop, crash

pydantic_ai, SKIP = framework("pydantic_ai")

if pydantic_ai is not None:
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.tools import DeferredToolRequests

    import intentd
    import intentd.aio
    from intentd.adapters.pydantic_ai import IntentdCapability, approve


def setUpModule() -> None:
    global server, provider
    if pydantic_ai is None:
        return
    server, provider = Intentd(), Provider()


def tearDownModule() -> None:
    if pydantic_ai is None:
        return
    provider.stop()
    server.stop()


LAMP = {"item": "desk lamp", "max_eur": 89}
_ids = itertools.count(1)


def buys(args: dict) -> "FunctionModel":
    """Pydantic AI's FunctionModel: calls buy_item with args under a fresh
    call id (as a regenerated call has), then answers once it read the
    tool's return."""

    def model(messages: List[Any], info: "AgentInfo") -> "ModelResponse":
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("buy_item", dict(args), tool_call_id=f"call-{next(_ids)}")])

    return FunctionModel(model)


@unittest.skipIf(pydantic_ai is None, SKIP)
class PydanticAITest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.client = intentd.aio.AsyncClient(server.address, report_timeout=10)
        self.ledger = intentd.Ledger(self.client, worker="pydantic-ai-host", ttl=3)
        self.shop = Shop(provider.url)
        self.spec = {"buy_item": self.shop.spec()}
        self.deps = Conversation()

    async def asyncTearDown(self) -> None:
        await self.ledger.close()
        await self.client.close()

    def agent(self, approval: bool = True) -> "Agent":
        agent = Agent(deps_type=Conversation, output_type=[str, DeferredToolRequests],
                      capabilities=[IntentdCapability(self.ledger, self.spec)])
        shop = self.shop

        @agent.tool(requires_approval=approval)
        async def buy_item(ctx: RunContext[Conversation], item: str, max_eur: float) -> str:
            """Buy one item for at most max_eur euros."""
            return json.dumps(await shop.place(intentd.current_attempt(), item))

        return agent

    async def run_approved(self, args: dict) -> str:
        """The model calls buy_item, the run defers it, a person approves
        (Register), the run resumes; the tool's return as the model read it."""
        agent = self.agent()
        first = await agent.run("buy the lamp", model=buys(args), deps=self.deps)
        self.assertIsInstance(first.output, DeferredToolRequests)
        decisions = {call.tool_call_id: True for call in first.output.approvals}
        results = await approve(self.ledger, self.spec, self.deps, first.output, decisions)
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results, model=buys(args), deps=self.deps)
        return tool_text(done.all_messages())

    async def key(self, args: dict = LAMP) -> str:
        return (await self.ledger.terms(self.spec["buy_item"], self.deps, args)).key

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
        await self.ledger.approve(self.spec["buy_item"], self.deps, LAMP)  # approved earlier: 89 EUR
        done = await self.agent(approval=False).run("buy it anyway", model=buys(dict(LAMP, max_eur=890)), deps=self.deps)
        said = tool_text(done.all_messages())
        self.assertTrue(said.startswith("refused: FINGERPRINT_MISMATCH"), said)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 0)

    async def test_override_args_are_what_is_approved(self) -> None:
        """The person approves with other arguments (ToolApproved's
        override_args): those are registered, and those run."""
        agent = self.agent()
        first = await agent.run("buy the lamp", model=buys(dict(LAMP, max_eur=120)), deps=self.deps)
        call = first.output.approvals[0]
        decisions = {call.tool_call_id: pydantic_ai.tools.ToolApproved(override_args=LAMP)}
        results = await approve(self.ledger, self.spec, self.deps, first.output, decisions)
        done = await agent.run(message_history=first.all_messages(), deferred_tool_results=results, model=buys(LAMP), deps=self.deps)
        self.assertIn("order_id", tool_text(done.all_messages()))
        self.assertEqual((await self.client.get(await self.key())).params["max_eur"], 89)

    async def test_resuming_the_saved_state_again_does_not_repeat(self) -> None:
        """The run's saved messages and the approvals, resumed twice (a host
        that crashed after resuming and resumes again): Pydantic AI runs the
        approved call again; intentd answers with the statement."""
        agent = self.agent()
        first = await agent.run("buy the lamp", model=buys(LAMP), deps=self.deps)
        decisions = {call.tool_call_id: True for call in first.output.approvals}
        results = await approve(self.ledger, self.spec, self.deps, first.output, decisions)
        saved = ModelMessagesTypeAdapter.dump_json(first.all_messages())
        said = []
        for _ in range(2):
            history = ModelMessagesTypeAdapter.validate_json(saved)
            done = await agent.run(message_history=history, deferred_tool_results=results, model=buys(LAMP), deps=self.deps)
            said.append(tool_text(done.all_messages()))
        self.assertIn("order_id", said[0])
        self.assertTrue(said[1].startswith("already_completed: intent "), said[1])
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)


def tool_text(messages: List[Any]) -> str:
    """The last buy_item return the model read."""
    parts = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart) and p.tool_name == "buy_item"]
    assert parts, messages
    return str(parts[-1].content)


if __name__ == "__main__":
    unittest.main()
