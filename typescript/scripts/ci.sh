#!/usr/bin/env bash
# The TypeScript step of scripts/test.sh: the Node suite (library, adapters,
# examples, the stubs) on the machine's Node.js and on every other Node
# major scripts/install-tools.sh installed (bin/node-<major>/node, pinned
# there), then the package from its tarball (scripts/pack-check.sh).
# $INTENTD_BIN names a built intentd (else each test file builds one).
set -euo pipefail
cd "$(dirname "$0")/.."
npm run build --silent
nodes=("$(command -v node)")
for n in ../bin/node-*/node; do
  [[ -x "$n" ]] && nodes+=("$(cd "$(dirname "$n")" && pwd)/node")
done
for node in "${nodes[@]}"; do
  echo "== Node suite on Node.js $("$node" --version) ($node)"
  "$node" --test --test-concurrency=1 --test-reporter=spec build/typescript/test/*.test.js
done
./scripts/pack-check.sh
