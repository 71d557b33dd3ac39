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
