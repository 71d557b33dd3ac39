#!/usr/bin/env bash
# Generates python/stubs, the protobuf and gRPC stubs the intentd wheel
# carries (packages intent.v1 and buf.validate, with .pyi type stubs), with
# the pinned grpcio-tools of scripts/python-env.sh. They are for current
# runtimes (protobuf 6 and 7, grpcio from 1.76); gen/python, made by
# `buf generate` with Debian's protoc, stays for Debian's runtimes.
#
#   scripts/python-gen.sh           # regenerates python/stubs
#   scripts/python-gen.sh --check   # exits 1 when python/stubs differs from what it would generate
#
# Exits 3 after a "skipped: " line when the package index cannot be reached
# to build the generator's environment.
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
[[ "${1:-}" == "--check" ]] && check=true

status=0
py=$(scripts/python-env.sh gen) || status=$?
if [[ $status -ne 0 ]]; then
  exit "$status"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Every .proto of the API and the validate.proto they import (its messages'
# options are buf.validate's); gRPC stubs for the files that hold a service.
mapfile -t protos < <(find proto -name '*.proto' | sort)
mapfile -t services < <(grep -l '^service ' "${protos[@]}")
"$py" -m grpc_tools.protoc -I proto -I third_party/protovalidate \
  --python_out="$out" --pyi_out="$out" \
  "${protos[@]}" third_party/protovalidate/buf/validate/validate.proto
"$py" -m grpc_tools.protoc -I proto -I third_party/protovalidate \
  --grpc_python_out="$out" "${services[@]}"
# Typed packages (PEP 561): their .pyi files are the types.
touch "$out/intent/v1/py.typed" "$out/buf/validate/py.typed"

if $check; then
  if ! diff -r python/stubs "$out" >/dev/null 2>&1; then
    diff -r python/stubs "$out" | head -40 >&2 || true
    echo "python/stubs differs from scripts/python-gen.sh's output: run scripts/python-gen.sh and commit" >&2
    exit 1
  fi
  echo "python/stubs is what scripts/python-gen.sh generates"
  exit 0
fi
rm -rf python/stubs
mkdir -p python/stubs
cp -r "$out"/. python/stubs/
echo "python/stubs generated ($("$py" -m pip show grpcio-tools 2>/dev/null | sed -n 's/^Version: /grpcio-tools /p'))"
