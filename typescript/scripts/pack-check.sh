#!/usr/bin/env bash
# The published package works as the README says: `npm pack` makes the
# tarball, a fresh directory outside the repository installs it (with the
# AI SDK recipe's packages, `ai` and `zod`, at the versions package.json's
# devDependencies pin), and the README's two examples (examples/*.mjs, which
# README.md shows verbatim) run there against a live intentd.
# Needs the npm registry for the package's dependencies. $INTENTD_BIN names
# a built intentd (else cmd/intentd is built).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=start-intentd.sh
source "$here/scripts/start-intentd.sh"
fresh="$(mktemp -d)"
cleanup_fresh() { rm -rf "$fresh"; }
cd "$here"
tarball="$fresh/$(npm pack --silent --pack-destination "$fresh" | tail -1)"
pin() { node -e "process.stdout.write(require('./package.json').devDependencies['$1'])"; }
ai="ai@$(pin ai)" zod="zod@$(pin zod)"
cd "$fresh"
npm init -y >/dev/null
npm install --no-audit --no-fund --loglevel=error "$tarball" "$ai" "$zod" >/dev/null
cp "$here/examples/quickstart.mjs" "$here/examples/ai-sdk.mjs" .
# What the tarball holds: the library, its types and the stubs, no tests.
for f in dist/typescript/src/index.js dist/typescript/src/index.d.ts dist/typescript/src/adapters/ai.js dist/typescript/src/adapters/openai-agents.js dist/gen/ts/intent/v1/intent_pb.js README.md; do
  [[ -f node_modules/intentd/$f ]] || { echo "pack-check: the tarball lacks $f" >&2; exit 1; }
done
if [[ -e node_modules/intentd/dist/typescript/test ]]; then echo "pack-check: the tarball holds the tests" >&2; exit 1; fi
start_intentd
trap 'kill $INTENTD_PID 2>/dev/null; wait $INTENTD_PID 2>/dev/null; cleanup_fresh' EXIT
out=$(node quickstart.mjs)
echo "$out"
grep -q '^run 1: COMPLETED, executed: true' <<<"$out" && grep -q '^run 2: COMPLETED, executed: false' <<<"$out" || { echo "pack-check: quickstart.mjs from the tarball did not execute once and replay" >&2; exit 1; }
out=$(node ai-sdk.mjs)
echo "$out"
grep -q '^turn 2: the model read: already_completed: ' <<<"$out" && grep -q '^orders placed: 1$' <<<"$out" || { echo "pack-check: ai-sdk.mjs from the tarball did not guard the second call" >&2; exit 1; }
echo "pack-check: $(basename "$tarball") installs in a fresh directory and its README examples run"
