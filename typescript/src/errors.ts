// Reading intentd's refusals from a ConnectError: the ErrorInfo reason and
// metadata, the offending field, and the Statement detail. google.rpc's
// ErrorInfo and BadRequest are declared here from their field numbers
// (google/rpc/error_details.proto), so that no googleapis package is needed.
import { create, createFileRegistry, type DescMessage } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FieldDescriptorProto_Type, FieldDescriptorProto_Label } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorReason, StatementSchema, type Statement } from "../../gen/ts/intent/v1/intent_pb.js";

/** The ErrorInfo domain of every intentd error. */
export const DOMAIN = "intentd.dev";

const { STRING, MESSAGE } = FieldDescriptorProto_Type;
const { OPTIONAL, REPEATED } = FieldDescriptorProto_Label;

const registry = createFileRegistry(
  create(FileDescriptorProtoSchema, {
    name: "intentd/google_rpc_error_details.proto",
    package: "google.rpc",
    syntax: "proto3",
    messageType: [
      {
        name: "ErrorInfo",
        field: [
          { name: "reason", number: 1, type: STRING, label: OPTIONAL, jsonName: "reason" },
          { name: "domain", number: 2, type: STRING, label: OPTIONAL, jsonName: "domain" },
          { name: "metadata", number: 3, type: MESSAGE, label: REPEATED, typeName: ".google.rpc.ErrorInfo.MetadataEntry", jsonName: "metadata" },
        ],
        nestedType: [
          {
            name: "MetadataEntry",
            options: { mapEntry: true },
            field: [
              { name: "key", number: 1, type: STRING, label: OPTIONAL, jsonName: "key" },
              { name: "value", number: 2, type: STRING, label: OPTIONAL, jsonName: "value" },
            ],
          },
        ],
      },
      {
        name: "BadRequest",
        field: [{ name: "field_violations", number: 1, type: MESSAGE, label: REPEATED, typeName: ".google.rpc.BadRequest.FieldViolation", jsonName: "fieldViolations" }],
        nestedType: [
          {
            name: "FieldViolation",
            field: [
              { name: "field", number: 1, type: STRING, label: OPTIONAL, jsonName: "field" },
              { name: "description", number: 2, type: STRING, label: OPTIONAL, jsonName: "description" },
            ],
          },
        ],
      },
    ],
  }),
  () => undefined,
);

const errorInfoSchema = registry.getMessage("google.rpc.ErrorInfo") as DescMessage;
const badRequestSchema = registry.getMessage("google.rpc.BadRequest") as DescMessage;

/** What intentd said when it refused a call. */
export interface Refusal {
  /** The gRPC code, e.g. Code.Aborted. */
  code: Code;
  /** The ErrorInfo reason, e.g. "STALE_TOKEN"; "" if none. */
  reason: string;
  /**
   * The reason as the proto's ErrorReason (ErrorReason.STALE_TOKEN; the
   * generated enum drops the ERROR_REASON_ prefix, so its names are the wire
   * reasons), ErrorReason.UNSPECIFIED for none or one this library does not know.
   */
  errorReason: ErrorReason;
  /** The ErrorInfo metadata, e.g. { current_token: "42" }. */
  metadata: Record<string, string>;
  /** The request field an INVALID_FIELD names, else "". */
  field: string;
  /** What became of the intent, for refusals of fenced calls. */
  statement?: Statement;
  /** intentd's message. */
  message: string;
}

/** refusal reads a ConnectError from intentd (other errors are returned as Code.Unknown). */
export function refusal(err: unknown): Refusal {
  const e = ConnectError.from(err);
  const info = e.findDetails(errorInfoSchema)[0] as unknown as { reason: string; domain: string; metadata: Record<string, string> } | undefined;
  const bad = e.findDetails(badRequestSchema)[0] as unknown as { fieldViolations: { field: string }[] } | undefined;
  const mine = info !== undefined && (info.domain === DOMAIN || info.domain === "");
  return {
    code: e.code,
    reason: mine ? info.reason : "",
    errorReason: mine ? reasonOf(info.reason) : ErrorReason.UNSPECIFIED,
    metadata: mine ? { ...info.metadata } : {},
    field: bad?.fieldViolations[0]?.field ?? "",
    statement: e.findDetails(StatementSchema)[0],
    message: e.rawMessage,
  };
}

/** reasonOf is the ErrorReason a wire reason names, UNSPECIFIED if none. */
export function reasonOf(reason: string): ErrorReason {
  const r = (ErrorReason as unknown as Record<string, ErrorReason | undefined>)[reason];
  return typeof r === "number" ? r : ErrorReason.UNSPECIFIED;
}

/** retriable is true when intentd did not answer: the very same call may be sent again. */
export function retriable(err: unknown): boolean {
  const c = ConnectError.from(err).code;
  return c === Code.Unavailable || c === Code.DeadlineExceeded;
}

/**
 * A call intentd refused or could not answer, as the client throws it: one
 * class per ErrorInfo reason (FingerprintMismatch, StaleToken, …), else one
 * per gRPC code (Unavailable, …). `instanceof` picks the case:
 *
 * ```ts
 * try { await client.complete(key, token, result); }
 * catch (err) { if (err instanceof StaleToken) console.log(err.currentToken, err.statement?.text); }
 * ```
 */
export class IntentdError extends Error {
  /** The ErrorInfo reason this class stands for ("" for the code-only classes). */
  static readonly REASON: string = "";
  readonly code: Code;
  readonly reason: string;
  readonly metadata: Record<string, string>;
  readonly field: string;
  readonly statement?: Statement;
  /** The ConnectError this was read from. */
  override readonly cause: ConnectError;

  constructor(r: Refusal, cause: ConnectError) {
    super(r.reason ? `intentd: ${r.message} (${Code[r.code]}, ${r.reason})` : `intentd: ${r.message} (${Code[r.code]})`);
    this.name = new.target.name;
    this.code = r.code;
    this.reason = r.reason;
    this.metadata = r.metadata;
    this.field = r.field;
    this.statement = r.statement;
    this.cause = cause;
  }

  /** The intent's newest fencing token, for a STALE_TOKEN refusal (else 0n). */
  get currentToken(): bigint {
    try {
      return BigInt(this.metadata.current_token ?? "0");
    } catch {
      return 0n;
    }
  }
}

// Code-only classes: what a status with no known reason becomes.
/** INVALID_ARGUMENT: the request is malformed; fix it, do not resend it. */
export class InvalidArgument extends IntentdError {}
/** NOT_FOUND: no such intent or session. */
export class NotFound extends IntentdError {}
/** FAILED_PRECONDITION: the intent's state forbids the call. */
export class FailedPrecondition extends IntentdError {}
/** ABORTED: the caller lost a race; acquire again. */
export class Aborted extends IntentdError {}
/** UNAVAILABLE or DEADLINE_EXCEEDED: intentd did not answer; the same call may be sent again. */
export class Unavailable extends IntentdError {}
/** RESOURCE_EXHAUSTED: a limit was reached. */
export class ResourceExhausted extends IntentdError {}

// One class per reason.
/** A request field is invalid (`field` names it). */
export class InvalidField extends InvalidArgument { static override readonly REASON = "INVALID_FIELD"; }
/** No intent under that key (never approved, or gone). */
export class IntentNotFound extends NotFound { static override readonly REASON = "INTENT_NOT_FOUND"; }
/** The session is gone (expired or closed): its leases are lost. */
export class SessionNotFound extends NotFound { static override readonly REASON = "SESSION_NOT_FOUND"; }
/** Other terms than the approved ones under the same key. */
export class FingerprintMismatch extends FailedPrecondition { static override readonly REASON = "FINGERPRINT_MISMATCH"; }
/** The intent's state does not allow this transition. */
export class InvalidTransition extends FailedPrecondition { static override readonly REASON = "INVALID_TRANSITION"; }
/** A second, different result for a completed intent. */
export class ResultMismatch extends FailedPrecondition { static override readonly REASON = "RESULT_MISMATCH"; }
/** The intent's retention ran out: only its tombstone is left. */
export class IntentExpired extends FailedPrecondition { static override readonly REASON = "INTENT_EXPIRED"; }
/** Another live lease holds the intent. */
export class LeaseHeld extends FailedPrecondition { static override readonly REASON = "LEASE_HELD"; }
/** A watch asked for a revision etcd has compacted. */
export class RevisionCompacted extends FailedPrecondition { static override readonly REASON = "REVISION_COMPACTED"; }
/** A newer lease superseded this one (`currentToken`); acquire again to learn the outcome. */
export class StaleToken extends Aborted { static override readonly REASON = "STALE_TOKEN"; }
/** The tenant's rate was exceeded. */
export class RateLimited extends ResourceExhausted { static override readonly REASON = "RATE_LIMITED"; }
/** A request or a result is too large. */
export class TooLarge extends ResourceExhausted { static override readonly REASON = "TOO_LARGE"; }
/** etcd's quota is reached: intentd only reads. */
export class StoreFull extends ResourceExhausted { static override readonly REASON = "STORE_FULL"; }
/** etcd did not answer: the same call may be sent again. */
export class StoreUnavailable extends Unavailable { static override readonly REASON = "STORE_UNAVAILABLE"; }
/** The call needed the archive (PostgreSQL) and it did not answer; live intents still work, the same call may be sent again. */
export class ArchiveUnavailable extends Unavailable { static override readonly REASON = "ARCHIVE_UNAVAILABLE"; }
/** etcd's data went back in time (a restore): intentd refuses until an operator acts. */
export class StoreRolledBack extends Unavailable { static override readonly REASON = "STORE_ROLLED_BACK"; }
/** No or unknown credentials. */
export class Unauthenticated extends IntentdError { static override readonly REASON = "UNAUTHENTICATED"; }
/** A role or tenant the principal lacks. */
export class PermissionDenied extends IntentdError { static override readonly REASON = "PERMISSION_DENIED"; }
/** A bug in intentd. */
export class Internal extends IntentdError { static override readonly REASON = "INTERNAL"; }

type ErrorClass = new (r: Refusal, cause: ConnectError) => IntentdError;

/** Every ErrorInfo reason intentd sends, and the class thrown for it. */
export const BY_REASON: Readonly<Record<string, ErrorClass>> = Object.fromEntries(
  [
    InvalidField, IntentNotFound, SessionNotFound, FingerprintMismatch, InvalidTransition, ResultMismatch, IntentExpired,
    LeaseHeld, RevisionCompacted, StaleToken, RateLimited, TooLarge, StoreFull, StoreUnavailable, ArchiveUnavailable,
    StoreRolledBack,
    Unauthenticated, PermissionDenied, Internal,
  ].map((c) => [c.REASON, c as ErrorClass]),
);

const BY_CODE: Partial<Record<Code, ErrorClass>> = {
  [Code.InvalidArgument]: InvalidArgument,
  [Code.NotFound]: NotFound,
  [Code.FailedPrecondition]: FailedPrecondition,
  [Code.Aborted]: Aborted,
  [Code.Unavailable]: Unavailable,
  [Code.DeadlineExceeded]: Unavailable,
  [Code.ResourceExhausted]: ResourceExhausted,
  [Code.Unauthenticated]: Unauthenticated,
  [Code.PermissionDenied]: PermissionDenied,
  [Code.Internal]: Internal,
};

/** toIntentdError reads any error from a call as the IntentdError subclass of its reason (or code). */
export function toIntentdError(err: unknown): IntentdError {
  if (err instanceof IntentdError) return err;
  const e = ConnectError.from(err);
  const r = refusal(e);
  const cls = BY_REASON[r.reason] ?? BY_CODE[r.code] ?? IntentdError;
  return new cls(r, e);
}

/** The session is gone: every lease it held is lost. */
export class SessionLost extends Error {
  override name = "SessionLost";
}

/** A report was refused after the lease was lost meanwhile (the refusal is its cause). */
export class LeaseLost extends Error {
  override name = "LeaseLost";
}
