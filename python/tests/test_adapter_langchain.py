"""intentd.adapters.langchain with LangChain's create_agent, its
HumanInTheLoopMiddleware and LangGraph's checkpointer, driven by LangChain's
own fake chat model (no network, no model), against a live intentd and the
effect-counting provider."""

from __future__ import annotations

import asyncio
import itertools
import json
import unittest
from typing import Any, List

from tests.frameworks import framework
from tests.live import Intentd, Provider
from tests.shop import Conversation, Shop, crash

langchain, SKIP = framework("langchain", "langgraph")

if langchain is not None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    import intentd
    import intentd.aio
    from intentd.adapters.langchain import IntentdMiddleware, approve

    class ScriptedModel(GenericFakeChatModel):
        """LangChain's fake chat model, answering from its script; tools are
        bound by name only (the script already holds the calls)."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
            return self


def setUpModule() -> None:
    global server, provider
    if langchain is None:
        return
    server, provider = Intentd(), Provider()


def tearDownModule() -> None:
    if langchain is None:
        return
    provider.stop()
    server.stop()


LAMP = {"item": "desk lamp", "max_eur": 89}
_ids = itertools.count(1)


def buys(args: dict) -> List[Any]:
    """A script: the model calls buy_item with args (a fresh call id each
    time, as a regenerated call has), then says it is done."""
    return [AIMessage(content="", tool_calls=[{"name": "buy_item", "args": args, "id": f"call-{next(_ids)}"}]), AIMessage(content="done")]


@unittest.skipIf(langchain is None, SKIP)
class LangChainTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.client = intentd.aio.AsyncClient(server.address, report_timeout=10)
        self.ledger = intentd.Ledger(self.client, worker="langchain-host", ttl=3)
        self.shop = Shop(provider.url)
        self.spec = {"buy_item": self.shop.spec()}
        self.ctx = Conversation()
        shop = self.shop

        @tool
        async def buy_item(item: str, max_eur: float) -> str:
            """Buy one item for at most max_eur euros."""
            return json.dumps(await shop.place(intentd.current_attempt(), item))

        self.tool = buy_item

    async def asyncTearDown(self) -> None:
        await self.ledger.close()
        await self.client.close()

    def agent(self, script: List[Any], hitl: bool = True) -> Any:
        middleware: list = [HumanInTheLoopMiddleware(interrupt_on={"buy_item": True})] if hitl else []
        middleware.append(IntentdMiddleware(self.ledger, self.spec))
        return create_agent(ScriptedModel(messages=iter(script)), tools=[self.tool], middleware=middleware,
                            context_schema=Conversation, checkpointer=InMemorySaver())

    async def run_approved(self, args: dict, thread: str) -> str:
        """One turn: the model calls buy_item, the person approves (Register),
        the run resumes; the tool's message as the model reads it."""
        agent = self.agent(buys(args))
        config = {"configurable": {"thread_id": thread}}
        first = await agent.ainvoke({"messages": [{"role": "user", "content": "buy the lamp"}]}, config, context=self.ctx)
        request = first["__interrupt__"][0].value
        resume = await approve(self.ledger, self.spec, self.ctx, request, [{"type": "approve"}])
        done = await agent.ainvoke(Command(resume=resume), config, context=self.ctx)
        return tool_text(done)

    async def key(self, args: dict = LAMP) -> str:
        return (await self.ledger.terms(self.spec["buy_item"], self.ctx, args)).key

    async def test_same_args_other_call_ids_one_effect(self) -> None:
        first = await self.run_approved(LAMP, "t1")
        self.assertIn("order_id", first)
        again = await self.run_approved(LAMP, "t2")  # the call again, another call id and thread
        self.assertTrue(again.startswith("already_completed: intent "), again)
        self.assertIn("action_taken: none", again)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)

    async def test_crash_after_the_effect_then_reconciled(self) -> None:
        self.shop.after_effect = crash
        said = await self.run_approved(LAMP, "t1")
        self.assertIn("under human review; do not retry", said)
        self.shop.after_effect = None
        again = await self.run_approved(LAMP, "t2")
        self.assertIn("had taken effect in an earlier attempt", again)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)

    async def test_two_runs_at_once_one_effect(self) -> None:
        async def slow() -> None:
            await asyncio.sleep(0.3)

        self.shop.after_effect = slow
        said = await asyncio.gather(self.run_approved(LAMP, "t1"), self.run_approved(LAMP, "t2"))
        self.assertEqual(sum("order_id" in s and not s.startswith("already_completed") for s in said), 1, said)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)

    async def test_other_terms_than_approved_are_refused(self) -> None:
        await self.ledger.approve(self.spec["buy_item"], self.ctx, LAMP)  # approved earlier: 89 EUR
        agent = self.agent(buys(dict(LAMP, max_eur=890)), hitl=False)
        done = await agent.ainvoke({"messages": [{"role": "user", "content": "buy it anyway"}]},
                                   {"configurable": {"thread_id": "t1"}}, context=self.ctx)
        said = tool_text(done)
        self.assertTrue(said.startswith("refused: FINGERPRINT_MISMATCH"), said)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 0)

    async def test_resuming_the_saved_state_again_does_not_repeat(self) -> None:
        """Resume from the checkpoint saved at the interrupt a second time
        (a host that crashed after resuming and resumes again): LangGraph
        runs the tool call again; intentd answers with the statement."""
        agent = self.agent(buys(LAMP) + [AIMessage(content="done")])
        config = {"configurable": {"thread_id": "t1"}}
        first = await agent.ainvoke({"messages": [{"role": "user", "content": "buy the lamp"}]}, config, context=self.ctx)
        request = first["__interrupt__"][0].value
        resume = await approve(self.ledger, self.spec, self.ctx, request, [{"type": "approve"}])
        at_interrupt = (await agent.aget_state(config)).config
        done = await agent.ainvoke(Command(resume=resume), config, context=self.ctx)
        self.assertIn("order_id", tool_text(done))
        replayed = await agent.ainvoke(Command(resume=resume), at_interrupt, context=self.ctx)
        said = tool_text(replayed)
        self.assertTrue(said.startswith("already_completed: intent "), said)
        self.assertEqual(provider.effects(f"{await self.key()}:create-order"), 1)

    async def test_edited_by_the_reviewer_runs_the_edited_terms(self) -> None:
        """A reviewer edits the call (a lower price limit): the edit is what
        is approved and what runs; the model's own terms were never approved."""
        agent = self.agent(buys(dict(LAMP, max_eur=120)))
        config = {"configurable": {"thread_id": "t1"}}
        first = await agent.ainvoke({"messages": [{"role": "user", "content": "buy the lamp"}]}, config, context=self.ctx)
        decision = {"type": "edit", "edited_action": {"name": "buy_item", "args": LAMP}}
        resume = await approve(self.ledger, self.spec, self.ctx, first["__interrupt__"][0].value, [decision])
        done = await agent.ainvoke(Command(resume=resume), config, context=self.ctx)
        self.assertIn("order_id", tool_text(done))
        intent = await self.client.get(await self.key())
        self.assertEqual(intent.params["max_eur"], 89)


def tool_text(state: Any) -> str:
    """The last tool message the model read."""
    msgs = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert msgs, state
    return str(msgs[-1].content)


if __name__ == "__main__":
    unittest.main()
