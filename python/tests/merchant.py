"""The worker side of the test provider: what a task's execute and reconcile call."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import List

import intentd
from intent.v1 import intent_pb2


def create_order(url: str, operation_key: str) -> str:
    """Places an order under the idempotency key operation_key."""
    body = json.dumps({"operation_key": operation_key}).encode()
    req = urllib.request.Request(url + "/orders", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)["order_id"]


def orders(url: str, operation_key: str) -> List[str]:
    """The orders placed under operation_key."""
    q = urllib.parse.urlencode({"operation_key": operation_key})
    with urllib.request.urlopen(f"{url}/orders?{q}", timeout=10) as resp:
        return json.load(resp)["orders"]


def order_result(order_id: str) -> intent_pb2.Result:
    return intent_pb2.Result(payload=json.dumps({"order_id": order_id}).encode(), external_refs={"order_id": order_id})


def reconcile(url: str):
    """A task's reconcile: ask the merchant by operation key, never guess."""

    def look(att: intentd.Attempt) -> intentd.Evidence:
        found = orders(url, att.operation_key("create-order"))
        if len(found) == 1:
            return intentd.found(order_result(found[0]))
        if not found:
            return intentd.absent("merchant has no order for the operation key")
        return intentd.undecided(f"merchant shows {len(found)} orders")

    return look
