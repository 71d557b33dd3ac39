"""Guarded tools for Pydantic AI: a capability around tool execution
(``wrap_tool_execute``) and the approval step of its deferred tools::

    from intentd.adapters.pydantic_ai import IntentdCapability, approve

    agent = Agent(model, deps_type=Conversation, output_type=[str, DeferredToolRequests],
                  capabilities=[IntentdCapability(ledger, {"buy_item": BUY_ITEM})])

    @agent.tool(requires_approval=True)
    async def buy_item(ctx: RunContext[Conversation], item: str, max_eur: float) -> str:
        order = await merchant.create_order(idempotency_key=intentd.current_attempt().operation_key("create-order"))
        ...

    result = await agent.run("buy the lamp", deps=conversation)
    if isinstance(result.output, DeferredToolRequests):        # a person decides; approval registers the terms
        results = await approve(ledger, {"buy_item": BUY_ITEM}, conversation, result.output, {call_id: True})
        result = await agent.run(message_history=result.all_messages(), deferred_tool_results=results, deps=conversation)

The identity comes from the run's ``deps`` and the call's validated
arguments, never from the tool-call id; the tool reads its operation key
from :func:`intentd.current_attempt`.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

from ..guard import GuardedTool, Ledger


@dataclass
class IntentdCapability(AbstractCapability[Any]):
    """Runs the tools named in ``guarded`` as guarded calls on ``ledger``;
    the model reads the :class:`intentd.Answer`'s text."""

    ledger: Ledger
    guarded: Mapping[str, GuardedTool] = field(default_factory=dict)
    _: KW_ONLY
    id: Optional[str] = None

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Dict[str, Any], handler: Any) -> Any:
        spec = self.guarded.get(call.tool_name)
        if spec is None:
            return await handler(args)

        async def execute(att: Any) -> Any:
            return await handler(args)

        answer = await self.ledger.call(spec, ctx.deps, dict(args), execute=execute)
        return answer.text


async def approve(
    ledger: Ledger,
    guarded: Mapping[str, GuardedTool],
    deps: Any,
    requests: DeferredToolRequests,
    decisions: Mapping[str, Union[bool, ToolApproved, ToolDenied]],
) -> DeferredToolResults:
    """The approval step of a run that ended in ``DeferredToolRequests``:
    registers the terms of every guarded call a person approved (with
    ``ToolApproved(override_args=...)``, those arguments are what is
    approved), and returns the ``DeferredToolResults`` to resume with."""
    for call in requests.approvals:
        decision = decisions.get(call.tool_call_id, False)
        spec = guarded.get(call.tool_name)
        if spec is None or decision is False or isinstance(decision, ToolDenied):
            continue
        args = requests.validated_args.get(call.tool_call_id) or call.args_as_dict()
        if isinstance(decision, ToolApproved) and decision.override_args is not None:
            args = decision.override_args
        await ledger.approve(spec, deps, args)
    return DeferredToolResults(approvals=dict(decisions))


__all__ = ["IntentdCapability", "approve"]
