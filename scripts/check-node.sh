#!/usr/bin/env bash
# Checks that the machine's Node.js can run typescript/ (its stubs and the
# Node suite): any major from NODE_MIN on, as typescript/package.json's
# "engines" says (scripts/scripts_test.go holds the two equal). CI runs the
# Node suite on NODE_TESTED; a newer major is accepted, never refused, and
# said to be untested.
set -euo pipefail
NODE_MIN=20
NODE_TESTED="20"
version=$(node --version 2>/dev/null || true)
major=$(sed -n 's/^v\([0-9][0-9]*\)\..*/\1/p' <<<"$version")
if [[ -z "$major" || "$major" -lt "$NODE_MIN" ]]; then
  echo "install-tools: Node.js $NODE_MIN or newer is needed (typescript/; tested on $NODE_TESTED); found '${version:-none}'" >&2
  exit 1
fi
if [[ " $NODE_TESTED " != *" $major "* ]]; then
  echo "install-tools: Node.js $version: accepted, though the Node suite is tested on $NODE_TESTED only" >&2
fi
