// Guarded tools for Vercel's AI SDK: a tool() whose execute is a guarded
// call, and the approval step that turns a person's "yes" to a
// tool-approval-request into a Register and the tool-approval-response.
//
//   import { approve, guardedTool } from "intentd/ai";
//
//   const tools = {
//     buy_item: guardedTool(ledger, BUY_ITEM, {
//       description: "Buy one item for at most max_eur euros.",
//       inputSchema: z.object({ item: z.string(), max_eur: z.number() }),
//       contextSchema: z.object({ conversationId: z.string() }),
//       execute: async ({ item }) => merchant.createOrder({ idempotencyKey: currentAttempt().operationKey("create-order"), item }),
//     }),
//   };
//   const settings = { model, tools, toolsContext: { buy_item: conversation }, toolApproval: { buy_item: "user-approval" } } as const;
//   const first = await generateText({ ...settings, messages });
//   for (const req of first.content.filter((p) => p.type === "tool-approval-request")) {   // a person approves
//     responses.push(await approve(ledger, { buy_item: BUY_ITEM }, conversation, req));   // Register, then the response
//   }
//   await generateText({ ...settings, messages: [...messages, ...first.response.messages, { role: "tool", content: responses }] });
//
// The identity comes from the tool's context (AI SDK 7's toolsContext,
// which reaches execute as options.context; experimental_context in
// earlier majors) and the call's arguments, never from the toolCallId.
// Composes with the SDK's tool approval: the approval registers the terms,
// and the execution acquires with their fingerprint, so edited arguments
// are refused and nothing is sent.
import { tool, type Tool, type ToolApprovalResponse, type ToolExecutionOptions } from "ai";
import type { GuardedTool, Ledger } from "../guard.js";

/** What guardedTool takes: the AI SDK's tool definition, with an execute (or the spec's). */
export type GuardedToolDefinition<Input, Ctx> = Omit<Tool<Input, string, any>, "execute" | "outputSchema"> & {
  execute?: (input: Input, options: ToolExecutionOptions<Ctx>) => unknown;
};

/** The host's context a tool call carries: AI SDK 7's options.context, or experimental_context before it. */
export function contextOf<Ctx>(options: ToolExecutionOptions<Ctx>): Ctx {
  const o = options as ToolExecutionOptions<Ctx> & { experimental_context?: Ctx };
  return o.context ?? (o.experimental_context as Ctx);
}

/**
 * A tool whose every call is a guarded call on ledger: the model reads the
 * Answer's text. The framework's abortSignal aborting while the tool runs
 * is reported as unknown (MarkUnknown, never Release) and thrown.
 */
export function guardedTool<Input extends Record<string, unknown>, Ctx>(ledger: Ledger, spec: GuardedTool<Ctx, Input>, def: GuardedToolDefinition<Input, Ctx>): Tool<Input, string, Ctx> {
  const own = def.execute;
  return tool({
    ...(def as object),
    execute: async (input: Input, options: ToolExecutionOptions<Ctx>) => {
      const answer = await ledger.call(spec, contextOf(options), input, {
        execute: own ? () => own(input, options) : undefined,
        signal: options.abortSignal,
      });
      return answer.text;
    },
  } as never) as Tool<Input, string, Ctx>;
}

/** A tool-approval-request as generateText's content (or a UI message part) carries it. */
export interface ApprovalRequest {
  approvalId: string;
  toolCall?: { toolName: string; input: unknown };
  toolName?: string;
  input?: unknown;
}

/**
 * The approval step of one tool-approval-request a person approved:
 * registers the call's terms when its tool is guarded, and returns the
 * tool-approval-response to send back (in a tool message). A refusal of
 * other terms under the same identity throws FingerprintMismatch.
 */
export async function approve<Ctx>(
  ledger: Ledger,
  guardedTools: Record<string, GuardedTool<Ctx>>,
  context: Ctx,
  request: ApprovalRequest,
  opts: { reason?: string; summary?: string } = {},
): Promise<ToolApprovalResponse> {
  const name = request.toolCall?.toolName ?? request.toolName ?? "";
  const input = (request.toolCall?.input ?? request.input ?? {}) as Record<string, unknown>;
  const spec = guardedTools[name];
  if (spec) await ledger.approve(spec, context, input, { summary: opts.summary });
  return { type: "tool-approval-response", approvalId: request.approvalId, approved: true, ...(opts.reason ? { reason: opts.reason } : {}) };
}

/** A denial, for symmetry: nothing is registered. */
export function deny(request: ApprovalRequest, reason?: string): ToolApprovalResponse {
  return { type: "tool-approval-response", approvalId: request.approvalId, approved: false, ...(reason ? { reason } : {}) };
}
