// session.run's decisions against a live intentd and the effect-counting
// provider: the same cases as the Go and Python clients' tests.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import {
  AcquireOutcome,
  Client,
  Final,
  FingerprintMismatch,
  IntentNotFound,
  InvalidField,
  LEFT_UNKNOWN,
  LeaseLost,
  NotAttempted,
  RELEASED,
  State,
  absent,
  found,
  undecided,
  type Attempt,
  type Evidence,
  type Session,
  type Task,
} from "../src/index.js";
import { cutUtf8 } from "../src/client.js";
import { Intentd, Provider } from "./live.js";

let server: Intentd;
let client: Client;
let session: Session;
const provider = new Provider();

before(async () => {
  server = await Intentd.start();
  client = new Client({ address: server.address, reportTimeoutMs: 10_000 });
  session = await client.openSession("node-run", 15_000);
});
after(async () => {
  await session?.close().catch(() => {});
  await server?.stop();
});

const rid = () => randomBytes(6).toString("hex");

async function approved(name: string): Promise<string> {
  const key = `${name}-${rid()}`;
  await client.register({ key, params: { item: "desk-lamp", max_eur: 89 } });
  return key;
}

function order(att: Attempt) {
  const id = provider.create(att.operationKey("create-order"));
  return { payload: new TextEncoder().encode(JSON.stringify({ order_id: id })), externalRefs: { order_id: id } };
}

function lookUp(att: Attempt): Evidence {
  const got = provider.lookup(att.operationKey("create-order"));
  if (got.length === 1) return found({ externalRefs: { order_id: got[0]! } });
  if (got.length === 0) return absent("merchant has no order for the operation key");
  return undecided(`merchant shows ${got.length} orders`);
}

test("EXECUTE once, then the stored result without executing", async () => {
  const key = await approved("once");
  let calls = 0;
  const task: Task = { key, execute: (att) => (calls++, order(att)), reconcile: lookUp };
  const first = await session.run(task);
  assert.equal(first.outcome, AcquireOutcome.COMPLETED);
  assert.equal(first.executed, true);
  const again = await session.run(task);
  assert.equal(again.outcome, AcquireOutcome.COMPLETED);
  assert.equal(again.executed, false);
  assert.match(again.statement!.text, /action_taken: none/);
  assert.equal(again.result!.externalRefs.order_id, first.result!.externalRefs.order_id);
  assert.equal(calls, 1);
  assert.equal(provider.effects(`${key}:create-order`), 1);
});

test("a throw after the effect → MarkUnknown (LEFT_UNKNOWN); the next run reconciles (found) and never executes", async () => {
  const key = await approved("crash");
  const crashed = await session.run({
    key,
    execute: (att) => {
      order(att);
      throw new Error("connection reset after the order");
    },
  });
  assert.equal(crashed.name, LEFT_UNKNOWN);
  assert.equal(crashed.intent.state, State.UNKNOWN);
  assert.equal(crashed.leftUnknown, true);
  assert.match(String(crashed), /next worker reconciles/);
  let executed = false;
  const next = await session.run({ key, execute: (att) => ((executed = true), order(att)), reconcile: lookUp });
  assert.equal(next.outcome, AcquireOutcome.COMPLETED);
  assert.equal(executed, false);
  assert.equal(provider.effects(`${key}:create-order`), 1);
});

test("RECONCILE: absent → Release and execute; undecided and no reconcile → NEEDS_REVIEW", async () => {
  const key = await approved("absent");
  const left = await session.run({ key, execute: () => Promise.reject(new Error("timeout before sending")) });
  assert.equal(left.name, LEFT_UNKNOWN);
  const next = await session.run({ key, execute: order, reconcile: lookUp });
  assert.equal(next.outcome, AcquireOutcome.COMPLETED);
  assert.equal(next.executed, true);
  assert.equal(provider.effects(`${key}:create-order`), 1);

  const key2 = await approved("undecided");
  await session.run({ key: key2, execute: () => Promise.reject(new Error("reset")) });
  const review = await session.run({ key: key2, execute: order, reconcile: () => undecided("two orders") });
  assert.equal(review.outcome, AcquireOutcome.NEEDS_REVIEW);
  assert.equal(review.intent.state, State.NEEDS_REVIEW);

  const key3 = await approved("noreconcile");
  await session.run({ key: key3, execute: () => Promise.reject(new Error("reset")) });
  const escalated = await session.run({ key: key3, execute: order });
  assert.equal(escalated.outcome, AcquireOutcome.NEEDS_REVIEW);
  assert.equal(provider.effects(`${key3}:create-order`), 0);
});

test("NotAttempted → Release (RELEASED), the next run executes; Final → FAILED for good", async () => {
  const key = await approved("released");
  const out = await session.run({ key, execute: () => Promise.reject(new NotAttempted("merchant closed")) });
  assert.equal(out.name, RELEASED);
  assert.equal(out.intent.state, State.PENDING);
  const next = await session.run({ key, execute: order });
  assert.equal(next.outcome, AcquireOutcome.COMPLETED);
  assert.equal(next.executed, true);

  const key2 = await approved("final");
  const failed = await session.run({ key: key2, execute: () => Promise.reject(new Final("card_declined", "insufficient funds")) });
  assert.equal(failed.outcome, AcquireOutcome.FAILED);
  assert.equal(failed.intent.failure!.code, "card_declined");
  const again = await session.run({ key: key2, execute: order });
  assert.equal(again.outcome, AcquireOutcome.FAILED);
  assert.equal(again.executed, false);
});

test("the caller's abort while execute runs → MarkUnknown, never Release, and the abort is thrown", async () => {
  const key = await approved("abort");
  const ctl = new AbortController();
  let sawAbort = false;
  const running = session.run(
    {
      key,
      execute: async (att) => {
        order(att);
        att.signal.addEventListener("abort", () => (sawAbort = true));
        await sleep(60_000, undefined, { ref: false }).catch(() => {});
      },
    },
    { signal: ctl.signal },
  );
  await sleep(200);
  ctl.abort(new Error("framework timeout"));
  await assert.rejects(running, /framework timeout/);
  assert.equal(sawAbort, true);
  const { intent } = await client.rpc.get({ key });
  assert.equal(intent!.state, State.UNKNOWN);
  assert.match(intent!.history.at(-1)!.reason ?? "", /aborted while executing/);
  const next = await session.run({ key, execute: order, reconcile: lookUp });
  assert.equal(next.executed, false);
  assert.equal(provider.effects(`${key}:create-order`), 1);
});

test("an aborted signal before the run sends nothing", async () => {
  const key = await approved("preaborted");
  await assert.rejects(session.run({ key, execute: order }, { signal: AbortSignal.abort(new Error("gone")) }), /gone/);
  assert.equal((await client.get(key)).state, State.PENDING);
});

test("IN_PROGRESS: waits for the other worker, then returns its result without executing", async () => {
  const key = await approved("held");
  const other = await client.openSession("node-other", 5_000);
  try {
    const acq = await client.acquire({ key, sessionId: other.id });
    assert.equal(acq.outcome, AcquireOutcome.EXECUTE);
    const waiting = session.run({ key, execute: order, waitInProgressMs: 10_000 });
    await sleep(300);
    await client.complete(key, acq.lease!.token, { externalRefs: { order_id: "by-other" } });
    const out = await waiting;
    assert.equal(out.outcome, AcquireOutcome.COMPLETED);
    assert.equal(out.executed, false);
    assert.equal(out.result!.externalRefs.order_id, "by-other");

    const key2 = await approved("held-long");
    await client.acquire({ key: key2, sessionId: other.id });
    const t0 = performance.now();
    const still = await session.run({ key: key2, execute: order, waitInProgressMs: 300 });
    assert.equal(still.outcome, AcquireOutcome.IN_PROGRESS);
    assert.ok(performance.now() - t0 >= 300);
  } finally {
    await other.close();
  }
});

test("expected fingerprint: other terms are refused before anything runs; an unknown key is IntentNotFound", async () => {
  const key = await approved("fp");
  await assert.rejects(session.run({ key, execute: order, expectedFingerprint: "0".repeat(64) }), FingerprintMismatch);
  await assert.rejects(session.run({ key: `nope-${rid()}`, execute: order }), IntentNotFound);
  assert.equal(provider.effects(`${key}:create-order`), 0);
});

test("a lease superseded during execute: the report is refused STALE_TOKEN, run acquires again and reports superseded", async () => {
  const key = await approved("stale");
  const out = await session.run({
    key,
    execute: async (att) => {
      // A reviewer takes the intent over meanwhile (a forced escalation supersedes the lease).
      await client.escalate(key, "reviewer takes over", { force: true, actor: "test" });
      return order(att);
    },
  });
  assert.equal(out.superseded, true);
  assert.equal(out.executed, true);
  assert.equal(out.outcome, AcquireOutcome.NEEDS_REVIEW);
  const { intent } = await client.rpc.get({ key });
  assert.ok(intent!.history.some((h) => h.kind === 3 && !h.accepted), "the superseded Complete is kept as evidence");
});

test("the session lost while execute runs: attempt.signal aborts, the refused report is LeaseLost", async () => {
  const key = await approved("lost");
  const s = await client.openSession("node-lost", 2_000);
  let aborted: unknown;
  const running = s.run({
    key,
    execute: async (att) => {
      await client.rpc.closeSession({ sessionId: s.id }); // intentd ends the session under the worker's feet
      await new Promise<void>((ok) => att.signal.addEventListener("abort", () => ok(), { once: true }));
      aborted = att.signal.reason;
      throw att.signal.reason;
    },
  });
  // intentd made the lease UNKNOWN when the session ended: the report is
  // either accepted as the same UNKNOWN, or refused and thrown as LeaseLost.
  const out = await running.catch((err: unknown) => {
    assert.ok(err instanceof LeaseLost, String(err));
    return undefined;
  });
  if (out) {
    assert.equal(out.name, LEFT_UNKNOWN);
    assert.equal(out.leaseLost, true);
  }
  assert.equal((await client.get(key)).state, State.UNKNOWN);
  assert.ok(aborted, "attempt.signal never aborted");
  assert.ok(s.lost.aborted);
});

test("the heartbeat timer never keeps Node alive", () => {
  const here = dirname(fileURLToPath(import.meta.url));
  const script = `
    import { Client } from ${JSON.stringify(join(here, "../src/index.js"))};
    const c = new Client({ address: ${JSON.stringify(server.address)} });
    const s = await c.openSession("node-exit", 30000);
    console.log(s.id ? "opened" : "none");
  `;
  const t0 = performance.now();
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { timeout: 20_000, encoding: "utf8" });
  assert.equal(out.trim(), "opened");
  assert.ok(performance.now() - t0 < 15_000);
});

test("a long error is cut to what intentd keeps of a reason", async () => {
  const key = await approved("long");
  const out = await session.run({ key, execute: () => Promise.reject(new Error("x".repeat(5000))) });
  assert.equal(out.name, LEFT_UNKNOWN);
  assert.ok(Buffer.byteLength((await client.get(key)).history.at(-1)!.reason ?? "") <= 1024);
});

test("cutUtf8 cuts to UTF-8 bytes at a character boundary, never inside a surrogate pair", () => {
  assert.equal(cutUtf8("abc", 3), "abc");
  assert.equal(cutUtf8("abcd", 3), "abc");
  assert.equal(cutUtf8("€€", 5), "€"); // 3 bytes each
  assert.equal(cutUtf8("é€", 4), "é"); // 2 + 3
  assert.equal(cutUtf8("a😀b", 4), "a"); // the pair is 4 bytes: not split
  assert.equal(cutUtf8("a😀b", 5), "a😀");
  assert.equal(cutUtf8("\ud800x", 3), "\ud800"); // a lone surrogate is sent as U+FFFD, 3 bytes
  const mixed = "x€é😀".repeat(500);
  for (const n of [0, 1, 2, 3, 128, 1023, 1024, 1025]) {
    const cut = cutUtf8(mixed, n);
    assert.ok(Buffer.byteLength(cut) <= n && Buffer.byteLength(cut) > n - 4, `${n}: ${Buffer.byteLength(cut)} bytes`);
    assert.ok(mixed.startsWith(cut));
    assert.ok(!/[\ud800-\udbff]$/.test(cut), "ends inside a surrogate pair");
  }
});

test("errors of 2,000 \"€\" are cut to intentd's 1024 bytes: MarkUnknown, Release and Fail are accepted", async () => {
  const euros = "€".repeat(2000); // 6,000 bytes of UTF-8
  const key = await approved("euro-unknown");
  const out = await session.run({ key, execute: (att) => (order(att), Promise.reject(new Error(euros))) });
  assert.equal(out.name, LEFT_UNKNOWN, String(out));
  const intent = await client.get(key);
  assert.equal(intent.state, State.UNKNOWN);
  const said = intent.history.at(-1)!.reason ?? "";
  assert.ok(Buffer.byteLength(said) <= 1024 && Buffer.byteLength(said) > 1020, `${Buffer.byteLength(said)} bytes`);

  const key2 = await approved("euro-released");
  const released = await session.run({ key: key2, execute: () => Promise.reject(new NotAttempted(euros)) });
  assert.equal(released.name, RELEASED, String(released));
  assert.equal((await client.get(key2)).state, State.PENDING);

  const key3 = await approved("euro-final");
  const failed = await session.run({ key: key3, execute: () => Promise.reject(new Final("card_declined", euros)) });
  assert.equal(failed.outcome, AcquireOutcome.FAILED, String(failed));
  assert.equal(failed.intent.failure!.code, "card_declined");
  assert.ok(Buffer.byteLength(failed.intent.failure!.message) <= 1024);
});

test("a result intentd refuses after execute → MarkUnknown, not a held lease: another session's run reconciles at once", async () => {
  const huge = (att: Attempt) => ({ ...order(att), payload: new Uint8Array(300_000) }); // over 262,144 bytes
  const key = await approved("bigresult");
  const out = await session.run({ key, execute: huge, reconcile: lookUp });
  assert.equal(out.name, LEFT_UNKNOWN, String(out));
  assert.equal(out.executed, true);
  assert.ok(out.error instanceof InvalidField, String(out.error));
  const intent = await client.get(key);
  assert.equal(intent.state, State.UNKNOWN);
  assert.match(intent.history.at(-1)!.reason ?? "", /^the result could not be recorded: intentd: /);

  const other = await client.openSession("node-other-big", 5_000);
  try {
    let reconciled = false;
    const next = await other.run({ key, execute: order, reconcile: (att) => ((reconciled = true), lookUp(att)), waitInProgressMs: 0 });
    assert.equal(reconciled, true, `reconcile not called: ${next}`);
    assert.equal(next.outcome, AcquireOutcome.COMPLETED, String(next));
    assert.equal(next.executed, false);
  } finally {
    await other.close();
  }
  assert.equal(provider.effects(`${key}:create-order`), 1);

  // Other results intentd will not record: too many external refs, a ref value too long.
  const refs = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`ref${i}`, "v"]));
  for (const bad of [{ externalRefs: refs }, { externalRefs: { order_id: "o".repeat(300) } }]) {
    const k = await approved("badresult");
    const left = await session.run({ key: k, execute: () => bad });
    assert.equal(left.name, LEFT_UNKNOWN, String(left));
    assert.ok(left.error instanceof InvalidField, String(left.error));
    assert.equal((await client.get(k)).state, State.UNKNOWN);
  }
});

test("a Final code over its 128 bytes is cut (FAILED, as the worker said); an empty one → MarkUnknown, not a held lease", async () => {
  const long = await approved("longcode");
  const failed = await session.run({ key: long, execute: () => Promise.reject(new Final("c".repeat(200), "declined")) });
  assert.equal(failed.outcome, AcquireOutcome.FAILED, String(failed));
  assert.equal((await client.get(long)).failure?.code, "c".repeat(128));
  for (const code of [""]) {
    const key = await approved("badcode");
    const out = await session.run({ key, execute: () => Promise.reject(new Final(code, "declined")) });
    assert.equal(out.name, LEFT_UNKNOWN, String(out));
    assert.ok(out.error instanceof InvalidField, String(out.error));
    const intent = await client.get(key);
    assert.equal(intent.state, State.UNKNOWN);
    assert.match(intent.history.at(-1)!.reason ?? "", /^the failure could not be recorded: intentd: /);
  }
});

test("found() with a result intentd refuses → Escalate (NEEDS_REVIEW), not a held lease", async () => {
  const key = await approved("foundbig");
  await session.run({ key, execute: () => Promise.reject(new Error("reset")) });
  const out = await session.run({ key, execute: order, reconcile: () => found({ payload: new Uint8Array(300_000) }) });
  assert.equal(out.outcome, AcquireOutcome.NEEDS_REVIEW, String(out));
  assert.ok(out.error instanceof InvalidField, String(out.error));
  const intent = await client.get(key);
  assert.equal(intent.state, State.NEEDS_REVIEW);
  assert.ok(intent.history.some((h) => /^found downstream, but the result could not be recorded: intentd: /.test(h.reason ?? "")), "the escalation's reason");
  assert.equal(provider.effects(`${key}:create-order`), 0);
});

test("a task without execute is a TypeError before anything is acquired", async () => {
  const key = await approved("noexecute");
  await assert.rejects(session.run({ key } as unknown as Task), TypeError);
  assert.equal((await client.get(key)).state, State.PENDING);
});

test("execute or found() giving something that is not a Result: UNKNOWN with a TypeError, not a held lease", async () => {
  for (const bad of ["order-1", { order_id: "o1" }, { payload: "text" }, new Uint8Array([1])]) {
    const key = await approved("notresult");
    const out = await session.run({ key, execute: (att) => (order(att), bad as never), reconcile: lookUp });
    assert.equal(out.name, LEFT_UNKNOWN, String(out));
    assert.ok(out.error instanceof TypeError && /not a Result/.test(out.error.message), String(out.error));
    assert.equal((await client.get(key)).state, State.UNKNOWN);
    const next = await session.run({ key, execute: order, reconcile: lookUp });
    assert.equal(next.outcome, AcquireOutcome.COMPLETED);
    assert.equal(provider.effects(`${key}:create-order`), 1);
  }
  const key = await approved("foundnotresult");
  await session.run({ key, execute: () => Promise.reject(new Error("reset")) });
  const out = await session.run({ key, execute: order, reconcile: () => found("order-1" as never) });
  assert.equal(out.name, LEFT_UNKNOWN, String(out));
  assert.match(String(out.error), /not a Result/);
  const none = await session.run({ key, execute: order, reconcile: (() => undefined) as never });
  assert.equal(none.name, LEFT_UNKNOWN, String(none));
  assert.match(String(none.error), /reconcile must return/);
  assert.equal(provider.effects(`${key}:create-order`), 0);
});
