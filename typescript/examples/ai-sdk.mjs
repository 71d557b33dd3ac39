// A guarded AI SDK tool: the person approves buy_item (Register), the tool
// runs once (Acquire with the approved fingerprint), and a second, identical
// call from the model is answered from intentd without a second order.
// MockLanguageModelV4 stands in for your provider's model.
import { generateText } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { Client, Ledger, currentAttempt, guarded } from "intentd";
import { approve, guardedTool } from "intentd/ai";

const ledger = new Ledger(new Client({ address: process.env.INTENTD_ADDR ?? "127.0.0.1:7650" }));
const orders = []; // the merchant's orders: [idempotency key, order id]

// What makes one call one intent: identity from the host's context, terms from the arguments.
const BUY_ITEM = guarded({
  name: "buy_item",
  action: "buy-item",
  identity: (ctx, args) => ({ conversation: ctx.conversationId, item: args.item }),
  params: ["item", "max_eur"],
});
const tools = {
  buy_item: guardedTool(ledger, BUY_ITEM, {
    description: "Buy one item for at most max_eur euros.",
    inputSchema: z.object({ item: z.string(), max_eur: z.number() }),
    contextSchema: z.object({ conversationId: z.string() }),
    execute: async ({ item }) => {
      const orderId = `order-${orders.length + 1}`;
      orders.push([currentAttempt().operationKey("create-order"), orderId]); // the merchant's idempotency key
      return { order_id: orderId, item };
    },
  }),
};

const conversation = { conversationId: `c-${Date.now()}` };
const settings = { tools, toolsContext: { buy_item: conversation }, toolApproval: { buy_item: "user-approval" } };

for (const turn of [1, 2]) {
  const model = scriptedModel(); // asks for buy_item, then reads its output
  const messages = [{ role: "user", content: "buy the desk lamp, at most 89 EUR" }];
  const first = await generateText({ ...settings, model, messages });
  const responses = [];
  for (const request of first.content.filter((p) => p.type === "tool-approval-request")) {
    responses.push(await approve(ledger, { buy_item: BUY_ITEM }, conversation, request)); // the person said yes
  }
  await generateText({ ...settings, model, messages: [...messages, ...first.response.messages, { role: "tool", content: responses }] });
  console.log(`turn ${turn}: the model read: ${model.read}`);
}
console.log(`orders placed: ${orders.length}`);
await ledger.close();

function scriptedModel() {
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
  const model = new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const last = prompt.at(-1);
      if (last.role === "tool") {
        model.read = last.content.map((p) => (typeof p.output?.value === "string" ? p.output.value : JSON.stringify(p.output?.value))).join(" ");
        return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
      }
      const input = JSON.stringify({ item: "desk lamp", max_eur: 89 });
      return { content: [{ type: "tool-call", toolCallId: `call-${Math.random()}`, toolName: "buy_item", input }], finishReason: { unified: "tool-calls", raw: undefined }, usage, warnings: [] };
    },
  });
  return model;
}
