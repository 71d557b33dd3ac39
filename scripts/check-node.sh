#!/usr/bin/env bash
# Checks that the machine's Node.js can run typescript/ (the worker
# library, its adapters and the Node suite): any major from NODE_MIN on, as
# typescript/package.json's "engines" says (scripts/scripts_test.go holds
# the two equal). CI runs the Node suite (typescript/scripts/ci.sh) on the
# machine's Node and on the Node binaries install-tools.sh pins
# (NODE_BINARIES there): NODE_TESTED lists those versions. Any newer
# version is accepted, never refused; one not listed is said to be untested.
set -euo pipefail
NODE_MIN=20
NODE_TESTED="20.20.2 22.23.5 24.22.3 26.12.1"
version=$(node --version 2>/dev/null || true)
major=$(sed -n 's/^v\([0-9][0-9]*\)\..*/\1/p' <<<"$version")
if [[ -z "$major" || "$major" -lt "$NODE_MIN" ]]; then
  echo "install-tools: Node.js $NODE_MIN or newer is needed (typescript/; tested on ${NODE_TESTED// /, }); found '${version:-none}'" >&2
  exit 1
fi
if [[ " $NODE_TESTED " != *" ${version#v} "* ]]; then
  echo "install-tools: Node.js $version: accepted, though the Node suite is tested on ${NODE_TESTED// /, } (typescript/scripts/ci.sh)" >&2
fi
