// A worker: approve an intent, then run it twice. The first run executes
// (once, under the operation key), the second replays the stored result.
import { randomBytes } from "node:crypto";
import { Client } from "intentd";

const client = new Client({ address: process.env.INTENTD_ADDR ?? "127.0.0.1:7650" });

// Approval: intentd derives the key from the action and its identity.
const { intent } = await client.register({
  action: "buy-item",
  identity: { conversation: randomBytes(8).toString("hex"), item: "desk lamp" },
  params: { item: "desk lamp", max_eur: 89 },
});

const session = await client.openSession("node-worker", 15_000); // heartbeats on an unreferenced timer
try {
  for (let i = 1; i <= 2; i++) {
    const out = await session.run({
      key: intent.key,
      execute: async (attempt) => {
        // Call the merchant here, with attempt.operationKey("create-order") as its idempotency key.
        return { externalRefs: { order_id: `order-for-${attempt.key.slice(0, 8)}` } };
      },
      reconcile: async (attempt) => ({ verdict: "undecided", reason: "ask the merchant by operation key" }),
    });
    console.log(`run ${i}: ${out.name}, executed: ${out.executed}, order ${out.result.externalRefs.order_id}`);
  }
} finally {
  await session.close();
}
