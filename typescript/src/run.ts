// run: the safe claim → act → report loop, with the Go and Python clients'
// decisions.
//
// session.run(task) executes an intent only when intentd says EXECUTE,
// which it says once per approval (and again only after a confirmed
// absence). A completed intent's stored result is returned without
// executing. The task's execute runs under a lease the session heartbeats;
// the moment the lease is lost, attempt.signal aborts (pass it to fetch and
// friends). Its outcome is reported under the lease's token: a result →
// Complete; Final → Fail; NotAttempted → Release; anything else (a timeout,
// a reset, an abort) → MarkUnknown — never a fresh attempt. The next worker
// then gets RECONCILE and must ask the downstream system, by the same
// operation key, what happened: found → Complete, absent → Release and
// execute, undecided → Escalate to a person. Reports are resent while
// intentd does not answer, under the same token, for up to the client's
// reportTimeoutMs. A report refused as STALE_TOKEN (another worker or a
// reviewer took over) makes run acquire again, a bounded number of times,
// to learn what became of the intent; outcome.superseded then says so.
//
// A report refused for its content must not leave the lease held (every
// other caller would get IN_PROGRESS while the session lives): the client
// cuts free text (reasons, a failure's message) to intentd's limits in
// UTF-8 bytes; a Complete or Fail after execute refused as InvalidField (a
// result over intentd's limits, a bad Final code) becomes MarkUnknown
// ("the result could not be recorded: …": the next worker reconciles), and
// a Complete after found() refused so becomes Escalate (NEEDS_REVIEW).
// outcome.error is then the refusal.
//
// The caller's own signal (RunOptions.signal: a framework's abort, a
// timeout) aborting while execute runs may come after the effect: run
// reports MarkUnknown (never Release), waits for the report, and throws the
// abort's reason. An Acquire aborted in flight is asked once more with the
// same request id, and a lease it got is given back.
//
// What it cannot guarantee: intentd decides who may act; it cannot stop an
// act already under way. What keeps a worker paused past its lease from
// making a second order is the provider: it must deduplicate on the
// operation key (attempt.operationKey("create-order"), the same for every
// attempt and worker), or check the fencing token attempt.token.
import { create, isMessage, type MessageInitShape } from "@bufbuild/protobuf";
import {
  Outcome as Outcomes,
  ResultSchema,
  State,
  type AcquireResponse,
  type Intent,
  type RegisterRequestSchema,
  type Result,
  type Statement,
} from "../../gen/ts/intent/v1/intent_pb.js";
import { newRequestId, type Client } from "./client.js";
import { IntentdError, InvalidArgument, LeaseLost, StaleToken, Unavailable } from "./errors.js";
import type { Session } from "./session.js";

export type ResultInit = Result | MessageInitShape<typeof ResultSchema>;
export type RegisterInit = MessageInitShape<typeof RegisterRequestSchema>;

/** How often one run acquires again after its lease was superseded. */
export const MAX_TAKEOVERS = 3;

/** execute threw after it may have acted: MarkUnknown; the next worker reconciles. */
export const LEFT_UNKNOWN = "LEFT_UNKNOWN";
/** execute threw NotAttempted: Release, back to PENDING; the next Acquire executes. */
export const RELEASED = "RELEASED";

/**
 * Throw from execute for a definite failure (a declined card): the intent
 * FAILS for good. code is required (an empty one leaves the intent
 * UNKNOWN) and cut to 128 bytes; detail is cut to 1024.
 */
export class Final extends Error {
  override name = "Final";
  constructor(
    readonly code: string,
    readonly detail = "",
  ) {
    super(`final failure ${code}: ${detail}`);
  }
}

/** Throw from execute when nothing was sent downstream: the intent returns to PENDING. */
export class NotAttempted extends Error {
  override name = "NotAttempted";
}

/** What reconcile found out: make one with {@link found}, {@link absent} or {@link undecided}. */
export type Evidence =
  | { verdict: "found"; result: ResultInit }
  | { verdict: "absent"; reason: string }
  | { verdict: "undecided"; reason: string };

/**
 * The effect exists downstream; result records it (the order id, as
 * external refs). A result intentd refuses (over its limits) is escalated:
 * NEEDS_REVIEW, with the refusal as outcome.error.
 */
export const found = (result: ResultInit): Evidence => ({ verdict: "found", result });
/** The downstream system confirmed the effect does not exist: execute again, with the same operation keys. */
export const absent = (reason: string): Evidence => ({ verdict: "absent", reason });
/** The answer cannot be told: a person decides. */
export const undecided = (reason: string): Evidence => ({ verdict: "undecided", reason });

/** The caller's lease on an intent while execute or reconcile runs. */
export class Attempt {
  /** Children to register in the same transaction as this attempt's Complete (the outbox). */
  readonly children: RegisterInit[] = [];
  constructor(
    /** The intent's key. */
    readonly key: string,
    /** The lease's fencing token: send it to resources that check tokens. */
    readonly token: bigint,
    /** True in reconcile: an earlier attempt may have taken effect. */
    readonly reconciling: boolean,
    /** The intent as acquired: its params are the approved terms. */
    readonly intent: Intent,
    /** Aborts the moment the lease is lost, or the caller's signal aborts: stop, the report will say so. */
    readonly signal: AbortSignal,
    /** Aborts the moment the lease is lost (only). */
    readonly leaseLost: AbortSignal,
  ) {}

  /**
   * `<key>:<operation>`, the idempotency key to send downstream for one
   * kind of call: the same for every attempt and worker, which is what
   * makes a retry a retry. The model never invents it.
   */
  operationKey(operation: string): string {
    return `${this.key}:${operation}`;
  }

  /** Registers child in the same transaction as this attempt's Complete. */
  registerChild(child: RegisterInit): void {
    this.children.push(child);
  }
}

/** One intent to carry through its life with session.run. */
export interface Task<T = unknown> {
  key: string;
  /**
   * Performs the side effect, once, under the attempt's lease, sending
   * attempt.operationKey(...) downstream as the idempotency key; returns
   * the result to record, `{ payload?, externalRefs? }`, or nothing
   * (anything else is a TypeError after the effect: left UNKNOWN). A
   * result intentd refuses (payload over 256 KiB, more than 32 external
   * refs, a ref name or value over 256 bytes) is left UNKNOWN too, with
   * the refusal as outcome.error.
   */
  execute(attempt: Attempt): Promise<ResultInit | void> | ResultInit | void;
  /**
   * Asks the downstream system, by operation key, whether an earlier
   * attempt took effect. Without it every RECONCILE escalates; a throw
   * leaves the intent UNKNOWN for the next reconcile.
   */
  reconcile?(attempt: Attempt): Promise<Evidence> | Evidence;
  /** Registers the intent in the same transaction as the first Acquire. */
  register?: RegisterInit;
  /** When set, must equal the stored fingerprint (else FingerprintMismatch, nothing run). */
  expectedFingerprint?: string;
  /** How long to wait for another worker's attempt to finish, in ms (default 30 000). */
  waitInProgressMs?: number;
  /** Unused by run: lets a task carry its own typed value. */
  readonly _value?: T;
}

export interface RunOptions {
  /**
   * The caller's abort (a framework's signal, a timeout). Aborting while
   * execute or reconcile runs reports MarkUnknown, never Release, then
   * throws the abort's reason.
   */
  signal?: AbortSignal;
}

/** How run left the intent: `name` says it in a word, `toString()` in a sentence. */
export class Outcome<T = unknown> {
  /** True when this run called execute. */
  executed = false;
  /** True when a lease of this run was taken over: its report was kept as evidence only. */
  superseded = false;
  /** Phantom: the task's value type. */
  declare readonly _value?: T;

  constructor(
    /**
     * COMPLETED, FAILED, CANCELLED, IN_PROGRESS, NEEDS_REVIEW or EXPIRED,
     * or UNSPECIFIED when this run handed the intent back (UNKNOWN or
     * PENDING: `name` is then LEFT_UNKNOWN or RELEASED; see `error`).
     */
    readonly outcome: Outcomes,
    /** The intent as run last saw it. */
    readonly intent: Intent,
    readonly opts: {
      /** intentd's account of the last Acquire (`statement.text` for a model). */
      statement?: Statement;
      /**
       * Why the intent was left UNKNOWN or PENDING: the task's error; or
       * intentd's refusal (InvalidField) of the result or failure to record,
       * when that made run report MarkUnknown or Escalate instead.
       */
      error?: unknown;
      /** True when the lease was lost while the task ran and nobody took over. */
      leaseLost?: boolean;
    } = {},
  ) {}

  get statement(): Statement | undefined {
    return this.opts.statement;
  }
  get error(): unknown {
    return this.opts.error;
  }
  get leaseLost(): boolean {
    return this.opts.leaseLost ?? false;
  }
  /** The stored result of a COMPLETED intent. */
  get result(): Result | undefined {
    return this.intent.result;
  }
  /** execute threw after it may have acted, or its result or failure was refused, and run reported MarkUnknown: the next worker reconciles. */
  get leftUnknown(): boolean {
    return this.outcome === Outcomes.UNSPECIFIED && this.intent.state === State.UNKNOWN;
  }
  /** execute threw NotAttempted and run reported Release: the next Acquire executes it. */
  get released(): boolean {
    return this.outcome === Outcomes.UNSPECIFIED && this.intent.state === State.PENDING;
  }
  /** The outcome in a word: "COMPLETED", …, or run's own LEFT_UNKNOWN / RELEASED. */
  get name(): string {
    if (this.leftUnknown) return LEFT_UNKNOWN;
    if (this.released) return RELEASED;
    return Outcomes[this.outcome] ?? String(this.outcome);
  }

  toString(): string {
    let s = `${this.name}: intent ${this.intent.key} is ${State[this.intent.state]}`;
    const err = this.error === undefined ? "" : describe(this.error);
    if (this.leftUnknown) {
      s += ` after ${err || "an error"}; it may have taken effect, so the next worker reconciles (asks the provider by operation key) instead of executing again`;
    } else if (this.released) {
      s += ` again after ${err || "NotAttempted"}; nothing was sent, so the next Acquire executes it`;
    } else if (err) {
      s += ` (${err})`;
    }
    if (this.executed) s += "; this run executed it";
    if (this.superseded) s += "; another worker or a reviewer took over a lease of this run";
    if (this.leaseLost) s += "; the lease was lost while the task ran";
    return s;
  }
}

function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/**
 * run carries one intent through its life on session: acquire; if done,
 * the stored result without executing; if another worker holds it, wait up
 * to task.waitInProgressMs; if an earlier attempt's outcome is unknown,
 * reconcile; otherwise execute once and report. It never executes on a
 * doubt. Refusals throw their IntentdError class; a lost session throws
 * its SessionLost.
 */
export async function run<T>(session: Session, task: Task<T>, opts: RunOptions = {}): Promise<Outcome<T>> {
  if (typeof task?.execute !== "function") throw new TypeError("intentd: session.run: task.execute is required (a function of the attempt)");
  const deadline = performance.now() + (task.waitInProgressMs ?? 30_000);
  const signal = opts.signal;
  let executed = false;
  let superseded = false;
  let takeovers = 0;
  let prev: unknown;
  for (;;) {
    if (session.error) throw prev ?? session.error; // a lost session would hand out leases it cannot keep
    if (signal?.aborted) throw abortReason(signal);
    const acq = await acquire(session, task, signal);
    let out: Outcome<T> | undefined;
    try {
      if (acq.outcome === Outcomes.EXECUTE) {
        executed = true;
        out = await execute(session, task, acq, signal);
      } else if (acq.outcome === Outcomes.RECONCILE) {
        out = await reconcile(session, task, acq, signal);
        if (out === undefined) continue; // confirmed absent: acquire again and execute
      } else if (acq.outcome === Outcomes.IN_PROGRESS && performance.now() < deadline) {
        await waitWhileHeld(session, task.key, acq, deadline, signal);
        continue;
      } else {
        // final, needs review, expired, or still in progress: nothing to do
        out = new Outcome<T>(acq.outcome, acq.intent!, { statement: acq.statement });
      }
    } catch (err) {
      // ABORTED: someone took over. Acquire again to learn what became of
      // the intent (not when the caller has given up, nor forever).
      if (!(err instanceof StaleToken) || takeovers >= MAX_TAKEOVERS || signal?.aborted) throw err;
      superseded = true;
      takeovers++;
      prev = err;
      continue;
    }
    out.executed = executed;
    out.superseded = superseded;
    return out;
  }
}

/**
 * Sends Acquire. If intentd stops answering before the reply arrives (or
 * the caller aborts meanwhile), the lease may have been issued all the
 * same: it asks once more with the same request id, within the report
 * timeout, and gives back a lease it got (Release for EXECUTE, MarkUnknown
 * for RECONCILE), so the intent is not held by a worker not working on it.
 */
async function acquire(session: Session, task: Task<unknown>, signal: AbortSignal | undefined): Promise<AcquireResponse> {
  const c = session.client;
  const req = { key: task.key, sessionId: session.id, requestId: newRequestId(), expectedFingerprint: task.expectedFingerprint ?? "", register: task.register };
  try {
    return await c.acquire(req, { signal });
  } catch (err) {
    if (!(err instanceof Unavailable) && !signal?.aborted) throw err;
    let got: AcquireResponse | undefined;
    try {
      got = await c.acquire(req, { timeoutMs: c.reportTimeoutMs });
    } catch (again) {
      if (!(again instanceof IntentdError)) throw again;
    }
    if (got?.lease?.sessionId === session.id) {
      const report = { timeoutMs: c.reportTimeoutMs };
      if (got.outcome === Outcomes.EXECUTE) await c.release(task.key, got.lease.token, "caller gave up before acting", report);
      else if (got.outcome === Outcomes.RECONCILE) await c.markUnknown(task.key, got.lease.token, "caller gave up before reconciling", report);
    }
    throw err;
  }
}

function attempt(session: Session, key: string, acq: AcquireResponse, reconciling: boolean, signal: AbortSignal | undefined): Attempt {
  const token = acq.lease!.token;
  const lost = session.track(key, token);
  return new Attempt(key, token, reconciling, acq.intent!, signal ? AbortSignal.any([lost, signal]) : lost, lost);
}

/** The names a Result init object may carry: its fields' (from the schema) and protobuf-es's own. */
const RESULT_FIELDS = new Set([...ResultSchema.fields.map((f) => f.localName), "$typeName", "$unknown"]);

/**
 * What execute returned (or found() carries) as the Result to report,
 * checked before the report: anything else — a string, { order_id } — is a
 * TypeError in execute or reconcile, which leaves the intent UNKNOWN (the
 * effect may have happened) rather than a report that cannot be sent,
 * with the lease still held, or a result recorded without its fields.
 */
function toResultMessage(value: ResultInit | void | null): Result {
  if (value === undefined || value === null) return create(ResultSchema);
  if (isMessage(value, ResultSchema)) return value;
  const v = value as Record<string, unknown>;
  const proto = typeof value === "object" ? Object.getPrototypeOf(value) : undefined;
  const plain = proto === Object.prototype || proto === null;
  const bad =
    !plain ||
    Object.keys(v).some((k) => !RESULT_FIELDS.has(k)) ||
    (v.payload !== undefined && !(v.payload instanceof Uint8Array)) ||
    (v.externalRefs !== undefined && (v.externalRefs === null || typeof v.externalRefs !== "object"));
  if (bad) {
    const got = plain ? `{ ${Object.keys(v).join(", ")} }` : proto ? `a ${(proto as { constructor?: { name?: string } }).constructor?.name ?? "object"}` : typeof value;
    throw new TypeError(`intentd: not a Result: ${got}; return { payload?: Uint8Array, externalRefs?: Record<string, string> } or nothing`);
  }
  return create(ResultSchema, value);
}

/** What reconcile returned, checked: not found/absent/undecided is a TypeError (the lookup failed: UNKNOWN stays). */
function evidence(ev: Evidence): Evidence {
  if (ev?.verdict === "found") return found(toResultMessage(ev.result));
  if (ev?.verdict === "absent" || ev?.verdict === "undecided") return ev;
  throw new TypeError("intentd: reconcile must return found(result), absent(reason) or undecided(reason)");
}

type Ran<V> = { ok: true; value: V } | { ok: false; error: unknown; aborted?: boolean };

/**
 * Runs fn(att) under the lease; a lease already lost does not run fn at
 * all (NotAttempted). The caller's abort ends the wait at once, as an
 * error (the work may still be under way: its later settling is ignored).
 */
async function underLease<V>(session: Session, att: Attempt, fn: (a: Attempt) => Promise<V> | V, signal: AbortSignal | undefined): Promise<Ran<V>> {
  try {
    if (att.leaseLost.aborted) return { ok: false, error: new NotAttempted("lease lost before it started") };
    if (signal?.aborted) return { ok: false, error: abortReason(signal), aborted: true };
    const work = Promise.resolve().then(() => fn(att));
    if (!signal) return { ok: true, value: await work };
    let onAbort: (() => void) | undefined;
    const aborted = new Promise<Ran<V>>((ok) => {
      onAbort = () => ok({ ok: false, error: abortReason(signal), aborted: true });
      signal.addEventListener("abort", onAbort, { once: true });
    });
    work.catch(() => {}); // settled after an abort: nobody waits for it
    try {
      return await Promise.race([work.then((value): Ran<V> => ({ ok: true, value })), aborted]);
    } finally {
      signal.removeEventListener("abort", onAbort!);
    }
  } catch (error) {
    return { ok: false, error };
  } finally {
    session.untrack(att.key, att.token);
  }
}

/** The reason a report gives for err (the client cuts it to intentd's 1024 bytes). */
function reason(err: unknown, aborted: boolean): string {
  return aborted ? `aborted while executing (${describe(err)}): it may have taken effect` : describe(err);
}

/** True for a report intentd refused for its content (InvalidField): resending it cannot help. */
function refusedContent(err: unknown): err is InvalidArgument {
  return err instanceof InvalidArgument;
}

/**
 * The report of execute's outcome (what) was refused for its content,
 * after execute may have acted: MarkUnknown under the same token, so that
 * the lease is not left held and the next worker reconciles. The outcome is
 * a MarkUnknown's, with the refusal as its error.
 */
async function unrecorded<T>(c: Client, key: string, token: bigint, what: string, refused: InvalidArgument, lost: boolean, report: { timeoutMs: number }): Promise<Outcome<T>> {
  const resp = await c.markUnknown(key, token, `the ${what} could not be recorded: ${refused.message}`, report);
  return new Outcome<T>(markedUnknown(resp.intent!), resp.intent!, { error: refused, leaseLost: lost });
}

/** The outcome of an accepted MarkUnknown: UNSPECIFIED (left UNKNOWN), or NEEDS_REVIEW when that attempt reached max_attempts. */
function markedUnknown(intent: Intent): Outcomes {
  return intent.state === State.NEEDS_REVIEW ? Outcomes.NEEDS_REVIEW : Outcomes.UNSPECIFIED;
}

/** A refused report, as LeaseLost when the lease was lost meanwhile; StaleToken stays StaleToken, so that run acquires again. */
function leaseErr(lost: boolean, err: unknown): unknown {
  if (lost && err instanceof IntentdError && !(err instanceof StaleToken)) return new LeaseLost(`lease lost: ${err.message}`, { cause: err });
  return err;
}

async function execute<T>(session: Session, task: Task<T>, acq: AcquireResponse, signal: AbortSignal | undefined): Promise<Outcome<T>> {
  const c = session.client;
  const key = task.key;
  const att = attempt(session, key, acq, false, signal);
  const ran = await underLease(session, att, async (a) => toResultMessage(await task.execute(a)), signal);
  const lost = att.leaseLost.aborted;
  const t = att.token;
  const report = { timeoutMs: c.reportTimeoutMs };
  let out: Outcome<T>;
  try {
    if (ran.ok) {
      try {
        const resp = await c.complete(key, t, ran.value, att.children, report);
        return new Outcome<T>(Outcomes.COMPLETED, resp.intent!, { leaseLost: lost });
      } catch (refused) {
        // A result over intentd's limits: the effect happened, the record
        // of it cannot be made. UNKNOWN, so the next worker reconciles.
        if (!refusedContent(refused)) throw refused;
        return await unrecorded<T>(c, key, t, "result", refused, lost, report);
      }
    }
    const err = ran.error;
    if (err instanceof Final) {
      try {
        const resp = await c.fail(key, t, err.code, err.detail, report);
        return new Outcome<T>(Outcomes.FAILED, resp.intent!, { error: err, leaseLost: lost });
      } catch (refused) {
        // A code intentd refuses (empty): UNKNOWN rather than a held lease.
        if (!refusedContent(refused)) throw refused;
        return await unrecorded<T>(c, key, t, "failure", refused, lost, report);
      }
    }
    if (err instanceof NotAttempted) {
      const resp = await c.release(key, t, `not attempted: ${err.message}`, report);
      out = new Outcome<T>(Outcomes.UNSPECIFIED, resp.intent!, { error: err, leaseLost: lost });
    } else {
      // Anything else — a timeout, a reset, an abort — may have happened
      // after the effect: UNKNOWN, never a Release.
      const resp = await c.markUnknown(key, t, reason(err, ran.aborted ?? false), report);
      out = new Outcome<T>(markedUnknown(resp.intent!), resp.intent!, { error: err, leaseLost: lost });
    }
  } catch (rerr) {
    throw leaseErr(lost, rerr);
  }
  if (!ran.ok && ran.aborted) throw ran.error;
  return out;
}

/** Asks task.reconcile what became of an earlier attempt and reports it; undefined after a confirmed absence. */
async function reconcile<T>(session: Session, task: Task<T>, acq: AcquireResponse, signal: AbortSignal | undefined): Promise<Outcome<T> | undefined> {
  const c = session.client;
  const key = task.key;
  const att = attempt(session, key, acq, true, signal);
  let ev: Evidence = undecided("no reconcile function");
  let ran: Ran<Evidence> = { ok: true, value: ev };
  if (task.reconcile) {
    const fn = task.reconcile.bind(task);
    ran = await underLease(session, att, async (a) => evidence(await fn(a)), signal);
    if (ran.ok) ev = ran.value;
  } else {
    session.untrack(key, att.token);
  }
  const lost = att.leaseLost.aborted;
  const t = att.token;
  const report = { timeoutMs: c.reportTimeoutMs };
  let out: Outcome<T> | undefined;
  try {
    if (!ran.ok) {
      // The lookup itself failed: nothing was learned. Leave the intent
      // UNKNOWN for the next reconcile rather than for a person.
      const resp = await c.markUnknown(key, t, `reconcile failed: ${reason(ran.error, ran.aborted ?? false)}`, report);
      out = new Outcome<T>(markedUnknown(resp.intent!), resp.intent!, { error: ran.error, leaseLost: lost });
    } else if (ev.verdict === "found") {
      try {
        const resp = await c.complete(key, t, ev.result, att.children, report);
        out = new Outcome<T>(Outcomes.COMPLETED, resp.intent!, { leaseLost: lost });
      } catch (refused) {
        // The effect exists but its result is over intentd's limits:
        // another reconcile would find the same, so a person decides.
        if (!refusedContent(refused)) throw refused;
        const why = `found downstream, but the result could not be recorded: ${refused.message}`;
        const resp = await c.escalate(key, why, { token: t, actor: "intentd.run" }, report);
        out = new Outcome<T>(Outcomes.NEEDS_REVIEW, resp.intent!, { error: refused, leaseLost: lost });
      }
    } else if (ev.verdict === "absent") {
      await c.release(key, t, ev.reason, report);
      return undefined;
    } else {
      const resp = await c.escalate(key, ev.reason || "undecided", { token: t, actor: "intentd.run" }, report);
      out = new Outcome<T>(Outcomes.NEEDS_REVIEW, resp.intent!, { leaseLost: lost });
    }
  } catch (rerr) {
    throw leaseErr(lost, rerr);
  }
  if (!ran.ok && ran.aborted) throw ran.error;
  return out;
}

/**
 * Waits until the intent leaves IN_PROGRESS, watching its record from the
 * revision Acquire saw, or until deadline. A broken watch falls back to a
 * short sleep: the next Acquire tells the truth anyway.
 */
async function waitWhileHeld(session: Session, key: string, acq: AcquireResponse, deadline: number, signal: AbortSignal | undefined): Promise<void> {
  const c = session.client;
  const left = () => Math.max(deadline - performance.now(), 1);
  try {
    for await (const ev of c.watch({ key, startRevision: acq.intent!.revision + 1n }, { timeoutMs: left(), signal })) {
      if (ev.intent && ev.intent.state !== State.IN_PROGRESS) return;
    }
  } catch (err) {
    if (!(err instanceof IntentdError)) throw err;
    await new Promise((ok) => setTimeout(ok, Math.min(c.backoffMinMs, left())));
  }
  if (signal?.aborted) throw abortReason(signal);
}
