// Guarded tools for the OpenAI Agents SDK for JS: a function tool whose
// call is a guarded call, and the approval step of its needsApproval
// interruptions.
//
//   import { approve, guardedTool } from "intentd/openai-agents";
//
//   const buyItem = guardedTool(ledger, BUY_ITEM, {
//     name: "buy_item", description: "Buy one item for at most max_eur euros.",
//     parameters: z.object({ item: z.string(), max_eur: z.number() }),
//     execute: async ({ item }) => merchant.createOrder({ idempotencyKey: currentAttempt().operationKey("create-order"), item }),
//   });
//   const agent = new Agent({ name: "shopper", tools: [buyItem] });
//   let result = await run(agent, "buy the lamp", { context: conversation });
//   for (const item of result.interruptions) {                 // a person decides; approval registers the terms
//     await approve(ledger, { buy_item: BUY_ITEM }, conversation, result.state, item);
//   }
//   result = await run(agent, result.state);
//
// The identity comes from the run's context (RunContext.context) and the
// call's arguments, never from the tool-call id; the tool's execute reads
// its operation key from currentAttempt().
import { tool, type FunctionTool, type RunContext, type RunState, type RunToolApprovalItem, type ToolOptions } from "@openai/agents";
import type { GuardedTool, Ledger } from "../guard.js";

/**
 * A FunctionTool (as the SDK's tool() makes it, with needsApproval on by
 * default) whose every call is a guarded call on ledger: the model reads
 * the Answer's text. The tool's errors are not turned into text for the
 * model before intentd hears of them (errorFunction: null): an error
 * decides the report (UNKNOWN, unless it is NotAttempted or Final).
 */
export function guardedTool<Ctx>(ledger: Ledger, spec: GuardedTool<Ctx>, options: ToolOptions<any, Ctx>): FunctionTool<Ctx, any, string> {
  const t = tool({ needsApproval: true, ...options, errorFunction: null } as ToolOptions<any, Ctx>) as unknown as FunctionTool<Ctx, any, string>;
  const inner = t.invoke.bind(t);
  t.invoke = async (runContext: RunContext<Ctx>, input: string, details?: { signal?: AbortSignal }) => {
    const args = input ? (JSON.parse(input) as Record<string, unknown>) : {};
    const answer = await ledger.call(spec, runContext.context, args, {
      execute: () => inner(runContext, input, details as never),
      signal: details?.signal,
    });
    return answer.text;
  };
  return t;
}

/**
 * The approval step of one needsApproval interruption: registers the
 * call's terms when its tool is guarded, then approves it in the run state.
 */
export async function approve<Ctx>(
  ledger: Ledger,
  guardedTools: Record<string, GuardedTool<Ctx>>,
  context: Ctx,
  state: RunState<Ctx, any>,
  item: RunToolApprovalItem,
): Promise<void> {
  const raw = item.rawItem as { name?: string; arguments?: string };
  const spec = guardedTools[item.name ?? raw.name ?? ""];
  if (spec) await ledger.approve(spec, context, JSON.parse(item.arguments ?? raw.arguments ?? "{}"));
  state.approve(item);
}
