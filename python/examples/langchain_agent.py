"""LangChain / LangGraph: HumanInTheLoopMiddleware asks a person before
buy_item runs; the approval registers the terms (approval → Register), and
IntentdMiddleware runs the tool as a guarded call (tool → Acquire). The
model calls the tool in two turns, under two call ids: one order.

The model is LangChain's fake chat model, scripted (no network): put your
own chat model in model().

    python examples/langchain_agent.py --target 127.0.0.1:7650
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import uuid
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import intentd
import intentd.aio
from intentd.adapters.langchain import IntentdMiddleware, approve
from shop import find_order, merchant


@dataclasses.dataclass
class Conversation:
    conversation_id: str


BUY_ITEM = intentd.GuardedTool(
    name="buy_item",
    action="buy-item",
    identity=lambda ctx, args: {"conversation": ctx.conversation_id, "item": args["item"]},
    params=("item", "max_eur"),
    reconcile=find_order,
)


@tool
async def buy_item(item: str, max_eur: float) -> str:
    """Buy one item for at most max_eur euros."""
    order = await merchant.create_order(intentd.current_attempt().operation_key("create-order"), item)
    return f"ordered {item}: {order}"


def model() -> Any:
    class Scripted(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> "Scripted":
            return self

    call = lambda n: AIMessage(content="", tool_calls=[{"name": "buy_item", "args": {"item": "desk lamp", "max_eur": 89}, "id": f"call-{n}"}])
    return Scripted(messages=iter([call(1), AIMessage(content="Ordered."), call(2), AIMessage(content="Done.")]))


async def main(target: str) -> None:
    async with intentd.aio.AsyncClient(target) as client:
        ledger = intentd.Ledger(client, worker="langchain-host")
        agent = create_agent(
            model(), tools=[buy_item], context_schema=Conversation, checkpointer=InMemorySaver(),
            middleware=[
                HumanInTheLoopMiddleware(interrupt_on={"buy_item": True}),
                IntentdMiddleware(ledger, {"buy_item": BUY_ITEM}),
            ],
        )
        conversation = Conversation(uuid.uuid4().hex)
        config = {"configurable": {"thread_id": conversation.conversation_id}}
        for _ in range(2):
            result = await agent.ainvoke({"messages": [{"role": "user", "content": "Buy the desk lamp, at most 89 EUR."}]},
                                         config, context=conversation)
            for pending in result.get("__interrupt__", []):  # a person approves: Register
                decisions = [{"type": "approve"} for _ in pending.value["action_requests"]]
                resume = await approve(ledger, {"buy_item": BUY_ITEM}, conversation, pending.value, decisions)
                result = await agent.ainvoke(Command(resume=resume), config, context=conversation)
            print("tool ->", result["messages"][-2].content)
        print("orders at the merchant:", len(merchant.orders))
        await ledger.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:7650", help="intentd's gRPC address")
    asyncio.run(main(ap.parse_args().target))
