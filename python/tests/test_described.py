"""Registering by action and identity, with a summary, against a live intentd."""

from __future__ import annotations

import unittest
import uuid

import intentd
from tests.live import Intentd


def setUpModule() -> None:
    global server
    server = Intentd()


def tearDownModule() -> None:
    server.stop()


class DescribedTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = intentd.Client(server.address)
        self.identity = {"order_id": "ORD-88412", "return_id": f"RA-{uuid.uuid4().hex[:12]}"}

    def test_register_derives_the_key_and_keeps_the_description(self) -> None:
        """register passes action, identity and summary through: with no key
        intentd derives it as derive_key does, and the intent carries all three."""
        resp = self.client.register(
            "", {"amount_cents": 4000, "currency": "USD"},
            action="refund.issue", identity=self.identity, summary="Refund 40.00 USD to Alice for ORD-88412",
        )
        self.assertTrue(resp.created)
        self.assertEqual(resp.intent.key, self.client.derive_key("refund.issue", self.identity).key)
        self.assertEqual(resp.intent.action, "refund.issue")
        self.assertEqual(dict(resp.intent.identity), self.identity)
        self.assertEqual(resp.intent.summary, "Refund 40.00 USD to Alice for ORD-88412")

    def test_a_key_that_is_not_the_derivation_is_refused(self) -> None:
        with self.assertRaises(intentd.InvalidArgument) as cm:
            self.client.register(f"refund-{uuid.uuid4().hex[:12]}", {"amount_cents": 4000}, action="refund.issue", identity=self.identity)
        self.assertEqual(cm.exception.field, "key")

    def test_register_request_for_acquire_and_children(self) -> None:
        req = intentd.Client.register_request("", {"a": 1}, action="refund.issue", identity=self.identity, summary="s")
        self.assertEqual((req.key, req.action, req.summary, dict(req.identity)), ("", "refund.issue", "s", self.identity))
        plain = intentd.Client.register_request("k", {"a": 1})
        self.assertFalse(plain.HasField("identity"))


if __name__ == "__main__":
    unittest.main()
