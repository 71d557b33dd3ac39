#!/bin/sh
# Installs the pinned TypeScript MCP SDK for mcpguard's TestTypeScriptClient
# (package-lock.json; `npm ci`). Without it the test skips, saying so.
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --ignore-scripts
