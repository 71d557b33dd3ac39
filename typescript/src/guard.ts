// Guarded tools: an agent's side-effecting tool tied to one approved,
// keyed, durable execution, for any framework's host-side seam around a
// tool call (the adapters in src/adapters are thin layers over this).
//
// A tool is declared once:
//
//   const buyItem = guarded({
//     action: "buy-item",
//     identity: (ctx, args) => ({ conversation: ctx.conversationId, item: args.item }),
//     params: ["item", "max_eur"],
//     reconcile: findOrder,
//     execute: (attempt, args) => merchant.createOrder({ idempotencyKey: attempt.operationKey("create-order"), ...args }),
//   });
//
// and run through a Ledger (a Client and a worker session):
//
//   const ledger = new Ledger(client);
//   await ledger.approve(buyItem, ctx, args);           // the host's approval step: Register
//   const answer = await ledger.call(buyItem, ctx, args); // the tool call: Acquire with the approved fingerprint
//   return answer.text;                                 // what the model reads
//
// The key is the business identity — the action and the identity fields
// the host takes from its own context and the tool's arguments, never a
// tool-call id or anything the model invents — and intentd derives it. The
// approved terms (params) are registered at approval; a call acquires with
// their expected fingerprint, so arguments edited after approval fail
// closed, and nothing is sent. What the model reads, by outcome:
//
//   EXECUTE                the tool runs once, its result is recorded (Complete) and returned
//   completed before       intentd's statement: "already_completed … action_taken: none"
//   in progress elsewhere  waits up to waitInProgressMs, then says so
//   UNKNOWN, NEEDS_REVIEW  "… under human review; do not retry"
//   other terms            "refused: FINGERPRINT_MISMATCH … ask the user"
//   not approved           "refused: NOT_APPROVED … ask the user"
import { AsyncLocalStorage } from "node:async_hooks";
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import { Outcome as Outcomes, type Result } from "../../gen/ts/intent/v1/intent_pb.js";
import type { Client } from "./client.js";
import { FingerprintMismatch, IntentNotFound } from "./errors.js";
import { LEFT_UNKNOWN, RELEASED, type Attempt, type Evidence, type Outcome, type ResultInit, type Task } from "./run.js";
import type { Session } from "./session.js";

/**
 * How a tool names identity fields or approved terms: a function of the
 * host's context and the tool's arguments, or the names of arguments to take.
 */
export type Fields<Ctx, Args> = ((ctx: Ctx, args: Args) => JsonObject) | readonly (keyof Args & string)[];

/** A side-effecting tool and what makes one call of it one approved intent. */
export interface GuardedSpec<Ctx = any, Args = any> {
  /** The business action ("buy-item", "refund.issue"): part of the key. */
  action: string;
  /**
   * The fields that make the action distinct (the conversation, the order),
   * from the host's context and the arguments: with the action, the key.
   * Never a tool-call id.
   */
  identity: Fields<Ctx, Args>;
  /** The approved terms (item, amount, merchant): their fingerprint binds the execution to the approval. */
  params: Fields<Ctx, Args>;
  /**
   * Performs the effect once, sending attempt.operationKey(...) downstream;
   * returns the tool's result (a string, a JSON value, or an intent.v1
   * Result). Absent where the framework's own tool is the effect (an
   * adapter runs it, and it reads its attempt from currentAttempt()).
   */
  execute?: (attempt: Attempt, args: Args) => unknown;
  /**
   * Asks the provider by operation key whether an earlier attempt took
   * effect: found, absent or undecided. Without it an unknown outcome goes
   * to a person.
   */
  reconcile?: (attempt: Attempt, args: Args) => Promise<Evidence> | Evidence;
  /** The approver's one-line sentence, registered for reviewers. */
  summary?: (ctx: Ctx, args: Args) => string;
  /** The tool's name for the model (default: the action). */
  name?: string;
  /** How long a call waits for another worker's attempt, in ms (default 5 000). */
  waitInProgressMs?: number;
}

/** A guarded tool: its spec, with the name filled in. */
export interface GuardedTool<Ctx = any, Args = any> extends GuardedSpec<Ctx, Args> {
  name: string;
}

/** Declares a guarded tool (see GuardedSpec for the fields). */
export function guarded<Ctx = any, Args = any>(spec: GuardedSpec<Ctx, Args>): GuardedTool<Ctx, Args> {
  return { ...spec, name: spec.name || spec.action };
}

function fields<Ctx, Args>(spec: Fields<Ctx, Args>, ctx: Ctx, args: Args): JsonObject {
  if (typeof spec === "function") return { ...spec(ctx, args) };
  const out: JsonObject = {};
  for (const name of spec) out[name] = (args as Record<string, JsonValue>)[name] as JsonValue;
  return out;
}

const current = new AsyncLocalStorage<Attempt>();

/**
 * The attempt a guarded call is executing under, for a framework's own
 * tool function run by an adapter: send
 * currentAttempt().operationKey("create-order") downstream. Throws outside
 * a guarded call.
 */
export function currentAttempt(): Attempt {
  const att = current.getStore();
  if (!att) throw new Error("not inside a guarded tool call: run the tool through intentd's adapter");
  return att;
}

/** One call's intent: its key and the fingerprint of its terms, as intentd derives them. */
export interface Terms {
  key: string;
  fingerprint: string;
  identity: JsonObject;
  params: JsonObject;
}

/** What a guarded call came to: `text` is for the model, the rest for the host. */
export interface Answer {
  text: string;
  /**
   * executed, replayed, in_progress, under_review, failed, not_done,
   * refused (`reason` says which), or the statement's status of a final
   * intent (cancelled, expired).
   */
  status: string;
  key: string;
  /** True when this call ran the tool. */
  executed: boolean;
  /** The tool's return value, when this call ran it. */
  value?: unknown;
  /** For refused: FINGERPRINT_MISMATCH or NOT_APPROVED. */
  reason?: string;
  outcome?: Outcome;
}

export interface LedgerOptions {
  /** The worker name of the ledger's session (default "agent-host"). */
  worker?: string;
  /** The session's TTL in ms (default 15 000). */
  ttlMs?: number;
}

/**
 * Runs guarded tools on intentd: one Client and one worker session (opened
 * at first use, opened again when lost).
 */
export class Ledger {
  readonly worker: string;
  readonly ttlMs: number;
  private opening?: Promise<Session>;
  private readonly termsMemo = new Map<string, Terms>();

  constructor(
    readonly client: Client,
    opts: LedgerOptions = {},
  ) {
    this.worker = opts.worker ?? "agent-host";
    this.ttlMs = opts.ttlMs ?? 15_000;
  }

  /** The ledger's worker session. */
  async session(): Promise<Session> {
    const held = this.opening;
    if (held) {
      const s = await held.catch(() => undefined);
      if (s && !s.error) return s;
      if (this.opening !== held) return this.session();
    }
    const opening = this.client.openSession(this.worker, this.ttlMs);
    this.opening = opening;
    opening.catch(() => {
      if (this.opening === opening) this.opening = undefined;
    });
    return opening;
  }

  /** Closes the session. */
  async close(): Promise<void> {
    const held = this.opening;
    this.opening = undefined;
    const s = await held?.catch(() => undefined);
    if (s && !s.error) await s.close();
  }

  /** The key and fingerprint of a call, from one DeriveKey (kept for the same fields: a pure function of them). */
  async terms<Ctx, Args>(tool: GuardedTool<Ctx, Args>, ctx: Ctx, args: Args): Promise<Terms> {
    const identity = fields(tool.identity, ctx, args);
    const params = fields(tool.params, ctx, args);
    const memo = sortedJson([tool.action, identity, params]);
    let got = this.termsMemo.get(memo);
    if (!got) {
      const resp = await this.client.deriveKey(tool.action, identity, params);
      got = { key: resp.key, fingerprint: resp.fingerprint, identity, params };
      if (this.termsMemo.size > 4096) this.termsMemo.clear();
      this.termsMemo.set(memo, got);
    }
    return got;
  }

  /**
   * The host's approval step: registers these terms as the approved intent
   * (idempotent; other terms for the same identity throw FingerprintMismatch).
   */
  async approve<Ctx, Args>(tool: GuardedTool<Ctx, Args>, ctx: Ctx, args: Args, opts: { summary?: string } = {}): Promise<Terms> {
    const terms = await this.terms(tool, ctx, args);
    const summary = opts.summary || tool.summary?.(ctx, args) || "";
    await this.client.register({ key: "", params: terms.params, action: tool.action, identity: terms.identity, summary: summary.slice(0, 200) });
    return terms;
  }

  /**
   * The tool call: acquires the intent with the fingerprint of these
   * arguments' terms and answers as the module says. `execute` (the attempt
   * → the result) stands in for tool.execute, as an adapter runs the
   * framework's own tool. The framework's abort `signal` while the tool
   * runs is reported as unknown (MarkUnknown, never Release) and thrown.
   */
  async call<Ctx, Args>(
    tool: GuardedTool<Ctx, Args>,
    ctx: Ctx,
    args: Args,
    opts: { execute?: (attempt: Attempt) => unknown; signal?: AbortSignal } = {},
  ): Promise<Answer> {
    const effect = opts.execute ?? (tool.execute ? (att: Attempt) => tool.execute!(att, args) : undefined);
    if (!effect) throw new TypeError(`guarded tool ${tool.name} has no execute: pass execute (its adapter does)`);
    const terms = await this.terms(tool, ctx, args);
    const ran: { value?: unknown; done: boolean } = { done: false };
    const task: Task = {
      key: terms.key,
      expectedFingerprint: terms.fingerprint,
      waitInProgressMs: tool.waitInProgressMs ?? 5_000,
      execute: async (att) => {
        const value = await current.run(att, () => effect(att));
        ran.value = value;
        ran.done = true;
        return toResult(value);
      },
      reconcile: tool.reconcile ? (att) => tool.reconcile!(att, args) : undefined,
    };
    const session = await this.session();
    let out: Outcome;
    try {
      out = await session.run(task, { signal: opts.signal });
    } catch (err) {
      if (err instanceof FingerprintMismatch) {
        const approved = await this.approvedParams(terms.key);
        return {
          text:
            `refused: FINGERPRINT_MISMATCH: ${tool.name} was approved with other terms (${sortedJson(approved)}) than these ` +
            `(${sortedJson(terms.params)}); nothing was sent. Ask the user to approve the new terms, or call it with the approved ones.`,
          status: "refused",
          key: terms.key,
          executed: false,
          reason: "FINGERPRINT_MISMATCH",
        };
      }
      if (err instanceof IntentNotFound) {
        return {
          text: `refused: NOT_APPROVED: ${tool.name} with these terms (${sortedJson(terms.params)}) has not been approved; nothing was sent. Ask the user to approve it first.`,
          status: "refused",
          key: terms.key,
          executed: false,
          reason: "NOT_APPROVED",
        };
      }
      throw err;
    }
    return answer(tool, terms, out, ran);
  }

  private async approvedParams(key: string): Promise<JsonValue> {
    try {
      return ((await this.client.get(key)).params ?? null) as JsonValue;
    } catch (err) {
      if (err instanceof IntentNotFound) return null;
      throw err;
    }
  }
}

/**
 * A tool's return value as the Result intentd records: a Result as it is;
 * anything else as its JSON payload, with the scalar fields of an object as
 * external references (which replays name).
 */
export function toResult(value: unknown): ResultInit {
  if (isResult(value)) return value;
  const refs: Record<string, string> = {};
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) {
      if (typeof v === "string" || typeof v === "number" || typeof v === "boolean" || typeof v === "bigint") refs[k] = String(v);
    }
  }
  const json = JSON.stringify(value ?? null, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
  return { payload: new TextEncoder().encode(json), externalRefs: refs };
}

function isResult(v: unknown): v is Result {
  return v !== null && typeof v === "object" && (v as { $typeName?: string }).$typeName === "intent.v1.Result";
}

/** The words for the model of one run's outcome. */
export function answer(tool: GuardedTool, terms: Terms, out: Outcome, ran: { value?: unknown; done: boolean }): Answer {
  const key = terms.key;
  const said = out.statement?.text ?? "";
  const base = { key, outcome: out };
  if (out.name === LEFT_UNKNOWN || out.outcome === Outcomes.NEEDS_REVIEW) {
    const why = out.error !== undefined ? ` (${errText(out.error)})` : "";
    return {
      ...base,
      text: `under_review: ${tool.name} may or may not have taken effect${why}; it is under human review; do not retry, and tell the user a person will confirm it.`,
      status: "under_review",
      executed: out.executed,
    };
  }
  if (out.name === RELEASED) {
    return {
      ...base,
      text: `not_done: ${tool.name} was not carried out (${errText(out.error)}); nothing was sent. You may call it again.`,
      status: "not_done",
      executed: out.executed,
    };
  }
  if (out.outcome === Outcomes.COMPLETED) {
    if (out.executed && ran.done) {
      const text = typeof ran.value === "string" ? ran.value : sortedJson(ran.value);
      return { ...base, text, status: "executed", executed: true, value: ran.value };
    }
    if (said) return { ...base, text: said, status: "replayed", executed: false };
    const refs = out.result?.externalRefs ?? {};
    const with_ = Object.keys(refs).length ? ` with ${sortedJson(refs)}` : "";
    return {
      ...base,
      text: `already_completed: ${tool.name} had taken effect in an earlier attempt${with_}; it was recorded, not repeated; action_taken: none`,
      status: "replayed",
      executed: false,
    };
  }
  if (out.outcome === Outcomes.IN_PROGRESS) {
    return {
      ...base,
      text: `in_progress: ${tool.name} is being carried out by another worker and was not started again; do not retry now, check again later. (${said})`,
      status: "in_progress",
      executed: false,
    };
  }
  if (out.outcome === Outcomes.FAILED) {
    if (out.executed && out.error !== undefined) {
      const f = out.intent.failure;
      return {
        ...base,
        text: `failed: ${tool.name} failed for good (${f?.code}: ${f?.message}); do not retry with the same terms.`,
        status: "failed",
        executed: true,
      };
    }
    return { ...base, text: said || `already_failed: ${tool.name} failed before; action_taken: none`, status: "failed", executed: false };
  }
  const status = out.statement?.status || out.name.toLowerCase();
  return { ...base, text: said || `${status}: ${tool.name} was not carried out`, status, executed: false };
}

function errText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

/** JSON with object keys sorted (the texts the model reads are stable). */
export function sortedJson(value: unknown): string {
  return JSON.stringify(value ?? null, (_k, v: unknown) => {
    if (typeof v === "bigint") return v.toString();
    if (v !== null && typeof v === "object" && !Array.isArray(v)) {
      return Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    }
    return v;
  });
}
