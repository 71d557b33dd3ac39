#!/usr/bin/env bash
# Builds a pinned Python virtual environment of this project's, once, and
# prints the path of its python. Every Python version this project tests
# with or generates with is pinned here, and only here.
#
#   scripts/python-env.sh NAME      # e.g. "$(scripts/python-env.sh pb7)" -m unittest ...
#   scripts/python-env.sh --pins NAME   # the requirement lines of NAME, one a line
#   scripts/python-env.sh --names       # the names
#
# Environments live under .cache/python/NAME (git ignores .cache/), pip's
# cache under .cache/pip. One is rebuilt when its pins change (a stamp
# holds them). Building one needs the Python package index; an environment
# already built does not. When the index cannot be reached, the script
# exits 3 after one line starting "skipped: " on stderr: callers pass that
# on, never a pass.
#
# The base interpreter is $PYTHON, else python3 (3.11 or newer; Debian's
# /usr/bin/python3 runs the Debian path of scripts/python-test.sh instead,
# with gen/python).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# grpcio-tools 1.76.0 bundles a protoc that writes protobuf gencode 6.31.1,
# and its grpc plugin writes GRPC_GENERATED_VERSION 1.76.0: the stubs in
# python/stubs need protobuf >= 6.31.1 and grpcio >= 1.76.0 at import, which
# are the wheel's floors (python/pyproject.toml). A newer grpcio-tools
# writes gencode 7.x, which protobuf 6 refuses to import.
GRPCIO_TOOLS_VERSION=1.76.0
# The floors: the oldest runtimes the stubs import on.
PROTOBUF_FLOOR=6.31.1
GRPCIO_FLOOR=1.76.0
# The newest runtimes.
PROTOBUF_NEWEST=7.36.2
GRPCIO_NEWEST=1.85.4
# The agent frameworks the adapters are tested with (python/intentd/adapters).
OPENAI_AGENTS_VERSION=0.25.0
LANGCHAIN_VERSION=1.5.2
LANGGRAPH_VERSION=1.2.24
PYDANTIC_AI_VERSION=2.78.0
# Tracing's protocol package, which needs a recent protobuf.
OPENTELEMETRY_PROTO_VERSION=1.45.2
# The build backend of the wheel.
SETUPTOOLS_VERSION=84.2.1
# What the benchmarks (python/bench) compare with and profile with: another
# event loop, and a sampling profiler.
UVLOOP_VERSION=0.23.0
PY_SPY_VERSION=0.4.3

pins() {
  case "$1" in
    gen) # generates python/stubs (scripts/python-gen.sh)
      printf '%s\n' "grpcio-tools==$GRPCIO_TOOLS_VERSION" "grpcio==$GRPCIO_FLOOR" "protobuf==$PROTOBUF_FLOOR" ;;
    build) # builds the wheel
      printf '%s\n' "setuptools==$SETUPTOOLS_VERSION" ;;
    pb6) # protobuf 6 and grpcio at the wheel's floors
      printf '%s\n' "protobuf==$PROTOBUF_FLOOR" "grpcio==$GRPCIO_FLOOR" ;;
    pb7) # the newest protobuf 7 and grpcio
      printf '%s\n' "protobuf==$PROTOBUF_NEWEST" "grpcio==$GRPCIO_NEWEST" ;;
    frameworks) # pb7 and the agent frameworks the adapters support
      pins pb7
      printf '%s\n' "openai-agents==$OPENAI_AGENTS_VERSION" "langchain==$LANGCHAIN_VERSION" \
        "langgraph==$LANGGRAPH_VERSION" "pydantic-ai-slim==$PYDANTIC_AI_VERSION" ;;
    bench) # pb7, uvloop and py-spy: python/bench/calls.py's uvloop row, profiles of bench/cycle.py
      pins pb7
      printf '%s\n' "uvloop==$UVLOOP_VERSION" "py-spy==$PY_SPY_VERSION" ;;
    coinstall) # what an agent host installs beside intentd: resolved, not pinned (the wheel is added by the caller)
      printf '%s\n' "opentelemetry-proto==$OPENTELEMETRY_PROTO_VERSION" "openai-agents==$OPENAI_AGENTS_VERSION" \
        "langgraph==$LANGGRAPH_VERSION" "pydantic-ai-slim==$PYDANTIC_AI_VERSION" ;;
    *) echo "python-env.sh: no environment named $1 (names: $(names))" >&2; return 2 ;;
  esac
}

names() { echo "gen build pb6 pb7 frameworks bench"; }

case "${1:-}" in
  --names) names; exit 0 ;;
  --pins) pins "${2:?python-env.sh --pins NAME}"; exit 0 ;;
  "" | -*) echo "usage: python-env.sh NAME | --pins NAME | --names" >&2; exit 2 ;;
esac
name=$1
want="$(pins "$name")"

cache="${INTENTD_CACHE:-$ROOT/.cache}"
mkdir -p "$cache/python"
# .cache/ ignores itself, so that no repository file has to name it.
[[ -f "$cache/.gitignore" ]] || echo '*' >"$cache/.gitignore"
export PIP_CACHE_DIR="$cache/pip" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
env="$cache/python/$name"
py="$env/bin/python"
stamp="$env/.pins"

if [[ -x "$py" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "$py"
  exit 0
fi

base=${PYTHON:-python3}
if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "python-env.sh: $base is not Python 3.11 or newer (set PYTHON)" >&2
  exit 1
fi

rm -rf "$env"
"$base" -m venv "$env"
log="$env/.install.log"
mapfile -t reqs <<<"$want"
if ! "$py" -m pip install --quiet --timeout 30 "${reqs[@]}" >"$log" 2>&1; then
  # Unreachable, or refused? pip answers both with "Could not find a
  # version": ask the index for pip's own versions to tell them apart.
  if ! "$py" -m pip index versions pip --timeout 15 >/dev/null 2>&1; then
    echo "skipped: python environment $name: the Python package index cannot be reached ($(grep -m1 -E '^ERROR' "$log" | cut -c1-160))" >&2
    rm -rf "$env"
    exit 3
  fi
  cat "$log" >&2
  rm -rf "$env"
  echo "python-env.sh: installing $name failed" >&2
  exit 1
fi
echo "$want" >"$stamp"
echo "$py"
