// Quick start: a Node worker on the generated stubs. It approves an intent,
// opens a session that heartbeats, acquires, acts once under the operation
// key, completes, and acquires again to show the replay ("action_taken:
// none"). Run intentd first (`go run ./cmd/intentd`), then `npm run example`
// ($INTENTD_ADDR overrides 127.0.0.1:7650).
//
// Every call carries one W3C traceparent, made by hand here (with
// OpenTelemetry for JS, propagate its context instead): an intentd run with
// --otlp-endpoint records its spans of this run under the trace id printed
// to stderr.
import { randomBytes } from "node:crypto";
import { Code, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { IntentService, Outcome } from "../../gen/ts/intent/v1/intent_pb.js";
import { refusal } from "../src/errors.js";

// A new sampled trace: version 00, trace id, parent span id, flags 01.
const traceparent = `00-${randomBytes(16).toString("hex")}-${randomBytes(8).toString("hex")}-01`;
console.error(`trace ${traceparent.split("-")[1]}`);
const traced: Interceptor = (next) => (req) => {
  req.header.set("traceparent", traceparent);
  return next(req);
};
const intentd = createClient(
  IntentService,
  createGrpcTransport({ baseUrl: `http://${process.env.INTENTD_ADDR ?? "127.0.0.1:7650"}`, interceptors: [traced] }),
);
const call = { timeoutMs: 10_000 };
const rid = () => randomBytes(12).toString("hex");

// The key comes from the server: never reimplement the canonical form.
const { key } = await intentd.deriveKey({ action: "buy-item", identity: { conversation: rid(), item: "desk lamp" } }, call);
await intentd.register({ key, params: { item: "desk lamp", max_eur: 89 }, requestId: rid() }, call);

const ttlSeconds = 15;
const { sessionId } = await intentd.openSession({ worker: "node-quickstart", ttl: { seconds: BigInt(ttlSeconds) } }, call);
const beat = setInterval(() => void intentd.heartbeat({ sessionId }, { timeoutMs: 2_000 }).catch(() => {}), (ttlSeconds * 1000) / 3);
try {
  for (let run = 1; run <= 2; run++) {
    const acq = await intentd.acquire({ key, sessionId, requestId: rid() }, call);
    if (acq.outcome === Outcome.EXECUTE) {
      const operationKey = `${key}:create-order`; // the merchant's idempotency key
      const order = `order-for-${operationKey.slice(0, 8)}`; // ... call the merchant here
      await intentd.complete({ key, token: acq.lease!.token, result: { externalRefs: { order_id: order } } }, call);
      console.log(`run ${run}: executed, order ${order} recorded`);
    } else {
      console.log(`run ${run}: ${Outcome[acq.outcome]}: ${acq.statement?.text}`);
    }
  }
  // A refusal: other terms under the same key.
  try {
    await intentd.register({ key, params: { item: "desk lamp", max_eur: 900 }, requestId: rid() }, call);
  } catch (err) {
    const r = refusal(err);
    console.log(`refused: ${Code[r.code]} / ${r.reason}: ${r.message}`);
  }
} finally {
  clearInterval(beat);
  await intentd.closeSession({ sessionId }, call);
}
