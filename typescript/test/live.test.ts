// A Node worker on the generated TypeScript stubs against a live intentd.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { equals, type JsonObject } from "@bufbuild/protobuf";
import { Code, type Client } from "@connectrpc/connect";
import {
  ErrorReason,
  HistoryEntry_Kind,
  IntentService,
  Outcome,
  ResultSchema,
  State,
  type Result,
} from "../../gen/ts/intent/v1/intent_pb.js";
import { reasonOf, refusal } from "../src/errors.js";
import { Intentd, Provider, REPO } from "./live.js";

let server: Intentd;
let intentd: Client<typeof IntentService>;
const provider = new Provider();
const call = { timeoutMs: 10_000 };

before(async () => {
  server = await Intentd.start();
  intentd = server.client();
});
after(async () => {
  await server?.stop();
});

const freshKey = (name: string) => `${name}-${randomBytes(6).toString("hex")}`;
const rid = () => randomBytes(12).toString("hex");

/** refused runs fn and returns what intentd said when it refused. */
async function refused(fn: () => Promise<unknown>) {
  try {
    await fn();
  } catch (err) {
    return refusal(err);
  }
  assert.fail("the call was not refused");
}

/** A worker session whose heartbeats run every TTL/3 until stop(). */
async function openSession(worker: string, ttlSeconds: number, heartbeat = true) {
  const s = await intentd.openSession({ worker, ttl: { seconds: BigInt(ttlSeconds) } }, call);
  const timer = heartbeat
    ? setInterval(() => void intentd.heartbeat({ sessionId: s.sessionId }, { timeoutMs: 1000 }).catch(() => {}), (ttlSeconds * 1000) / 3)
    : undefined;
  return {
    id: s.sessionId,
    stop: async () => {
      clearInterval(timer);
      await intentd.closeSession({ sessionId: s.sessionId }, call).catch(() => {});
    },
  };
}

function orderResult(order: string): Result {
  return { $typeName: "intent.v1.Result", payload: new TextEncoder().encode(JSON.stringify({ order_id: order })), externalRefs: { order_id: order } };
}

test("register, execute once, replay with no action, refuse stale and mismatched workers, reconcile a silent one", async () => {
  const key = freshKey("lamp");
  const params: JsonObject = { merchant: "m-1", item: "desk-lamp", max_eur: 89 };
  const reg = await intentd.register({ key, params, requestId: rid() }, call);
  assert.equal(reg.created, true);
  const fingerprint = reg.intent!.fingerprint;

  const w1 = await openSession("node-w1", 3);
  try {
    const acq = await intentd.acquire({ key, sessionId: w1.id, requestId: rid() }, call);
    assert.equal(acq.outcome, Outcome.EXECUTE);
    const order = provider.create(`${key}:create-order`);
    const done = await intentd.complete({ key, token: acq.lease!.token, result: orderResult(order) }, call);
    assert.equal(done.actionTaken, "recorded");
    assert.equal(done.intent!.state, State.COMPLETED);

    const replay = await intentd.acquire({ key, sessionId: w1.id, requestId: rid() }, call);
    assert.equal(replay.outcome, Outcome.COMPLETED);
    assert.equal(replay.actionTaken, "none");
    assert.deepEqual(replay.intent!.result!.payload, orderResult(order).payload);
    assert.ok(equals(ResultSchema, replay.intent!.result!, done.intent!.result!));
    assert.match(replay.statement!.text, /action_taken: none/);

    const mismatch = await refused(() => intentd.register({ key, params: { ...params, max_eur: 900 }, requestId: rid() }, call));
    assert.equal(mismatch.code, Code.FailedPrecondition);
    assert.equal(mismatch.reason, "FINGERPRINT_MISMATCH");
    assert.equal(mismatch.metadata.registered_fingerprint, fingerprint);
    const expected = await refused(() => intentd.acquire({ key, sessionId: w1.id, requestId: rid(), expectedFingerprint: "0".repeat(64) }, call));
    assert.equal(expected.reason, "FINGERPRINT_MISMATCH");
  } finally {
    await w1.stop();
  }

  // A worker that stops heartbeating after placing the order.
  const key2 = freshKey("lamp");
  await intentd.register({ key: key2, params, requestId: rid() }, call);
  const silent = await openSession("node-silent", 2, false);
  const held = await intentd.acquire({ key: key2, sessionId: silent.id, requestId: rid() }, call);
  assert.equal(held.outcome, Outcome.EXECUTE);
  const order = provider.create(`${key2}:create-order`);

  const w2 = await openSession("node-w2", 3);
  try {
    let next = await intentd.acquire({ key: key2, sessionId: w2.id, requestId: rid() }, call);
    for (let i = 0; next.outcome === Outcome.IN_PROGRESS && i < 100; i++) {
      await sleep(100);
      next = await intentd.acquire({ key: key2, sessionId: w2.id, requestId: rid() }, call);
    }
    assert.equal(next.outcome, Outcome.RECONCILE, `got ${Outcome[next.outcome]}, never EXECUTE after a worker went quiet`);
    const found = provider.lookup(`${key2}:create-order`);
    assert.equal(found.length, 1);
    const done = await intentd.complete({ key: key2, token: next.lease!.token, result: orderResult(found[0]!) }, call);
    assert.equal(done.intent!.state, State.COMPLETED);

    const stale = await refused(() => intentd.complete({ key: key2, token: held.lease!.token, result: orderResult(order) }, call));
    assert.equal(stale.code, Code.Aborted);
    assert.equal(stale.reason, "STALE_TOKEN");
    assert.equal(stale.errorReason, ErrorReason.STALE_TOKEN);
    assert.equal(stale.metadata.current_token, String(next.lease!.token));
    assert.equal(stale.statement?.status, "stale_token");
    const { intent } = await intentd.get({ key: key2 }, call);
    assert.ok(intent!.history.some((h) => h.kind === HistoryEntry_Kind.COMPLETED && h.token === held.lease!.token && !h.accepted));
  } finally {
    await w2.stop();
  }
  assert.equal(provider.effects(`${key}:create-order`), 1);
  assert.equal(provider.effects(`${key2}:create-order`), 1);
});

test("an invalid field is named", async () => {
  const bad = await refused(() => intentd.register({ key: "bad key", params: { a: 1 }, requestId: rid() }, call));
  assert.deepEqual([bad.code, bad.reason, bad.field], [Code.InvalidArgument, "INVALID_FIELD", "key"]);
});

interface Vector {
  name: string;
  action: string;
  identity: string;
  canonical?: string;
  key?: string;
  canonical_params?: string;
  fingerprint?: string;
  refused?: { derive_key: string; register: string };
}

test("canonical vectors: the server's keys and fingerprints", async (t) => {
  const table = JSON.parse(readFileSync(join(REPO, "api", "canonical-vectors.json"), "utf8")) as { vectors: Vector[] };
  for (const v of table.vectors) {
    await t.test(v.name, async () => {
      const identity = JSON.parse(v.identity) as JsonObject;
      if (v.refused) {
        assert.equal((await refused(() => intentd.deriveKey({ action: v.action, identity }, call))).field, v.refused.derive_key);
        assert.equal((await refused(() => intentd.deriveKey({ params: identity }, call))).field, v.refused.register);
        assert.equal((await refused(() => intentd.register({ key: freshKey("vector"), params: identity, requestId: rid() }, call))).field, v.refused.register);
        return;
      }
      const got = await intentd.deriveKey({ action: v.action, identity }, call);
      assert.equal(got.canonical, v.canonical);
      assert.equal(got.key, v.key);
      const fp = await intentd.deriveKey({ params: identity }, call);
      assert.deepEqual([fp.canonicalParams, fp.fingerprint], [v.canonical_params, v.fingerprint]);
      const reg = await intentd.register({ key: freshKey("vector"), params: identity, requestId: rid() }, call);
      assert.equal(reg.intent!.fingerprint, v.fingerprint);
    });
  }
});

test("reasonOf reads every ErrorReason from its wire name", () => {
  const values = Object.values(ErrorReason).filter((v): v is ErrorReason => typeof v === "number" && v !== ErrorReason.UNSPECIFIED);
  assert.ok(values.length > 0);
  for (const v of values) {
    assert.equal(reasonOf(ErrorReason[v]), v, ErrorReason[v]);
  }
  assert.equal(ErrorReason[ErrorReason.RATE_LIMITED], "RATE_LIMITED");
  for (const unknown of ["", "ERROR_REASON_STALE_TOKEN", "NO_SUCH_REASON", "0"]) {
    assert.equal(reasonOf(unknown), ErrorReason.UNSPECIFIED, unknown);
  }
});
