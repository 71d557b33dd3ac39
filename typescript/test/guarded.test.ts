// The guarded-tool core (Ledger) with no framework: what the model reads
// for each outcome, against a live intentd and the effect-counting provider.
import { after, before, beforeEach, test } from "node:test";
import assert from "node:assert/strict";
import { Client, Final, Ledger, NotAttempted, currentAttempt, guarded, toResult } from "../src/index.js";
import { Intentd, Provider } from "./live.js";
import { LAMP, Shop, conversation, type Conversation } from "./shop.js";

let server: Intentd;
let client: Client;
let ledger: Ledger;
const provider = new Provider();
let shop: Shop;
let ctx: Conversation;

before(async () => {
  server = await Intentd.start();
  client = new Client({ address: server.address, reportTimeoutMs: 10_000 });
  ledger = new Ledger(client, { worker: "guard-host", ttlMs: 15_000 });
});
after(async () => {
  await ledger?.close();
  await server?.stop();
});
beforeEach(() => {
  shop = new Shop(provider);
  ctx = conversation();
});

test("approval registers, the call executes once and then replays; the summary is registered", async () => {
  const terms = await ledger.approve(shop.spec, ctx, LAMP);
  const first = await ledger.call(shop.spec, ctx, LAMP);
  assert.equal(first.status, "executed");
  assert.equal(first.executed, true);
  assert.deepEqual(Object.keys(first.value as object).sort(), ["item", "order_id"]);
  const again = await ledger.call(shop.spec, ctx, LAMP);
  assert.equal(again.status, "replayed");
  assert.match(again.text, /^already_completed: intent .*action_taken: none/s);
  const intent = await client.get(terms.key);
  assert.equal(intent.summary, "Buy desk lamp for at most 89 EUR");
  assert.equal(intent.result!.externalRefs.order_id, (first.value as { order_id: string }).order_id);
  assert.equal(provider.effects(`${terms.key}:create-order`), 1);
});

test("not approved, and other terms: refused in words the model can act on, nothing sent", async () => {
  const none = await ledger.call(shop.spec, ctx, LAMP);
  assert.equal(none.status, "refused");
  assert.equal(none.reason, "NOT_APPROVED");
  assert.match(none.text, /^refused: NOT_APPROVED: buy_item .*Ask the user to approve it first\./);
  await ledger.approve(shop.spec, ctx, LAMP);
  const other = await ledger.call(shop.spec, ctx, { ...LAMP, max_eur: 890 });
  assert.equal(other.reason, "FINGERPRINT_MISMATCH");
  assert.match(other.text, /approved with other terms \(\{"item":"desk lamp","max_eur":89\}\) than these \(\{"item":"desk lamp","max_eur":890\}\); nothing was sent/);
  assert.equal(provider.effects(`${none.key}:create-order`), 0);
});

test("Final → failed for good; NotAttempted → not_done, and the next call executes", async () => {
  const fails = guarded<Conversation, typeof LAMP>({ ...shop.spec, name: "buy_item", execute: () => Promise.reject(new Final("out_of_stock", "no lamps left")) });
  await ledger.approve(fails, ctx, LAMP);
  const failed = await ledger.call(fails, ctx, LAMP);
  assert.equal(failed.status, "failed");
  assert.match(failed.text, /failed for good \(out_of_stock: no lamps left\); do not retry/);

  const ctx2 = conversation();
  const later = guarded<Conversation, typeof LAMP>({ ...shop.spec, execute: () => Promise.reject(new NotAttempted("merchant closed")) });
  await ledger.approve(later, ctx2, LAMP);
  const notDone = await ledger.call(later, ctx2, LAMP);
  assert.equal(notDone.status, "not_done");
  assert.match(notDone.text, /nothing was sent\. You may call it again\./);
  assert.equal((await ledger.call(shop.spec, ctx2, LAMP)).status, "executed");
});

test("in progress elsewhere: waits, then says so without starting it again", async () => {
  const terms = await ledger.approve(shop.spec, ctx, LAMP);
  const other = await client.openSession("other-host", 5_000);
  try {
    await client.acquire({ key: terms.key, sessionId: other.id });
    const busy = await ledger.call({ ...shop.spec, waitInProgressMs: 200 }, ctx, LAMP);
    assert.equal(busy.status, "in_progress");
    assert.match(busy.text, /do not retry now/);
  } finally {
    await other.close();
  }
  assert.equal(provider.effects(`${terms.key}:create-order`), 0);
});

test("the identity is the host's, never the call: another conversation is another intent", async () => {
  const a = await ledger.terms(shop.spec, ctx, LAMP);
  const b = await ledger.terms(shop.spec, conversation(), LAMP);
  assert.notEqual(a.key, b.key);
  assert.equal(a.fingerprint, b.fingerprint);
});

test("currentAttempt outside a guarded call throws; toResult keeps scalar fields as references", () => {
  assert.throws(() => currentAttempt(), /not inside a guarded tool call/);
  const r = toResult({ order_id: "o-1", total: 89, nested: { a: 1 } });
  assert.deepEqual(r.externalRefs, { order_id: "o-1", total: "89" });
  assert.equal(new TextDecoder().decode(r.payload as Uint8Array), '{"order_id":"o-1","total":89,"nested":{"a":1}}');
});
