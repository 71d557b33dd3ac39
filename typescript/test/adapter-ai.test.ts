// intentd/ai with Vercel's AI SDK: generateText, its tool approval
// (toolApproval → tool-approval-request → tool-approval-response) and its
// own MockLanguageModelV4 (no network, no model), against a live intentd
// and the effect-counting provider: the five scenarios.
import { after, before, beforeEach, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { generateText, type ModelMessage } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { approve, guardedTool } from "../src/adapters/ai.js";
import { Client, Ledger, currentAttempt } from "../src/index.js";
import { Intentd, Provider } from "./live.js";
import { LAMP, Shop, conversation, crash, type BuyArgs, type Conversation } from "./shop.js";

let server: Intentd;
let client: Client;
let ledger: Ledger;
const provider = new Provider();
let shop: Shop;
let ctx: Conversation;
let calls = 0;

before(async () => {
  server = await Intentd.start();
  client = new Client({ address: server.address, reportTimeoutMs: 10_000 });
  ledger = new Ledger(client, { worker: "ai-sdk-host", ttlMs: 15_000 });
});
after(async () => {
  await ledger?.close();
  await server?.stop();
});
beforeEach(() => {
  shop = new Shop(provider);
  ctx = conversation();
});

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };

/**
 * The SDK's MockLanguageModelV4: to a user message it answers by calling
 * buy_item with args under a fresh call id (as a regenerated call has);
 * after a tool result, "done". `read` keeps each tool output it was sent.
 */
function model(args: BuyArgs) {
  const read: string[] = [];
  const m = new MockLanguageModelV4({
    doGenerate: async (opts) => {
      const last = opts.prompt.at(-1)!;
      if (last.role === "tool") {
        for (const part of last.content) {
          if (part.type === "tool-result") read.push(outputText(part.output));
        }
        return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
      }
      return {
        content: [{ type: "tool-call", toolCallId: `call-${++calls}`, toolName: "buy_item", input: JSON.stringify(args) }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage,
        warnings: [],
      };
    },
  });
  return { m, read };
}

function outputText(output: { type: string; value?: unknown }): string {
  return typeof output.value === "string" ? output.value : JSON.stringify(output.value);
}

function tools() {
  return {
    buy_item: guardedTool(ledger, shop.spec, {
      description: "Buy one item for at most max_eur euros.",
      inputSchema: z.object({ item: z.string(), max_eur: z.number() }),
      contextSchema: z.object({ conversationId: z.string() }),
      // The framework's own tool is the effect: it reads its operation key from the attempt.
      execute: async (input: BuyArgs) => shop.place(currentAttempt(), input.item),
    }),
  };
}

/**
 * The model calls buy_item, the SDK asks for approval, a person approves
 * (Register), the host sends the approval back and the SDK runs the tool;
 * the messages to resume with, and the tool output the model read.
 */
async function askAndApprove(args: BuyArgs, opts: { approval?: boolean } = {}) {
  const { m, read } = model(args);
  const settings = { model: m, tools: tools(), toolsContext: { buy_item: ctx }, toolApproval: opts.approval === false ? undefined : { buy_item: "user-approval" as const } };
  const messages: ModelMessage[] = [{ role: "user", content: "buy the lamp" }];
  const first = await generateText({ ...settings, messages });
  if (opts.approval === false) {
    // No approval step: the SDK ran the tool at once; what it returned is what the model reads next.
    for (const r of first.toolResults) read.push(typeof r.output === "string" ? r.output : JSON.stringify(r.output));
  }
  const requests = first.content.filter((p) => p.type === "tool-approval-request");
  if (opts.approval === false) return { resume: messages, read, settings };
  assert.equal(requests.length, 1);
  const responses = [];
  for (const r of requests) responses.push(await approve(ledger, { buy_item: shop.spec }, ctx, r));
  const resume: ModelMessage[] = [...messages, ...first.response.messages, { role: "tool", content: responses }];
  return { resume, read, settings };
}

async function runApproved(args: BuyArgs): Promise<string> {
  const { resume, read, settings } = await askAndApprove(args);
  await generateText({ ...settings, messages: resume });
  assert.equal(read.length, 1, `the model read ${read.length} tool outputs`);
  return read[0]!;
}

const key = async (args: BuyArgs = LAMP) => (await ledger.terms(shop.spec, ctx, args)).key;

test("the same arguments under other call ids: one effect, and the replay statement", async () => {
  const first = await runApproved(LAMP);
  assert.match(first, /order_id/);
  const again = await runApproved(LAMP);
  assert.match(again, /^already_completed: intent /);
  assert.match(again, /action_taken: none/);
  assert.equal(provider.effects(`${await key()}:create-order`), 1);
});

test("the effect, then a crash before Complete: UNKNOWN, under review; the next call reconciles", async () => {
  shop.afterEffect = crash;
  const said = await runApproved(LAMP);
  assert.match(said, /under human review; do not retry/);
  shop.afterEffect = undefined;
  const again = await runApproved(LAMP);
  assert.match(again, /had taken effect in an earlier attempt/);
  assert.equal(provider.effects(`${await key()}:create-order`), 1);
});

test("the effect, then the SDK's abortSignal: MarkUnknown, never Release; the next call reconciles", async () => {
  const ctl = new AbortController();
  shop.afterEffect = async () => {
    ctl.abort(new Error("the user pressed stop"));
    await sleep(50);
  };
  const { resume, read, settings } = await askAndApprove(LAMP);
  // The SDK may end the run with the abort, or hand the error to the model
  // as the tool's error output: either way, intentd heard "unknown".
  const ended = await generateText({ ...settings, messages: resume, abortSignal: ctl.signal }).then(() => false, () => true);
  if (!ended) assert.match(read.join("\n"), /the user pressed stop/);
  const k = await key();
  const intent = await client.get(k);
  assert.equal(intent.history.at(-1)!.kind, 4 /* MARKED_UNKNOWN */, "the abort was reported as UNKNOWN");
  assert.match(intent.history.at(-1)!.reason, /aborted while executing .*the user pressed stop/);
  shop.afterEffect = undefined;
  const again = await runApproved(LAMP);
  assert.match(again, /had taken effect in an earlier attempt/);
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
  const { read } = await askAndApprove({ ...LAMP, max_eur: 890 }, { approval: false });
  assert.equal(read.length, 1);
  assert.match(read[0]!, /^refused: FINGERPRINT_MISMATCH/);
  assert.match(read[0]!, /Ask the user/);
  assert.equal(provider.effects(`${await key()}:create-order`), 0);
});

test("resuming the saved conversation again after an interrupt does not repeat the effect", async () => {
  // The host saved the messages with the approval, resumed, crashed before
  // saving the tool result, and resumes from the saved messages again.
  const { resume, read, settings } = await askAndApprove(LAMP);
  const saved = JSON.stringify(resume);
  for (let i = 0; i < 2; i++) await generateText({ ...settings, messages: JSON.parse(saved) as ModelMessage[] });
  assert.equal(read.length, 2);
  assert.match(read[0]!, /order_id/);
  assert.match(read[1]!, /^already_completed: intent /);
  assert.equal(provider.effects(`${await key()}:create-order`), 1);
});
