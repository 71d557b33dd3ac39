"""Pydantic AI: buy_item requires approval, so the run ends in
DeferredToolRequests; the approval registers the terms (approval →
Register), and IntentdCapability runs the tool as a guarded call (tool →
Acquire). The model calls the tool in two runs, under two call ids: one
order.

The model is Pydantic AI's FunctionModel, scripted (no network): pass your
own model to Agent.

    python examples/pydantic_ai_agent.py --target 127.0.0.1:7650
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import uuid
from typing import Any, List

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

import intentd
import intentd.aio
from intentd.adapters.pydantic_ai import IntentdCapability, approve
from shop import find_order, merchant


@dataclasses.dataclass
class Conversation:
    conversation_id: str


BUY_ITEM = intentd.GuardedTool(
    name="buy_item",
    action="buy-item",
    identity=lambda deps, args: {"conversation": deps.conversation_id, "item": args["item"]},
    params=("item", "max_eur"),
    reconcile=find_order,
)

_calls = itertools.count(1)


def model(messages: List[Any], info: AgentInfo) -> ModelResponse:
    if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
        return ModelResponse(parts=[TextPart("Ordered.")])
    args = {"item": "desk lamp", "max_eur": 89}
    return ModelResponse(parts=[ToolCallPart("buy_item", args, tool_call_id=f"call-{next(_calls)}")])


async def main(target: str) -> None:
    async with intentd.aio.AsyncClient(target) as client:
        ledger = intentd.Ledger(client, worker="pydantic-ai-host")
        agent = Agent(FunctionModel(model), deps_type=Conversation, output_type=[str, DeferredToolRequests],
                      capabilities=[IntentdCapability(ledger, {"buy_item": BUY_ITEM})])

        @agent.tool(requires_approval=True)
        async def buy_item(ctx: RunContext[Conversation], item: str, max_eur: float) -> str:
            """Buy one item for at most max_eur euros."""
            order = await merchant.create_order(intentd.current_attempt().operation_key("create-order"), item)
            return f"ordered {item}: {order}"

        conversation = Conversation(uuid.uuid4().hex)
        for _ in range(2):
            result = await agent.run("Buy the desk lamp, at most 89 EUR.", deps=conversation)
            if isinstance(result.output, DeferredToolRequests):  # a person approves: Register
                decisions = {call.tool_call_id: True for call in result.output.approvals}
                results = await approve(ledger, {"buy_item": BUY_ITEM}, conversation, result.output, decisions)
                result = await agent.run(message_history=result.all_messages(), deferred_tool_results=results, deps=conversation)
            said = [p.content for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
            print("tool ->", said[-1])
        print("orders at the merchant:", len(merchant.orders))
        await ledger.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:7650", help="intentd's gRPC address")
    asyncio.run(main(ap.parse_args().target))
