// intentd/openai-agents with an OpenAI Agents SDK agent, its needsApproval
// interruptions and run state, and the SDK's own ScriptedModel (no
// network, no model), against a live intentd and the effect-counting
// provider: the five scenarios.
import { after, before, beforeEach, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { Agent, RunState, run, setTracingDisabled, type RunResult } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";
import { z } from "zod";
import { approve, guardedTool } from "../src/adapters/openai-agents.js";
import { Client, Ledger, currentAttempt } from "../src/index.js";
import { Intentd, Provider } from "./live.js";
import { LAMP, Shop, conversation, crash, type BuyArgs, type Conversation } from "./shop.js";

setTracingDisabled(true); // no trace export: the tests reach nothing but this machine

let server: Intentd;
let ledger: Ledger;
const provider = new Provider();
let shop: Shop;
let ctx: Conversation;
let calls = 0;

before(async () => {
  server = await Intentd.start();
  ledger = new Ledger(new Client({ address: server.address, reportTimeoutMs: 10_000 }), { worker: "openai-agents-host", ttlMs: 15_000 });
});
after(async () => {
  await ledger?.close();
  await server?.stop();
});
beforeEach(() => {
  shop = new Shop(provider);
  ctx = conversation();
});

/** The SDK's ScriptedModel: calls buy_item with args under a fresh call id, then answers "done" (once per resume). */
function buys(args: BuyArgs, answers = 1): ScriptedModel {
  return new ScriptedModel([[functionCall("buy_item", args, { callId: `call-${++calls}` })], ...Array.from({ length: answers }, () => [assistantMessage("done")])]);
}

function agent(model: ScriptedModel, approval = true) {
  const tool = guardedTool(ledger, shop.spec, {
    name: "buy_item",
    description: "Buy one item for at most max_eur euros.",
    parameters: z.object({ item: z.string(), max_eur: z.number() }),
    needsApproval: approval,
    execute: async (input: { item: string }) => JSON.stringify(await shop.place(currentAttempt(), input.item)),
  });
  return new Agent<Conversation>({ name: "shopper", model, tools: [tool] });
}

/** The last tool output the model read. */
function toolText(result: RunResult<Conversation, any>): string {
  const outputs = result.newItems.filter((i) => i.type === "tool_call_output_item").map((i) => (i as { output: unknown }).output);
  assert.ok(outputs.length > 0, JSON.stringify(result.newItems.map((i) => i.type)));
  const last = outputs.at(-1);
  return typeof last === "string" ? last : JSON.stringify(last);
}

/** The model calls buy_item, the run is interrupted, a person approves (Register), the run resumes. */
async function runApproved(args: BuyArgs): Promise<string> {
  const a = agent(buys(args));
  const first = await run(a, "buy the lamp", { context: ctx });
  assert.equal(first.interruptions.length, 1);
  for (const item of first.interruptions) await approve(ledger, { buy_item: shop.spec }, ctx, first.state, item);
  return toolText(await run(a, first.state));
}

const key = async (args: BuyArgs = LAMP) => (await ledger.terms(shop.spec, ctx, args)).key;

test("the same arguments under other call ids: one effect, and the replay statement", async () => {
  assert.match(await runApproved(LAMP), /order_id/);
  const again = await runApproved(LAMP);
  assert.match(again, /^already_completed: intent /);
  assert.match(again, /action_taken: none/);
  assert.equal(provider.effects(`${await key()}:create-order`), 1);
});

test("the effect, then a crash before Complete: UNKNOWN, under review; the next call reconciles", async () => {
  shop.afterEffect = crash;
  assert.match(await runApproved(LAMP), /under human review; do not retry/);
  shop.afterEffect = undefined;
  assert.match(await runApproved(LAMP), /had taken effect in an earlier attempt/);
  assert.equal(provider.effects(`${await key()}:create-order`), 1);
});

test("the effect, then the run's signal aborts: MarkUnknown, never Release; the next call reconciles", async () => {
  const ctl = new AbortController();
  shop.afterEffect = async () => {
    ctl.abort(new Error("the user pressed stop"));
    await sleep(50);
  };
  const a = agent(buys(LAMP));
  const first = await run(a, "buy the lamp", { context: ctx });
  for (const item of first.interruptions) await approve(ledger, { buy_item: shop.spec }, ctx, first.state, item);
  await run(a, first.state, { signal: ctl.signal }).catch(() => undefined); // the SDK ends the run or reports the tool's error
  const k = await key();
  const intent = await ledger.client.get(k);
  assert.equal(intent.history.at(-1)!.kind, 4 /* MARKED_UNKNOWN */, "the abort was reported as UNKNOWN");
  assert.match(intent.history.at(-1)!.reason, /aborted while executing .*the user pressed stop/);
  shop.afterEffect = undefined;
  assert.match(await runApproved(LAMP), /had taken effect in an earlier attempt/);
  assert.equal(provider.effects(`${k}:create-order`), 1);
});

test("two runs at once: one effect", async () => {
  shop.afterEffect = () => sleep(300);
  const said = await Promise.all([runApproved(LAMP), runApproved(LAMP)]);
  assert.equal(said.filter((s) => !s.startsWith("already_completed")).length, 1, said.join("\n"));
  assert.equal(provider.effects(`${await key()}:create-order`), 1);
});

test("terms other than the approved ones are refused, and nothing is sent", async () => {
  await ledger.approve(shop.spec, ctx, LAMP); // approved earlier: 89 EUR
  const done = await run(agent(buys({ ...LAMP, max_eur: 890 }), false), "buy it anyway", { context: ctx });
  const said = toolText(done);
  assert.match(said, /^refused: FINGERPRINT_MISMATCH/);
  assert.equal(provider.effects(`${await key()}:create-order`), 0);
});

test("resuming the saved run state again after an interrupt does not repeat the effect", async () => {
  // The state saved after approval (toString), resumed twice: a host that
  // crashed after resuming and resumes again. The SDK runs the approved
  // call again; intentd answers with the statement.
  const a = agent(buys(LAMP, 2));
  const first = await run(a, "buy the lamp", { context: ctx });
  for (const item of first.interruptions) await approve(ledger, { buy_item: shop.spec }, ctx, first.state, item);
  const saved = first.state.toString();
  const said: string[] = [];
  for (let i = 0; i < 2; i++) said.push(toolText(await run(a, await RunState.fromString(a, saved))));
  assert.match(said[0]!, /order_id/);
  assert.match(said[1]!, /^already_completed: intent /);
  assert.equal(provider.effects(`${await key()}:create-order`), 1);
});
