// A worker process killed (SIGKILL) after its effect and before its report:
// its session lapses, intentd says RECONCILE to the next worker, which asks
// the provider by operation key and completes without a second effect.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer, type Server } from "node:http";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client, State, found, absent, type Session } from "../src/index.js";
import { Intentd } from "./live.js";

let server: Intentd;
let client: Client;
let session: Session;
let http: Server;
let providerUrl = "";
const orders = new Map<string, string[]>();

before(async () => {
  server = await Intentd.start();
  client = new Client({ address: server.address, reportTimeoutMs: 10_000 });
  session = await client.openSession("node-survivor", 15_000);
  // The effect-counting provider, over HTTP so that another process can reach it.
  http = createServer((req, res) => {
    const url = new URL(req.url!, "http://x");
    const key = url.searchParams.get("operation_key") ?? "";
    if (req.method === "POST") {
      const id = `order-${orders.size + 1}-${(orders.get(key)?.length ?? 0) + 1}`;
      orders.set(key, [...(orders.get(key) ?? []), id]);
      res.end(JSON.stringify({ order_id: id }));
    } else {
      res.end(JSON.stringify({ orders: orders.get(key) ?? [] }));
    }
  });
  await new Promise<void>((ok) => http.listen(0, "127.0.0.1", ok));
  providerUrl = `http://127.0.0.1:${(http.address() as { port: number }).port}/orders`;
});
after(async () => {
  await session?.close().catch(() => {});
  http?.close();
  await server?.stop();
});

test("SIGKILL after the effect: the lease lapses, the next worker reconciles (found), one effect", async () => {
  const key = `crash-${Date.now()}`;
  await client.register({ key, params: { item: "desk lamp", max_eur: 89 } });
  const lib = join(dirname(fileURLToPath(import.meta.url)), "../src/index.js");
  const worker = `
    import { Client } from ${JSON.stringify(lib)};
    const c = new Client({ address: ${JSON.stringify(server.address)} });
    const s = await c.openSession("node-doomed", 2000);
    await s.run({
      key: ${JSON.stringify(key)},
      execute: async (att) => {
        await fetch(${JSON.stringify(providerUrl)} + "?operation_key=" + encodeURIComponent(att.operationKey("create-order")), { method: "POST" });
        process.kill(process.pid, "SIGKILL"); // dies before it can report
        await new Promise(() => {});
      },
    });
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", worker], { stdio: ["ignore", "inherit", "inherit"] });
  const [, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((ok) => child.on("exit", (code, sig) => ok([code, sig])));
  assert.equal(signal, "SIGKILL");
  const opKey = `${key}:create-order`;
  assert.equal(orders.get(opKey)?.length, 1);
  assert.equal((await client.get(key)).state, State.IN_PROGRESS, "the dead worker's lease is still held until its session lapses");

  let executed = false;
  const out = await session.run({
    key,
    waitInProgressMs: 20_000, // the doomed session's TTL, and then some
    execute: () => {
      executed = true;
      return {};
    },
    reconcile: async (att) => {
      const res = await fetch(`${providerUrl}?operation_key=${encodeURIComponent(att.operationKey("create-order"))}`);
      const got = ((await res.json()) as { orders: string[] }).orders;
      return got.length === 1 ? found({ externalRefs: { order_id: got[0]! } }) : absent("no order");
    },
  });
  assert.equal(out.name, "COMPLETED");
  assert.equal(executed, false);
  assert.equal(out.result!.externalRefs.order_id, orders.get(opKey)![0]);
  assert.equal(orders.get(opKey)?.length, 1);
});
