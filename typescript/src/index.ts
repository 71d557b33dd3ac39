// intentd for Node: the client, sessions, the safe loop and guarded tools.
// The framework adapters are subpath exports: "intentd/ai" (Vercel's AI
// SDK) and "intentd/openai-agents" (the OpenAI Agents SDK); the generated
// API is "intentd/gen".
export { Client, newRequestId, type CallOpts, type ClientOptions } from "./client.js";
export { Session } from "./session.js";
export { createIntentdTransport } from "./transport.js";
export {
  Attempt,
  Final,
  LEFT_UNKNOWN,
  MAX_TAKEOVERS,
  NotAttempted,
  Outcome,
  RELEASED,
  absent,
  found,
  run,
  undecided,
  type Evidence,
  type RegisterInit,
  type ResultInit,
  type RunOptions,
  type Task,
} from "./run.js";
export {
  Ledger,
  answer,
  currentAttempt,
  guarded,
  sortedJson,
  toResult,
  type Answer,
  type Fields,
  type GuardedSpec,
  type GuardedTool,
  type LedgerOptions,
  type Terms,
} from "./guard.js";
export * from "./errors.js";
export { Outcome as AcquireOutcome, State, ErrorReason, type Intent, type Result, type Statement } from "../../gen/ts/intent/v1/intent_pb.js";
