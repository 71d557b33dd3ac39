"""A guarded tool on the effect-counting provider (tests/live.py), shared by
the guarded-tool tests and every adapter's: buy_item, whose identity is the
host's conversation and the item, and whose approved terms are the item
and the price limit."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any, Awaitable, Callable, Mapping, Optional

import intentd
from tests import merchant


@dataclasses.dataclass
class Conversation:
    """The host's own context: what identifies the user's request. The
    framework's tool-call id is not in it."""

    conversation_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)


class Shop:
    """The provider side of buy_item, with a switch for what happens after
    the order was placed (a crash, a hang until cancelled)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.after_effect: Optional[Callable[[], Awaitable[None]]] = None
        self.tool = self._tool()

    def _tool(self) -> intentd.GuardedTool:
        shop = self

        async def reconcile(att: intentd.Attempt, args: Mapping[str, Any]) -> intentd.Evidence:
            return await asyncio.to_thread(merchant.reconcile(shop.url), att)

        @intentd.guarded(
            name="buy_item",
            action="buy-item",
            identity=lambda ctx, args: {"conversation": ctx.conversation_id, "item": args["item"]},
            params=("item", "max_eur"),
            reconcile=reconcile,
            summary=lambda ctx, args: f"Buy {args['item']} for at most {args['max_eur']} EUR",
            wait_in_progress=10,
        )
        async def buy_item(att: intentd.Attempt, args: Mapping[str, Any]) -> dict:
            return await shop.place(att, args["item"])

        return buy_item

    async def place(self, att: intentd.Attempt, item: str) -> dict:
        """The effect: one order under the attempt's operation key, then
        whatever after_effect does."""
        order = await asyncio.to_thread(merchant.create_order, self.url, att.operation_key("create-order"))
        if self.after_effect is not None:
            await self.after_effect()
        return {"order_id": order, "item": item}

    def spec(self) -> intentd.GuardedTool:
        """buy_item's spec without an effect of its own: for an adapter whose
        framework tool is the effect."""
        return dataclasses.replace(self.tool, execute=None)

    def effects(self, provider: Any, key: str) -> int:
        return provider.effects(f"{key}:create-order")


async def crash() -> None:
    raise ConnectionResetError("connection reset before the merchant's answer arrived")


async def hang() -> None:
    await asyncio.sleep(3600)
