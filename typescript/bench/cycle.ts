// The TypeScript loop's cycle against the Go client's, in one run.
//
// A cycle is what cmd/intentbench's cycle workload measures: a fresh
// intent, Acquire with register (EXECUTE), then Complete, with 300-byte
// params (canonical JSON) and result. TypeScript runs it through
// session.run at one worker, as a worker would (the session heartbeats,
// the lease is tracked, the outcome built). The Go figure is intentbench's
// at C=1 (`intentbench --intentd-addr … --workloads cycle --levels 1
// --rounds 1`, Go's generated gRPC client) against the same intentd,
// measured right before or right after the TypeScript one (the order
// alternates by round), so that both see the same load on the machine.
// Each measurement starts with a warm-up (a third of --duration, at most a
// second), as intentbench's do.
//
//   cd typescript && npm run build && INTENTD_BIN=/tmp/intentd node build/typescript/bench/cycle.js [--duration 3] [--rounds 5]
//
// It prints per round and as medians: cycles/s and the median, mean and p99
// cycle of each, the client's CPU per cycle; the last line is RESULT with
// the median of the rounds' ratios of the median cycle (TypeScript ÷ Go:
// issue 29's target is at most 1.2) and the load average.
// $INTENTBENCH_BIN names a built intentbench (else it is built).
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Client, type Session, type Task } from "../src/index.js";
import { Intentd, REPO } from "../test/live.js";

const PAYLOAD = 300;
const { values } = parseArgs({ options: { duration: { type: "string", default: "3" }, rounds: { type: "string", default: "5" } } });
const seconds = Number(values.duration);
const rounds = Number(values.rounds);

function letters(n: number): string {
  const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  return Array.from(randomBytes(n), (b) => abc[b % abc.length]).join("");
}

// intentbench's payloads: params whose canonical JSON, {"note":"…"}, is
// PAYLOAD bytes, and a result of PAYLOAD bytes, {"r":"…"}.
const PARAMS = { note: letters(PAYLOAD - '{"note":""}'.length) };
const RESULT = { payload: new TextEncoder().encode(`{"r":"${letters(PAYLOAD - '{"r":""}'.length)}"}`) };
const RUN = randomBytes(4).toString("hex");
let n = 0;

function task(): Task {
  const key = `tsbench-${RUN}-${++n}`;
  return { key, execute: () => RESULT, register: { key, params: PARAMS } };
}

interface Figures {
  rate: number; // cycles/s
  p50: number; // ms
  mean: number; // ms
  p99: number; // ms
  cpu: number; // client CPU µs per cycle (NaN for Go)
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor((s.length - 1) / 2)]! : NaN;
};
const quantile = (s: number[], q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))]!;

async function cycles(session: Session, ms: number): Promise<number[]> {
  const lats: number[] = [];
  const end = performance.now() + ms;
  while (performance.now() < end) {
    const t0 = performance.now();
    const out = await session.run(task());
    lats.push(performance.now() - t0);
    if (!out.executed) throw new Error(`cycle did not execute: ${String(out)}`);
  }
  return lats;
}

async function tsMeasure(session: Session): Promise<Figures> {
  await cycles(session, Math.min(1000, (seconds * 1000) / 3)); // warm-up
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const lats = await cycles(session, seconds * 1000);
  const wall = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(c0);
  const s = [...lats].sort((a, b) => a - b);
  return {
    rate: lats.length / wall,
    p50: quantile(s, 0.5),
    mean: lats.reduce((a, b) => a + b, 0) / lats.length,
    p99: quantile(s, 0.99),
    cpu: (cpu.user + cpu.system) / lats.length,
  };
}

function goMeasure(bench: string, address: string): Figures {
  const out = execFileSync(bench, ["--intentd-addr", address, "--workloads", "cycle", "--levels", "1", "--rounds", "1", "--duration", `${seconds}s`, "--payload", String(PAYLOAD)], {
    cwd: REPO,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "ignore"],
  });
  // "C=1   611   937   0.65   1.34 / 6.40   0.95 / 3.92 ..."
  const m = /^C=1\s+([\d,.]+)\s+\S+\s+\S+\s+([\d.]+) \/ ([\d.]+)/m.exec(out);
  if (!m) throw new Error(`no C=1 row in intentbench's output:\n${out}`);
  return { rate: Number(m[1]!.replace(/,/g, "")), p50: Number(m[2]), mean: NaN, p99: Number(m[3]), cpu: NaN };
}

function intentbench(): string {
  if (process.env.INTENTBENCH_BIN) return process.env.INTENTBENCH_BIN;
  const bin = join(mkdtempSync(join(tmpdir(), "intentbench-")), "intentbench");
  execFileSync("go", ["build", "-o", bin, "./cmd/intentbench"], { cwd: REPO, stdio: "inherit" });
  return bin;
}

const fmt = (x: number, d: number) => (Number.isNaN(x) ? "n/a" : x.toFixed(d));
const row = (name: string, f: Figures) =>
  `${name.padEnd(28)} ${fmt(f.rate, 0).padStart(8)} ${fmt(f.p50, 3).padStart(8)} ${fmt(f.mean, 3).padStart(8)} ${fmt(f.p99, 3).padStart(8)} ${fmt(f.cpu, 0).padStart(10)}`;

const bench = intentbench();
const server = await Intentd.start("--rate-per-principal", "0", "--rate-per-tenant", "0");
const client = new Client({ address: server.address });
const session = await client.openSession("ts-bench", 300_000);
const ts: Figures[] = [];
const go: Figures[] = [];
try {
  console.log(`cycle at one worker: fresh intent, Acquire with register (EXECUTE) + Complete, ${PAYLOAD} B payloads; ${rounds} rounds of ${seconds}s, order alternating; Node ${process.version}`);
  console.log(`${"".padEnd(28)} ${"cycles/s".padStart(8)} ${"p50 ms".padStart(8)} ${"mean ms".padStart(8)} ${"p99 ms".padStart(8)} ${"CPU µs/c".padStart(10)}`);
  for (let r = 1; r <= rounds; r++) {
    const order = r % 2 === 1 ? ["ts", "go"] : ["go", "ts"];
    for (const which of order) {
      if (which === "ts") ts.push(await tsMeasure(session));
      else go.push(goMeasure(bench, server.address));
    }
    console.log(row(`round ${r} TypeScript session.run`, ts.at(-1)!));
    console.log(row(`round ${r} Go (intentbench)`, go.at(-1)!));
  }
  const med = (fs: Figures[], k: keyof Figures) => median(fs.map((f) => f[k]));
  const summary = (fs: Figures[]): Figures => ({ rate: med(fs, "rate"), p50: med(fs, "p50"), mean: med(fs, "mean"), p99: med(fs, "p99"), cpu: med(fs, "cpu") });
  console.log(row("median TypeScript", summary(ts)));
  console.log(row("median Go", summary(go)));
  const ratio = median(ts.map((t, i) => t.p50 / go[i]!.p50));
  const rateRatio = median(ts.map((t, i) => t.rate / go[i]!.rate));
  console.log(`RESULT ts_vs_go_p50=${ratio.toFixed(2)} (target <= 1.2: ${ratio <= 1.2 ? "met" : "not met"}) ts_vs_go_rate=${rateRatio.toFixed(2)} load=${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
} finally {
  await session.close();
  await server.stop();
}
