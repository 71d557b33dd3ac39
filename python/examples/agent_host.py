"""An agent host: the tool an LLM agent calls to buy something, made safe.

The model decides *what* to buy; the host owns *how often*. The host derives
the intent key from the conversation and the tool's arguments (the business
identity, never a per-call id), registers the approval, and runs the task
with intentd's safe loop. The operation key sent to the merchant comes from
intentd (attempt.operation_key), never from the model. Whatever happens, the
model gets intentd's statement back as text, so a model that calls the tool
twice reads "already_completed … action_taken: none" instead of buying twice.

Every call carries one W3C ``traceparent`` made by hand (Debian ships no
OpenTelemetry for Python; with it, instrument the channel instead): an
intentd run with ``--otlp-endpoint`` records its spans of this run under
the trace id printed to stderr.

Run against a local intentd (`go run ./cmd/intentd`):

    PYTHONPATH=python:gen/python /usr/bin/python3 python/examples/agent_host.py
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import uuid
from typing import Dict, List

import intentd
from intent.v1 import intent_pb2


class Merchant:
    """A stand-in merchant that honours idempotency keys, as real ones must."""

    def __init__(self) -> None:
        self.orders: Dict[str, str] = {}

    def create_order(self, idempotency_key: str, item: str, max_eur: float) -> str:
        return self.orders.setdefault(idempotency_key, f"order-{len(self.orders) + 1}")

    def find_orders(self, idempotency_key: str) -> List[str]:
        return [self.orders[idempotency_key]] if idempotency_key in self.orders else []


class AgentHost:
    """Holds one worker session and exposes tools to the model."""

    def __init__(self, client: intentd.Client, session: intentd.Session, merchant: Merchant) -> None:
        self.client, self.session, self.merchant = client, session, merchant

    def buy_item(self, conversation_id: str, item: str, max_eur: float) -> str:
        """The tool the model calls. Returns text for the model's context."""
        identity = {"conversation": conversation_id, "item": item}
        key = self.client.derive_key("buy-item", identity).key
        self.client.register(key, {"item": item, "max_eur": max_eur})

        def execute(att: intentd.Attempt) -> intent_pb2.Result:
            order = self.merchant.create_order(att.operation_key("create-order"), item, max_eur)
            return intent_pb2.Result(payload=json.dumps({"order_id": order}).encode(), external_refs={"order_id": order})

        def reconcile(att: intentd.Attempt) -> intentd.Evidence:
            found = self.merchant.find_orders(att.operation_key("create-order"))
            if not found:
                return intentd.absent("merchant has no order under the operation key")
            return intentd.found(intent_pb2.Result(external_refs={"order_id": found[0]}))

        try:
            out = self.session.run(intentd.Task(key=key, execute=execute, reconcile=reconcile))
        except intentd.FingerprintMismatch:
            return "refused: this purchase was approved with other terms; ask the user"
        if out.statement is not None and out.statement.text:
            return out.statement.text  # a replay: "already_completed ... action_taken: none"
        if out.name == "OUTCOME_COMPLETED":
            return f"completed: order {out.result.external_refs['order_id']} placed (action_taken: recorded)"
        return f"not done: {out.name} ({intent_pb2.State.Name(out.intent.state)}); do not retry on your own"


def traceparent() -> str:
    """A W3C trace context for a new, sampled trace: version 00, a random
    trace id and parent span id, flags 01 (sampled)."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:7650", help="intentd's gRPC address")
    args = ap.parse_args()
    trace = traceparent()
    print("trace", trace.split("-")[1], file=sys.stderr)
    with intentd.Client(args.target, metadata=[("traceparent", trace)]) as client, client.open_session("agent-host", ttl=15) as session:
        host = AgentHost(client, session, Merchant())
        conversation = uuid.uuid4().hex
        # The model calls the tool, then (having lost track) calls it again.
        for _ in range(2):
            print("tool ->", host.buy_item(conversation, "desk lamp", 89))
        print("orders at the merchant:", len(host.merchant.orders))


if __name__ == "__main__":
    main()
