"""Guarded tools for the OpenAI Agents SDK: a function tool whose call is a
guarded call, and the approval step of its ``needs_approval`` interruptions::

    from intentd.adapters.openai_agents import approve, guarded_tool

    async def buy_item(ctx: RunContextWrapper[Conversation], item: str, max_eur: float) -> str:
        \"\"\"Buy one item for at most max_eur euros.\"\"\"
        order = await merchant.create_order(idempotency_key=intentd.current_attempt().operation_key("create-order"))
        ...

    agent = Agent(name="shopper", tools=[guarded_tool(ledger, BUY_ITEM, buy_item)])
    result = await Runner.run(agent, "buy the lamp", context=conversation)
    if result.interruptions:                          # a person decides; approval registers the terms
        state = result.to_state()
        for item in result.interruptions:
            await approve(ledger, {"buy_item": BUY_ITEM}, conversation, state, item)
        result = await Runner.run(agent, state)

The identity comes from the run's context object (``RunContextWrapper.context``)
and the call's arguments, never from the tool-call id; the tool function
reads its operation key from :func:`intentd.current_attempt`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from agents import FunctionTool, function_tool

from ..guard import GuardedTool, Ledger


def guarded_tool(ledger: Ledger, spec: GuardedTool, fn: Callable[..., Any], *, needs_approval: bool = True, **kwargs: Any) -> FunctionTool:
    """A FunctionTool for ``fn`` (as ``agents.function_tool`` makes it, with
    ``needs_approval`` on by default) whose every call is a guarded call on
    ``ledger``: the model reads the :class:`intentd.Answer`'s text. An
    exception in ``fn`` is not turned into text for the model before intentd
    hears of it: it decides the report (UNKNOWN, unless ``fn`` raised
    :class:`intentd.NotAttempted` or :class:`intentd.Final`)."""
    tool = function_tool(fn, failure_error_function=None, needs_approval=needs_approval, **kwargs)
    inner = tool.on_invoke_tool

    async def invoke(ctx: Any, input_json: str) -> str:
        args = json.loads(input_json) if input_json else {}
        answer = await ledger.call(spec, ctx.context, args, execute=lambda att: inner(ctx, input_json))
        return answer.text

    tool.on_invoke_tool = invoke
    return tool


async def approve(ledger: Ledger, guarded: Mapping[str, GuardedTool], context: Any, state: Any, item: Any) -> None:
    """The approval step of one ``needs_approval`` interruption: registers
    the call's terms when its tool is guarded, then approves it in the run
    state (``state.approve(item)``)."""
    spec = guarded.get(item.name or "")
    if spec is not None:
        await ledger.approve(spec, context, json.loads(item.arguments or "{}"))
    state.approve(item)


__all__ = ["approve", "guarded_tool"]
