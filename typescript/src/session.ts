// Session: a worker's liveness, heartbeated by an unreferenced timer, and
// the leases it names in its heartbeats, each with an AbortController that
// aborts the moment the lease is lost.
import { ConnectError } from "@connectrpc/connect";
import type { HeldLease } from "../../gen/ts/intent/v1/intent_pb.js";
import type { Client } from "./client.js";
import { SessionLost, SessionNotFound, StaleToken, toIntentdError } from "./errors.js";
import { run, type Outcome, type RunOptions, type Task } from "./run.js";

interface Held {
  token: bigint;
  lost: AbortController;
}

/**
 * A worker's session: the unit of liveness of every lease it holds. Opened
 * by {@link Client.openSession}. A timer heartbeats every TTL/3, naming the
 * leases the session tracks; it is unreferenced, so an idle session never
 * keeps Node running. A lease found superseded is lost at once (its
 * attempt's `signal` aborts); when the session itself is gone —
 * SESSION_NOT_FOUND, {@link close}, or no heartbeat confirmed for a whole
 * TTL — every lease is lost and {@link lost} aborts. The TTL is counted
 * from the sending of the last heartbeat intentd confirmed, so the worker
 * gives up its leases no later than etcd can expire them.
 */
export class Session {
  /** Aborts when the session is lost; its reason is {@link error}. */
  readonly lost: AbortSignal;
  /** Why the session was lost (undefined while it is not). */
  error?: Error;
  private readonly lostController = new AbortController();
  private readonly held = new Map<string, Held>();
  private lastOk: number;
  private timer?: NodeJS.Timeout;
  private nextBeat: number;
  private beating?: Promise<void>;
  private closed = false;

  constructor(
    readonly client: Client,
    readonly id: string,
    readonly worker: string,
    /** The session's time to live without a heartbeat, in ms. */
    readonly ttlMs: number,
    openedAt: number,
  ) {
    this.lost = this.lostController.signal;
    this.lastOk = openedAt;
    this.nextBeat = performance.now() + this.every();
    this.schedule();
  }

  /** Carries one intent through its life on this session (see {@link run}). */
  run<T = unknown>(task: Task<T>, opts?: RunOptions): Promise<Outcome<T>> {
    return run(this, task, opts);
  }

  /**
   * Starts naming a lease in heartbeats; the signal aborts when the lease
   * is lost (superseded, or the session lost).
   */
  track(key: string, token: bigint): AbortSignal {
    const h: Held = { token, lost: new AbortController() };
    if (this.error) {
      h.lost.abort(this.error);
      return h.lost.signal;
    }
    this.held.get(key)?.lost.abort(new SessionLost(`lease on ${key} superseded by this session's token ${token}`));
    this.held.set(key, h);
    return h.lost.signal;
  }

  /** Stops naming a lease (it was reported on). */
  untrack(key: string, token: bigint): void {
    const h = this.held.get(key);
    if (h && h.token === token) this.held.delete(key);
  }

  /**
   * Stops heartbeating and ends the session on the server: every lease it
   * still holds becomes UNKNOWN there ("I stopped", never "I did nothing").
   */
  async close(opts?: { timeoutMs?: number }): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    await this.beating;
    this.lose(new SessionLost("session closed"));
    await this.client.call((o) => this.client.rpc.closeSession({ tenant: this.client.tenant, sessionId: this.id }, o), opts);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  private every(): number {
    return Math.max(this.ttlMs / 3, 100);
  }

  private expiry(): number {
    return this.lastOk + this.ttlMs;
  }

  private schedule(): void {
    if (this.closed || this.error) return;
    const delay = Math.max(0, Math.min(this.nextBeat, this.expiry()) - performance.now());
    this.timer = setTimeout(() => this.tick(), delay);
    this.timer.unref();
  }

  private tick(): void {
    if (this.closed || this.error) return;
    if (performance.now() >= this.expiry()) {
      this.lose(new SessionLost("no heartbeat confirmed within the session TTL"));
      return;
    }
    if (performance.now() < this.nextBeat) {
      this.schedule();
      return;
    }
    const every = this.every();
    this.nextBeat = performance.now() + every;
    this.beating = this.beat(every).finally(() => {
      this.beating = undefined;
      this.schedule();
    });
  }

  /** One heartbeat naming the tracked leases; not resent (the next beat is the resend). */
  private async beat(every: number): Promise<void> {
    const sent = performance.now();
    const timeoutMs = Math.min(sent + every, this.expiry()) - sent;
    if (timeoutMs <= 0) return;
    const leases: Pick<HeldLease, "key" | "token">[] = [];
    for (const [key, h] of this.held) leases.push({ key, token: h.token });
    try {
      await this.client.rpc.heartbeat({ tenant: this.client.tenant, sessionId: this.id, leases }, { timeoutMs, headers: this.client.headers });
    } catch (err) {
      this.answered(sent, toIntentdError(ConnectError.from(err)));
      return;
    }
    this.answered(sent, undefined);
  }

  private answered(sent: number, err: Error | undefined): void {
    if (err === undefined) {
      this.lastOk = Math.max(this.lastOk, sent);
    } else if (err instanceof StaleToken) {
      // The session is alive (intentd keeps it so before checking), but a
      // lease was superseded: that attempt must stop.
      this.lastOk = Math.max(this.lastOk, sent);
      const key = err.statement?.intentKey ?? "";
      for (const [k, h] of [...this.held]) {
        if (h.token < err.currentToken && (!key || k === key)) {
          this.held.delete(k);
          h.lost.abort(err);
        }
      }
    } else if (err instanceof SessionNotFound) {
      this.lose(err);
    }
  }

  /** Loses the session and every lease it holds (idempotent). */
  lose(err: Error): void {
    if (this.error) return;
    this.error = err;
    clearTimeout(this.timer);
    for (const h of this.held.values()) h.lost.abort(err);
    this.held.clear();
    this.lostController.abort(err);
  }
}
