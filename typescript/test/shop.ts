// A guarded tool on the effect-counting provider (test/live.ts), shared by
// the guarded-tool tests and every adapter's: buy_item, whose identity is
// the host's conversation and the item, and whose approved terms are the
// item and the price limit.
import { randomBytes } from "node:crypto";
import { absent, found, guarded, undecided, type Attempt, type GuardedTool } from "../src/index.js";
import type { Provider } from "./live.js";

/** The host's own context: what identifies the user's request. The framework's tool-call id is not in it. */
export interface Conversation {
  conversationId: string;
}

export const conversation = (): Conversation => ({ conversationId: randomBytes(8).toString("hex") });

export interface BuyArgs {
  item: string;
  max_eur: number;
  [k: string]: unknown;
}

export const LAMP: BuyArgs = { item: "desk lamp", max_eur: 89 };

/** Thrown after the effect: the worker "crashes" before it could report. */
export class Crash extends Error {
  override name = "Crash";
}

/** The provider side of buy_item, with a switch for what happens after the order was placed. */
export class Shop {
  afterEffect?: () => Promise<void> | void;
  readonly spec: GuardedTool<Conversation, BuyArgs>;

  constructor(readonly provider: Provider) {
    this.spec = guarded<Conversation, BuyArgs>({
      name: "buy_item",
      action: "buy-item",
      identity: (ctx, args) => ({ conversation: ctx.conversationId, item: args.item }),
      params: ["item", "max_eur"],
      summary: (_ctx, args) => `Buy ${args.item} for at most ${args.max_eur} EUR`,
      waitInProgressMs: 10_000,
      reconcile: (att) => {
        const got = provider.lookup(att.operationKey("create-order"));
        if (got.length === 1) return found({ externalRefs: { order_id: got[0]! } });
        if (got.length === 0) return absent("merchant has no order for the operation key");
        return undecided(`merchant shows ${got.length} orders`);
      },
      execute: (att, args) => this.place(att, args.item),
    });
  }

  /** The effect: one order under the attempt's operation key, then whatever afterEffect does. */
  async place(att: Attempt, item: string): Promise<{ order_id: string; item: string }> {
    const order = this.provider.create(att.operationKey("create-order"));
    await this.afterEffect?.();
    return { order_id: order, item };
  }
}

export const crash = () => {
  throw new Crash("the worker died after the order was placed");
};
