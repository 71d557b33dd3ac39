// An MCP host on the official TypeScript SDK calling create_refund through
// intentd mcp-guard (streamable HTTP at argv[2]) three times, for the order
// argv[3] as customer c-ts (the host's _meta), then intent_status. It prints
// one JSON line per answer: the guard's outcome, and whether it is an error.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, order] = process.argv.slice(2);
const client = new Client({ name: "ts-host", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));

const { tools } = await client.listTools();
const status = tools.find((t) => t.name === "intent_status");
console.log(JSON.stringify({ tools: tools.map((t) => t.name).sort(), statusReadOnly: status?.annotations?.readOnlyHint === true }));

let key;
for (let i = 0; i < 3; i++) {
  const res = await client.callTool({
    name: "create_refund",
    arguments: { order_id: order, amount: 12.5, currency: "EUR" },
    _meta: { customer: "c-ts" },
  });
  key = res._meta?.["intentd/key"];
  const text = res.content.filter((c) => c.type === "text").map((c) => c.text).join(" ");
  console.log(JSON.stringify({ outcome: res._meta?.["intentd/outcome"], isError: res.isError === true, says: text.slice(0, 40) }));
}
const st = await client.callTool({ name: "intent_status", arguments: { key } });
console.log(JSON.stringify({ status: st.structuredContent?.status }));
await client.close();
