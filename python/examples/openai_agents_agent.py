"""OpenAI Agents SDK: buy_item needs approval, so the run is interrupted;
the approval registers the terms and approves the call in the run state
(approval → Register), and guarded_tool runs the tool as a guarded call
(tool → Acquire). The model calls the tool in two runs, under two call
ids: one order.

The model is the SDK's ScriptedModel (no network): give the Agent your own
model instead.

    python examples/openai_agents_agent.py --target 127.0.0.1:7650
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import uuid

from agents import Agent, RunContextWrapper, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

import intentd
import intentd.aio
from intentd.adapters.openai_agents import approve, guarded_tool
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


async def buy_item(ctx: RunContextWrapper[Conversation], item: str, max_eur: float) -> str:
    """Buy one item for at most max_eur euros."""
    order = await merchant.create_order(intentd.current_attempt().operation_key("create-order"), item)
    return f"ordered {item}: {order}"


def model() -> ScriptedModel:
    call = lambda n: [function_call("buy_item", {"item": "desk lamp", "max_eur": 89}, call_id=f"call-{n}")]
    return ScriptedModel([call(1), [assistant_message("Ordered.")], call(2), [assistant_message("Done.")]])


async def main(target: str) -> None:
    set_tracing_disabled(True)  # the scripted model's runs export no traces
    async with intentd.aio.AsyncClient(target) as client:
        ledger = intentd.Ledger(client, worker="openai-agents-host")
        agent = Agent(name="shopper", model=model(), tools=[guarded_tool(ledger, BUY_ITEM, buy_item)])
        conversation = Conversation(uuid.uuid4().hex)
        for _ in range(2):
            result = await Runner.run(agent, "Buy the desk lamp, at most 89 EUR.", context=conversation)
            if result.interruptions:  # a person approves: Register
                state = result.to_state()
                for item in result.interruptions:
                    await approve(ledger, {"buy_item": BUY_ITEM}, conversation, state, item)
                result = await Runner.run(agent, state)
            said = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
            print("tool ->", said[-1])
        print("orders at the merchant:", len(merchant.orders))
        await ledger.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:7650", help="intentd's gRPC address")
    asyncio.run(main(ap.parse_args().target))
