// Client: typed calls to intentd that resend a call only while intentd did
// not answer (UNAVAILABLE, or the attempt's deadline), and throw every
// refusal as its IntentdError subclass (src/errors.ts).
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { JsonObject, MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type CallOptions, type Client as ConnectClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  IntentService,
  type AcquireRequestSchema,
  type AcquireResponse,
  type CompleteResponse,
  type DeriveKeyResponse,
  type EscalateResponse,
  type FailResponse,
  type Intent,
  type MarkUnknownResponse,
  type RegisterRequestSchema,
  type RegisterResponse,
  type ReleaseResponse,
  type Result,
  type ResultSchema,
  type WatchRequestSchema,
  type WatchResponse,
} from "../../gen/ts/intent/v1/intent_pb.js";
import { toIntentdError } from "./errors.js";
import { Session } from "./session.js";
import { createIntentdTransport } from "./transport.js";

/** intentd's limits, in UTF-8 bytes, on the free text of reports. */
const MAX_REASON_BYTES = 1024;
const MAX_FAILURE_MESSAGE_BYTES = 1024;
const MAX_FAILURE_CODE_BYTES = 128;

/**
 * s cut to at most maxBytes bytes of UTF-8, at a character boundary: never
 * inside a surrogate pair. intentd's limits are in bytes, not in a
 * string's UTF-16 code units (1000 "€" are 3000 bytes), and a report over
 * one is refused. A lone surrogate counts as the 3 bytes of the U+FFFD it
 * is sent as.
 */
export function cutUtf8(s: string, maxBytes: number): string {
  if (s.length * 3 <= maxBytes) return s; // no code unit takes more than 3 bytes
  let bytes = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const pair = c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00;
    const n = c < 0x80 ? 1 : c < 0x800 ? 2 : pair ? 4 : 3;
    if (bytes + n > maxBytes) return s.slice(0, i);
    bytes += n;
    if (pair) i++;
  }
  return s;
}

/** A fresh random request id (24 hex digits). */
export function newRequestId(): string {
  return randomBytes(12).toString("hex");
}

export interface ClientOptions {
  /** intentd's address, `host:port` (default 127.0.0.1:7650; `http://host:port` too), over plaintext HTTP/2. */
  address?: string;
  /** A Connect transport of your own (TLS, interceptors) instead of `address`. */
  transport?: Transport;
  /** Interceptors (tracing headers, say): the calls then go through Connect's gRPC transport. */
  interceptors?: Interceptor[];
  /** The tenant every request names (default: the server's). */
  tenant?: string;
  /** A bearer token (intentd's tokens file). */
  token?: string;
  /** The deadline of one attempt of a call, in ms (default 10 000). */
  callTimeoutMs?: number;
  /** How long a call is resent while intentd does not answer, in ms (default 60 000). */
  retryTimeoutMs?: number;
  /** The backoff between resends: first and largest wait, in ms (default [50, 2000]). */
  backoffMs?: [number, number];
  /**
   * How long a report after an attempt (Complete, Fail, Release,
   * MarkUnknown, Escalate) is resent while intentd does not answer, in ms
   * (default 60 000): an effect that happened gets recorded.
   */
  reportTimeoutMs?: number;
}

/**
 * The `host:port` of an address (an `http://` URL's too), checked at once:
 * an address the client cannot dial would otherwise be resent to for the
 * whole retry timeout and end as a bare Unavailable.
 */
function hostPort(address = "127.0.0.1:7650"): string {
  const a = String(address).replace(/^http:\/\//, "").replace(/\/$/, "");
  if (!/^([^\s/:[\]]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}$/.test(a)) {
    throw new TypeError(`intentd: address ${JSON.stringify(address)} is not host:port (127.0.0.1:7650); for TLS, pass a transport (createGrpcTransport from @connectrpc/connect-node)`);
  }
  return a;
}

/** Per call: a deadline for the whole call including resends, and a signal that stops it. */
export interface CallOpts {
  timeoutMs?: number;
  signal?: AbortSignal;
}

type RegisterInit = MessageInitShape<typeof RegisterRequestSchema>;
type AcquireInit = MessageInitShape<typeof AcquireRequestSchema>;

/**
 * Calls intentd. Every method resends its request (the same request id)
 * while intentd does not answer, for up to `retryTimeoutMs`; a refusal is
 * thrown at once as its {@link IntentdError} subclass. `rpc` is the
 * generated Connect client, for calls this class does not wrap.
 */
export class Client {
  readonly rpc: ConnectClient<typeof IntentService>;
  readonly tenant: string;
  readonly callTimeoutMs: number;
  readonly retryTimeoutMs: number;
  readonly backoffMinMs: number;
  readonly backoffMaxMs: number;
  readonly reportTimeoutMs: number;
  readonly headers: Record<string, string>;
  private readonly closeTransport?: () => void;

  constructor(opts: ClientOptions = {}) {
    // With interceptors, Connect's gRPC transport (which runs them); else
    // unary calls on an HTTP/2 session of the client's own (src/transport.ts).
    const transport =
      opts.transport ??
      (opts.interceptors?.length ? createGrpcTransport({ baseUrl: `http://${hostPort(opts.address)}`, interceptors: opts.interceptors }) : createIntentdTransport(hostPort(opts.address)));
    this.closeTransport = "close" in transport && typeof transport.close === "function" ? () => (transport as { close(): void }).close() : undefined;
    this.rpc = createClient(IntentService, transport);
    this.tenant = opts.tenant ?? "";
    this.callTimeoutMs = opts.callTimeoutMs ?? 10_000;
    this.retryTimeoutMs = opts.retryTimeoutMs ?? 60_000;
    [this.backoffMinMs, this.backoffMaxMs] = opts.backoffMs ?? [50, 2_000];
    this.reportTimeoutMs = opts.reportTimeoutMs ?? 60_000;
    this.headers = opts.token ? { authorization: `Bearer ${opts.token}` } : {};
  }

  /**
   * Closes the client's own HTTP/2 session (not a transport passed in).
   * Not needed to let Node exit: an idle session is unreferenced.
   */
  close(): void {
    this.closeTransport?.();
  }

  /**
   * Sends one call (`send` with per-attempt options) until intentd answers,
   * or `timeoutMs` (default retryTimeoutMs) runs out, or `signal` aborts.
   * Only UNAVAILABLE and DEADLINE_EXCEEDED are resent: every intentd call
   * recognizes its own earlier effect.
   */
  async call<R>(send: (o: CallOptions) => Promise<R>, opts: CallOpts = {}): Promise<R> {
    const deadline = Date.now() + (opts.timeoutMs ?? this.retryTimeoutMs);
    let wait = this.backoffMinMs;
    for (;;) {
      const left = deadline - Date.now();
      try {
        return await send({ timeoutMs: Math.max(Math.min(this.callTimeoutMs, left), 1), signal: opts.signal, headers: this.headers });
      } catch (err) {
        const e = ConnectError.from(err);
        if (opts.signal?.aborted) throw opts.signal.reason ?? e;
        if ((e.code !== Code.Unavailable && e.code !== Code.DeadlineExceeded) || deadline - Date.now() <= 0) throw toIntentdError(e);
      }
      const pause = Math.min(deadline - Date.now(), wait / 2 + Math.random() * (wait / 2));
      wait = Math.min(2 * wait, this.backoffMaxMs);
      if (pause > 0) await sleep(pause, undefined, opts.signal ? { signal: opts.signal } : undefined);
    }
  }

  /** The key intentd derives from an action and its identity fields (never build it yourself). */
  deriveKey(action: string, identity: JsonObject, params?: JsonObject, opts?: CallOpts): Promise<DeriveKeyResponse> {
    return this.call((o) => this.rpc.deriveKey({ action, identity, params }, o), opts);
  }

  /**
   * Approves an intent: idempotent for the same key and params; other
   * params throw FingerprintMismatch. `key: ""` with `action` and
   * `identity` has intentd derive it. The request id (fresh unless given)
   * is kept across resends.
   */
  register(req: RegisterInit, opts?: CallOpts): Promise<RegisterResponse> {
    const r = { ...req, tenant: req.tenant || this.tenant, requestId: req.requestId || newRequestId() };
    return this.call((o) => this.rpc.register(r, o), opts);
  }

  /** Claims an intent for a session (see Session.run for what to do with each outcome). */
  acquire(req: AcquireInit, opts?: CallOpts): Promise<AcquireResponse> {
    const r = { ...req, tenant: req.tenant || this.tenant, requestId: req.requestId || newRequestId() };
    return this.call((o) => this.rpc.acquire(r, o), opts);
  }

  /** Records the result under the lease's token. */
  complete(key: string, token: bigint, result: Result | MessageInitShape<typeof ResultSchema>, children: RegisterInit[] = [], opts?: CallOpts): Promise<CompleteResponse> {
    return this.call((o) => this.rpc.complete({ tenant: this.tenant, key, token, result, children }, o), opts);
  }

  /** The outcome is not known (the effect may have happened): the next worker reconciles. reason is cut to 1024 bytes. */
  markUnknown(key: string, token: bigint, reason: string, opts?: CallOpts): Promise<MarkUnknownResponse> {
    const r = { tenant: this.tenant, key, token, reason: cutUtf8(reason, MAX_REASON_BYTES) };
    return this.call((o) => this.rpc.markUnknown(r, o), opts);
  }

  /** Nothing was sent: back to PENDING, the next Acquire executes. reason is cut to 1024 bytes. */
  release(key: string, token: bigint, reason: string, opts?: CallOpts): Promise<ReleaseResponse> {
    const r = { tenant: this.tenant, key, token, reason: cutUtf8(reason, MAX_REASON_BYTES) };
    return this.call((o) => this.rpc.release(r, o), opts);
  }

  /**
   * A definite failure: the intent FAILS for good. message is cut to 1024
   * bytes; code is sent as given (a machine-readable cause is not cut into
   * another): an empty one, or one over 128 bytes, is refused InvalidField.
   */
  fail(key: string, token: bigint, code: string, message = "", opts?: CallOpts): Promise<FailResponse> {
    const r = { tenant: this.tenant, key, token, failure: { code: cutUtf8(code, MAX_FAILURE_CODE_BYTES), message: cutUtf8(message, MAX_FAILURE_MESSAGE_BYTES) } };
    return this.call((o) => this.rpc.fail(r, o), opts);
  }

  /** Hands the intent to a person (NEEDS_REVIEW). reason is cut to 1024 bytes. */
  escalate(key: string, reason: string, e: { token?: bigint; actor?: string; force?: boolean } = {}, opts?: CallOpts): Promise<EscalateResponse> {
    const r = { tenant: this.tenant, key, reason: cutUtf8(reason, MAX_REASON_BYTES), token: e.token ?? 0n, actor: e.actor ?? "", force: e.force ?? false };
    return this.call((o) => this.rpc.escalate(r, o), opts);
  }

  /** The intent under key. */
  async get(key: string, opts?: CallOpts): Promise<Intent> {
    const resp = await this.call((o) => this.rpc.get({ tenant: this.tenant, key }, o), opts);
    return resp.intent!;
  }

  /**
   * Watches intents; ends quietly when `timeoutMs` runs out or `signal`
   * aborts, and throws other errors as their IntentdError.
   */
  async *watch(req: MessageInitShape<typeof WatchRequestSchema>, opts: CallOpts = {}): AsyncGenerator<WatchResponse> {
    const stream = this.rpc.watch({ ...req, tenant: req.tenant || this.tenant }, { timeoutMs: opts.timeoutMs, signal: opts.signal, headers: this.headers });
    try {
      for await (const ev of stream) yield ev;
    } catch (err) {
      const e = ConnectError.from(err);
      if (e.code === Code.DeadlineExceeded || e.code === Code.Canceled) return;
      throw toIntentdError(e);
    }
  }

  /**
   * Opens a worker session with a TTL in ms (0: the server's default) and
   * starts its heartbeat: an unreferenced timer, which never keeps the
   * process alive.
   */
  async openSession(worker: string, ttlMs = 0, opts?: CallOpts): Promise<Session> {
    const sent = performance.now();
    const ttl = ttlMs > 0 ? { seconds: BigInt(Math.floor(ttlMs / 1000)), nanos: (ttlMs % 1000) * 1_000_000 } : undefined;
    const resp = await this.call((o) => this.rpc.openSession({ tenant: this.tenant, worker, ttl }, o), opts);
    const got = resp.ttl ? Number(resp.ttl.seconds) * 1000 + resp.ttl.nanos / 1e6 : ttlMs;
    return new Session(this, resp.sessionId, worker, got, sent);
  }
}
