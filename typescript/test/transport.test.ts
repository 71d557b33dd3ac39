// The client's own unary transport (src/transport.ts) and Connect's, which
// a client with interceptors uses: refusals with their details, deadlines,
// aborts, an intentd that is not there, and a restart under a live client.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { Client, FingerprintMismatch, InvalidField, Unavailable } from "../src/index.js";
import { Intentd } from "./live.js";

let server: Intentd;
before(async () => {
  server = await Intentd.start();
});
after(async () => {
  await server?.stop();
});

async function freePort(): Promise<number> {
  const l = createServer();
  await new Promise<void>((ok) => l.listen(0, "127.0.0.1", ok));
  const port = (l.address() as { port: number }).port;
  await new Promise((ok) => l.close(ok));
  return port;
}

for (const [name, make] of [
  ["the client's own transport", (address: string) => new Client({ address })],
  ["Connect's gRPC transport (interceptors)", (address: string) => new Client({ address, interceptors: [((next) => (req) => next(req)) as Interceptor] })],
] as const) {
  test(`${name}: refusals keep their reason, field and metadata`, async () => {
    const c = make(server.address);
    const key = `t-${Math.random().toString(36).slice(2)}`;
    await c.register({ key, params: { a: 1 } });
    await assert.rejects(c.register({ key, params: { a: 2 } }), (err: unknown) => {
      assert.ok(err instanceof FingerprintMismatch);
      assert.equal(err.code, Code.FailedPrecondition);
      assert.match(err.metadata.registered_fingerprint ?? "", /^[0-9a-f]{64}$/);
      return true;
    });
    await assert.rejects(c.register({ key: "bad key", params: { a: 1 } }), (err: unknown) => err instanceof InvalidField && err.field === "key");
  });

  test(`${name}: an abort is Canceled, a deadline DeadlineExceeded`, async () => {
    const c = make(server.address);
    const stream = c.rpc.watch({ key: "nothing-here" }, { timeoutMs: 60_000, signal: AbortSignal.timeout(100) });
    await assert.rejects((async () => {
      for await (const _ of stream) void _;
    })(), (err: unknown) => ConnectError.from(err).code === Code.Canceled || ConnectError.from(err).code === Code.DeadlineExceeded);
    await assert.rejects(c.rpc.get({ key: "x" }, { signal: AbortSignal.abort(new Error("stop")) }), (err: unknown) => ConnectError.from(err).code === Code.Canceled);
  });
}

test("no intentd at the address: Unavailable, resent until the call's timeout", async () => {
  const c = new Client({ address: `127.0.0.1:${await freePort()}`, backoffMs: [10, 50] });
  const t0 = performance.now();
  await assert.rejects(c.get("k", { timeoutMs: 300 }), (err: unknown) => {
    assert.ok(err instanceof Unavailable);
    assert.match(err.message, /^intentd: no answer from 127\.0\.0\.1:\d+: /); // said once, with the address
    return true;
  });
  assert.ok(performance.now() - t0 >= 250, "gave up before the timeout");
});

test("an address that is not host:port is a TypeError at once; http://host:port is taken", async () => {
  for (const address of ["", "127.0.0.1", "https://127.0.0.1:7650", "127.0.0.1:7650/x", "grpc://h:1"]) {
    assert.throws(() => new Client({ address }), TypeError, address);
    assert.throws(() => new Client({ address, interceptors: [((next) => (req) => next(req)) as Interceptor] }), TypeError, address);
  }
  for (const address of [`http://${server.address}`, `http://${server.address}/`]) {
    const c = new Client({ address });
    assert.match((await c.deriveKey("a", { x: 1 })).key, /^[0-9a-f]+$/);
    c.close();
  }
  assert.ok(new Client({ address: "[::1]:7650" }));
  assert.ok(new Client({ address: "intentd.internal:7650" }));
});

test("a unary call past its deadline is DeadlineExceeded; the session's next call works", async () => {
  const c = new Client({ address: server.address, callTimeoutMs: 1 });
  // A 1 ms attempt deadline may or may not be met; either way the client must answer or say Unavailable.
  await c.deriveKey("a", { x: 1 }, undefined, { timeoutMs: 50 }).catch((err: unknown) => assert.ok(err instanceof Unavailable, String(err)));
  const ok = new Client({ address: server.address });
  assert.match((await ok.deriveKey("a", { x: 1 })).key, /^[0-9a-f]+$/);
});

test("close() ends the client's session; a later call opens a new one", async () => {
  const c = new Client({ address: server.address });
  assert.ok((await c.deriveKey("a", { x: 1 })).key);
  c.close();
  assert.ok((await c.deriveKey("a", { x: 2 })).key);
  c.close();
});

test("intentd gone under a live client: Unavailable, not a hang", async () => {
  const other = await Intentd.start();
  const c = new Client({ address: other.address, backoffMs: [10, 100] });
  assert.ok((await c.deriveKey("a", { x: 1 })).key);
  await other.stop();
  await assert.rejects(c.deriveKey("a", { x: 1 }, undefined, { timeoutMs: 200 }), Unavailable);
});
