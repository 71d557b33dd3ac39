"""The stand-in merchant of the examples: it honours idempotency keys, as a
real provider must, and counts the orders it holds."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import intentd
from intent.v1 import intent_pb2


class Merchant:
    def __init__(self) -> None:
        self.orders: Dict[str, str] = {}

    async def create_order(self, idempotency_key: str, item: str) -> str:
        return self.orders.setdefault(idempotency_key, f"order-{len(self.orders) + 1}")

    async def find_orders(self, idempotency_key: str) -> List[str]:
        return [self.orders[idempotency_key]] if idempotency_key in self.orders else []


merchant = Merchant()


async def find_order(att: intentd.Attempt, args: Mapping[str, Any]) -> intentd.Evidence:
    """Reconcile: ask the merchant by operation key, never guess."""
    found = await merchant.find_orders(att.operation_key("create-order"))
    if not found:
        return intentd.absent("no order under the operation key")
    return intentd.found(intent_pb2.Result(external_refs={"order_id": found[0]}))
