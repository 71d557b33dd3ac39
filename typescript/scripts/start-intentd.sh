#!/usr/bin/env bash
# Sourced by the scripts beside it: start_intentd starts $INTENTD_BIN (or
# cmd/intentd, built) with an embedded etcd in a temporary directory, on
# ports of its own choosing, sets INTENTD_ADDR to its gRPC address, and
# stops it (and removes the directory) when the calling shell exits.
start_intentd() {
  local repo dir bin i
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  dir="$(mktemp -d)"
  bin="${INTENTD_BIN:-}"
  if [[ -z "$bin" ]]; then
    bin="$dir/intentd"
    (cd "$repo" && go build -o "$bin" ./cmd/intentd)
  fi
  "$bin" --data-dir "$dir/data" --listen 127.0.0.1:0 --metrics-listen "" \
    --embed-client-url http://127.0.0.1:0 --embed-peer-url http://127.0.0.1:0 \
    --log-format json 2>"$dir/log" &
  INTENTD_PID=$!
  # shellcheck disable=SC2064 # expand now: the pid and directory of this start
  trap "kill $INTENTD_PID 2>/dev/null; wait $INTENTD_PID 2>/dev/null; rm -rf '$dir'" EXIT
  for i in $(seq 300); do
    INTENTD_ADDR=$(sed -n 's/.*"msg":"intentd serving".*"grpc":"\([^"]*\)".*/\1/p' "$dir/log" | head -1)
    if [[ -n "$INTENTD_ADDR" ]]; then
      export INTENTD_ADDR
      return 0
    fi
    if ! kill -0 "$INTENTD_PID" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "intentd did not start:" >&2
  tail -20 "$dir/log" >&2
  return 1
}
