// A live intentd for the Node suite: $INTENTD_BIN, or cmd/intentd built
// with `go build`, run with an embedded etcd in a temporary data directory
// on ports of its own choosing; and an effect-counting provider.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { IntentService } from "../../gen/ts/intent/v1/intent_pb.js";

/** The repository's root (this file is compiled to typescript/build/typescript/test). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

function binary(): string {
  if (process.env.INTENTD_BIN) return process.env.INTENTD_BIN;
  const bin = join(mkdtempSync(join(tmpdir(), "intentd-bin-")), "intentd");
  execFileSync("go", ["build", "-o", bin, "./cmd/intentd"], { cwd: REPO, stdio: "inherit" });
  return bin;
}

/** A running intentd. */
export class Intentd {
  readonly logs: string[] = [];
  private constructor(
    readonly address: string,
    private readonly proc: ChildProcess,
    private readonly dataDir: string,
  ) {}

  /** Starts intentd; `extra` are further flags (e.g. rate limits off for a benchmark). */
  static async start(...extra: string[]): Promise<Intentd> {
    const dataDir = mkdtempSync(join(tmpdir(), "intentd-data-"));
    const proc = spawn(binary(), [
      "--data-dir", dataDir,
      "--listen", "127.0.0.1:0",
      "--metrics-listen", "",
      "--embed-client-url", "http://127.0.0.1:0",
      "--embed-peer-url", "http://127.0.0.1:0",
      "--janitor-interval", "200ms",
      "--log-format", "json",
      ...extra,
    ], { stdio: ["ignore", "ignore", "pipe"] });
    const logs: string[] = [];
    const address = await new Promise<string>((ok, fail) => {
      const timer = setTimeout(() => fail(new Error("intentd did not start in 30s:\n" + logs.slice(-30).join("\n"))), 30_000);
      proc.on("exit", (code) => fail(new Error(`intentd exited (${code}):\n` + logs.slice(-30).join("\n"))));
      createInterface({ input: proc.stderr! }).on("line", (line) => {
        logs.push(line);
        try {
          const rec = JSON.parse(line) as { msg?: string; grpc?: string };
          if (rec.msg === "intentd serving" && rec.grpc) {
            clearTimeout(timer);
            ok(rec.grpc);
          }
        } catch {
          // not a JSON line
        }
      });
    });
    const d = new Intentd(address, proc, dataDir);
    d.logs.push(...logs);
    return d;
  }

  /** A client of the generated IntentService over the gRPC protocol. */
  client(): Client<typeof IntentService> {
    return createClient(IntentService, createGrpcTransport({ baseUrl: `http://${this.address}` }));
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode === null) {
      const exited = new Promise((ok) => this.proc.once("exit", ok));
      this.proc.kill("SIGTERM");
      const timer = setTimeout(() => this.proc.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

/**
 * An effect-counting merchant. It does NOT deduplicate: every create is a
 * new order, so a second execution would show as a second effect.
 */
export class Provider {
  private readonly orders = new Map<string, string[]>();
  private next = 1;

  create(operationKey: string): string {
    const id = `order-${this.next++}`;
    this.orders.set(operationKey, [...(this.orders.get(operationKey) ?? []), id]);
    return id;
  }

  lookup(operationKey: string): string[] {
    return this.orders.get(operationKey) ?? [];
  }

  effects(operationKey: string): number {
    return this.lookup(operationKey).length;
  }
}
