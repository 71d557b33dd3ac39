#!/usr/bin/env bash
# The Python suites against a live intentd, as scripts/test.sh runs them:
#
#   debian      the library from the clone on Debian's runtimes (/usr/bin/python3,
#               python3-protobuf 4.21 and python3-grpcio 1.51) with gen/python
#   stubs       python/stubs is what scripts/python-gen.sh generates (no drift)
#   pb6, pb7    the wheel, installed, on protobuf 6 and grpcio at the wheel's
#               floors, and on the newest protobuf 7 and grpcio
#   frameworks  the adapters' tests and the examples, with the agent frameworks
#               installed at their pinned versions (scripts/python-env.sh)
#   coinstall   the wheel resolves into a fresh environment beside
#               opentelemetry-proto, openai-agents, langgraph and pydantic-ai,
#               and all of them import together
#
#   INTENTD_BIN=/path/to/intentd scripts/python-test.sh [ENTRY ...]   # default: all
#
# Everything but "debian" needs the Python package index the first time
# (environments and pip's cache are kept under .cache/). Where the index
# cannot be reached, an entry prints "skipped: <why>" and the run goes on;
# the last line counts what passed, failed and was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

entries=("$@")
[[ ${#entries[@]} -gt 0 ]] || entries=(debian stubs pb6 pb7 frameworks coinstall)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ -z "${INTENTD_BIN:-}" ]]; then
  INTENTD_BIN="$work/intentd"
  go build -o "$INTENTD_BIN" ./cmd/intentd
fi
export INTENTD_BIN

passed=0 failed=0 skipped=0
step() { printf '\n-- python: %s\n' "$*"; }
skip() { echo "skipped: $*"; skipped=$((skipped + 1)); }

# env NAME: the python of a pinned environment, or "" after a skip line.
env_python() {
  local status=0 py
  py=$(scripts/python-env.sh "$1" 2>"$work/env.err") || status=$?
  if [[ $status -eq 3 ]]; then
    sed -n 's/^skipped: //p' "$work/env.err" | head -1 >"$work/skip.why"
    echo ""
    return 0
  fi
  if [[ $status -ne 0 ]]; then
    cat "$work/env.err" >&2
    return 1
  fi
  echo "$py"
}

wheel=""
# build_wheel: the wheel of ./python, once per run (empty after a skip).
build_wheel() {
  [[ -n "$wheel" ]] && return 0
  local py
  py=$(env_python build)
  [[ -n "$py" ]] || return 0
  "$py" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" ./python
  rm -rf python/build python/intentd.egg-info
  wheel=$(ls "$work"/dist/intentd-*.whl)
  echo "wheel: $(basename "$wheel")"
}

# run_installed NAME PATTERN: the suite (test files matching PATTERN) from a
# copy of python/tests, against the wheel installed into environment NAME.
run_installed() {
  local name=$1 pattern=$2 py
  build_wheel
  if [[ -z "$wheel" ]]; then
    skip "$name: $(cat "$work/skip.why")"
    return 0
  fi
  py=$(env_python "$name")
  if [[ -z "$py" ]]; then
    skip "$name: $(cat "$work/skip.why")"
    return 0
  fi
  "$py" -m pip install --quiet --no-deps --force-reinstall "$wheel"
  local dir="$work/$name"
  mkdir -p "$dir"
  cp -r python/tests "$dir/tests"
  if (cd "$dir" && INTENTD_TEST_INSTALLED="$name" INTENTD_REPO="$ROOT" INTENTD_REQUIRE_FRAMEWORKS="${3:-}" \
    "$py" -m unittest discover -s . -t . -p "$pattern" -v); then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
}

for entry in "${entries[@]}"; do
  case "$entry" in
    debian)
      step "debian: the library from the clone on Debian's runtimes (/usr/bin/python3, gen/python)"
      if PYTHONPATH=python:gen/python /usr/bin/python3 -m unittest discover -s python -t python -v; then
        passed=$((passed + 1))
      else
        failed=$((failed + 1))
      fi
      ;;
    stubs)
      step "stubs: python/stubs is what scripts/python-gen.sh generates"
      status=0
      scripts/python-gen.sh --check 2>"$work/gen.err" || status=$?
      if [[ $status -eq 3 ]]; then
        skip "stubs: $(sed -n 's/^skipped: //p' "$work/gen.err" | head -1)"
      elif [[ $status -ne 0 ]]; then
        cat "$work/gen.err" >&2
        failed=$((failed + 1))
      else
        passed=$((passed + 1))
      fi
      ;;
    pb6 | pb7)
      step "$entry: the wheel on $(scripts/python-env.sh --pins "$entry" | paste -sd ' ')"
      run_installed "$entry" 'test*.py'
      ;;
    frameworks)
      step "frameworks: the adapters and the examples on $(scripts/python-env.sh --pins frameworks | paste -sd ' ')"
      run_installed frameworks 'test_[ae]*.py' 1
      ;;
    coinstall)
      step "coinstall: the wheel beside $(scripts/python-env.sh --pins coinstall | paste -sd ' ')"
      build_wheel
      if [[ -z "$wheel" ]]; then
        skip "coinstall: $(cat "$work/skip.why")"
        continue
      fi
      python3 -m venv "$work/coinstall"
      mapfile -t reqs < <(scripts/python-env.sh --pins coinstall)
      log="$work/coinstall.log"
      if ! PIP_CACHE_DIR="${INTENTD_CACHE:-$ROOT/.cache}/pip" PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$work/coinstall/bin/python" -m pip install --quiet --timeout 30 "$wheel" "${reqs[@]}" >"$log" 2>&1; then
        if ! "$work/coinstall/bin/python" -m pip index versions pip --timeout 15 >/dev/null 2>&1; then
          skip "coinstall: the Python package index cannot be reached ($(grep -m1 -E '^ERROR' "$log" | cut -c1-160))"
          continue
        fi
        cat "$log"
        echo "coinstall: the wheel does not install beside ${reqs[*]}" >&2
        failed=$((failed + 1))
        continue
      fi
      # One process imports them all: two copies of a .proto in protobuf's
      # descriptor pool, or a runtime one of them refuses, would fail here.
      if "$work/coinstall/bin/python" - <<'EOF'; then
import importlib.metadata as m
import agents, grpc, langgraph, pydantic_ai
import google.protobuf
from opentelemetry.proto.trace.v1 import trace_pb2
import intentd, intentd.aio
from intent.v1 import intent_pb2
print("resolved and imported together:", ", ".join(f"{p} {m.version(p)}" for p in
      ("intentd", "protobuf", "grpcio", "opentelemetry-proto", "openai-agents", "langgraph", "pydantic-ai-slim")))
EOF
        passed=$((passed + 1))
      else
        failed=$((failed + 1))
      fi
      ;;
    *)
      echo "python-test.sh: no entry $entry" >&2
      exit 2
      ;;
  esac
done

printf '\npython: %d passed, %d failed, %d skipped\n' "$passed" "$failed" "$skipped"
[[ $failed -eq 0 ]]
