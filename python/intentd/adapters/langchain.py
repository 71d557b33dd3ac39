"""Guarded tools for LangChain agents (``langchain.agents.create_agent``)
and LangGraph: tool-call middleware that composes with LangChain's
``HumanInTheLoopMiddleware``::

    from intentd.adapters.langchain import IntentdMiddleware, approve

    agent = create_agent(
        model, tools=[buy_item], context_schema=Conversation, checkpointer=InMemorySaver(),
        middleware=[
            HumanInTheLoopMiddleware(interrupt_on={"buy_item": True}),
            IntentdMiddleware(ledger, {"buy_item": BUY_ITEM}),   # inside: sees a reviewer's edits
        ],
    )
    result = await agent.ainvoke({"messages": [...]}, config, context=conversation)
    # the interrupt: a person decides, and approval registers the terms
    resume = await approve(ledger, {"buy_item": BUY_ITEM}, conversation, result["__interrupt__"][0].value, decisions)
    await agent.ainvoke(Command(resume=resume), config, context=conversation)

``BUY_ITEM`` is an :class:`intentd.GuardedTool` without ``execute``: the
LangChain tool is the effect, and reads its operation key from
:func:`intentd.current_attempt`. The identity comes from the run's context
(``runtime.context``) and the call's arguments, never from the tool-call id.
Guarded tools run on the async path (``ainvoke``, ``astream``).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, List, Mapping, Sequence

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage

from ..guard import GuardedTool, Ledger


class IntentdMiddleware(AgentMiddleware):
    """Runs the calls of the tools named in ``tools`` as guarded calls on
    ``ledger``; the model reads the :class:`intentd.Answer`'s text. Put it
    after ``HumanInTheLoopMiddleware`` in the list, so that it wraps the call
    the reviewer approved (or edited)."""

    def __init__(self, ledger: Ledger, tools: Mapping[str, GuardedTool]) -> None:
        super().__init__()
        self.ledger = ledger
        self.guarded = dict(tools)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        spec = self.guarded.get(request.tool_call["name"])
        if spec is None:
            return await handler(request)
        call = request.tool_call

        async def execute(att: Any) -> Any:
            got = await handler(request)
            if isinstance(got, ToolMessage):
                if got.status == "error":
                    raise RuntimeError(f"tool {call['name']} failed: {got.content}")
                return got.content
            return str(got)

        answer = await self.ledger.call(spec, request.runtime.context, dict(call["args"]), execute=execute)
        return ToolMessage(content=answer.text, tool_call_id=call["id"], name=call["name"])

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if request.tool_call["name"] in self.guarded:
            raise RuntimeError("intentd's guarded tools run on the async path: use ainvoke or astream")
        return handler(request)


async def approve(
    ledger: Ledger,
    tools: Mapping[str, GuardedTool],
    context: Any,
    request: Mapping[str, Any],
    decisions: Sequence[Mapping[str, Any]],
) -> Dict[str, List[Any]]:
    """The approval step of a ``HumanInTheLoopMiddleware`` interrupt:
    registers the terms of every guarded call a person approved (or edited:
    the edited arguments are what is approved), and returns the resume value
    (``Command(resume=...)``) with the decisions unchanged."""
    for action, decision in zip(request["action_requests"], decisions):
        spec = tools.get(action["name"])
        if spec is None or decision["type"] not in ("approve", "edit"):
            continue
        args = decision["edited_action"]["args"] if decision["type"] == "edit" else action["args"]
        await ledger.approve(spec, context, args)
    return {"decisions": list(decisions)}


__all__ = ["IntentdMiddleware", "approve"]
