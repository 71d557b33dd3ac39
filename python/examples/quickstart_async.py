"""Async quick start: a guarded tool, approved once and called twice by the
model, places one order; the same call with edited terms is refused.

    python examples/quickstart_async.py --target 127.0.0.1:7650
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

import intentd
import intentd.aio
from shop import find_order, merchant


@intentd.guarded(
    action="buy-item",
    identity=lambda ctx, args: {"conversation": ctx["conversation"], "item": args["item"]},
    params=("item", "max_eur"),
    reconcile=find_order,
    summary=lambda ctx, args: f"Buy {args['item']} for at most {args['max_eur']} EUR",
)
async def buy_item(att: intentd.Attempt, args: dict) -> dict:
    order = await merchant.create_order(att.operation_key("create-order"), args["item"])
    return {"order_id": order}


async def main(target: str) -> None:
    async with intentd.aio.AsyncClient(target) as client:
        ledger = intentd.Ledger(client, worker="agent-host")
        ctx = {"conversation": uuid.uuid4().hex}                  # the host's context, never a tool-call id
        args = {"item": "desk lamp", "max_eur": 89}
        await ledger.approve(buy_item, ctx, args)                 # the approval: Register
        for _ in range(2):                                        # the model calls the tool twice
            print("tool ->", await ledger.call(buy_item, ctx, args))
        print("tool ->", await ledger.call(buy_item, ctx, dict(args, max_eur=890)))  # edited terms
        print("orders at the merchant:", len(merchant.orders))
        await ledger.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:7650", help="intentd's gRPC address")
    asyncio.run(main(ap.parse_args().target))
