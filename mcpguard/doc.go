// Package mcpguard is the MCP guard (`intentd mcp-guard`, docs/MCP.md): an
// MCP server that stands between MCP clients (agent hosts) and one
// downstream MCP server, and carries each call of a chosen tool out once
// per approved intent.
//
// A guarded tools/call derives the intent's key from the tool's action and
// identity fields — arguments, plus at least one field the model cannot
// set (a key of the request's _meta that the host supplies, or a value of
// the guard's configuration) — and runs client.Session.Run on it: EXECUTE
// forwards the call once, with the operation key in an argument or _meta,
// and completes the intent with the CallToolResult; a repeat (any request
// id, any client) answers the recorded result and a statement, without
// calling the downstream; a lost answer (a timeout, a broken connection) is
// UNKNOWN and never resent: the next call asks the configured lookup tool,
// or the intent goes to the review queue; an intent in progress or under
// review is answered with words that tell the model not to retry.
//
// Unguarded tools, prompts, resources and completions pass through as they
// are. The guard adds two read-only tools, intent_status and
// list_completed, that answer in statements.
package mcpguard
