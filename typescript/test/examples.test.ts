// The README's examples run as they are (examples/*.mjs, importing the
// package by its name, "intentd", which Node resolves to this package's
// dist/), against a live intentd; and the README shows them verbatim.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { Intentd, REPO } from "./live.js";

const run = promisify(execFile);
const HERE = join(REPO, "typescript");
let server: Intentd;

before(async () => {
  server = await Intentd.start();
});
after(async () => {
  await server?.stop();
});

async function example(name: string): Promise<string> {
  const { stdout } = await run(process.execPath, [join(HERE, "examples", name)], { cwd: HERE, env: { ...process.env, INTENTD_ADDR: server.address }, timeout: 60_000 });
  return stdout;
}

test("quickstart.mjs: the first run executes, the second replays the stored result", async () => {
  const out = await example("quickstart.mjs");
  assert.match(out, /^run 1: COMPLETED, executed: true, order (order-for-\w+)\nrun 2: COMPLETED, executed: false, order \1\n$/);
});

test("ai-sdk.mjs: the approved tool runs once; the model's second call reads the statement; one order", async () => {
  const out = await example("ai-sdk.mjs");
  assert.match(out, /^turn 1: the model read: \{"item":"desk lamp","order_id":"order-1"\}\n/);
  assert.match(out, /\nturn 2: the model read: already_completed: intent \w+ .*action_taken: none\n/);
  assert.match(out, /\norders placed: 1\n$/);
});

test("README.md shows each example verbatim", () => {
  const readme = readFileSync(join(HERE, "README.md"), "utf8");
  for (const name of ["quickstart.mjs", "ai-sdk.mjs"]) {
    const body = readFileSync(join(HERE, "examples", name), "utf8");
    assert.ok(readme.includes("```js\n" + body + "```"), `README.md does not show examples/${name} as it is`);
  }
});
