#!/usr/bin/env bash
# Builds the release binaries of the container image: static (CGO_ENABLED=0,
# no ELF interpreter), stripped, with the version stamped. deploy/Dockerfile's
# build stage runs exactly this script, and scripts/test.sh runs it in CI, so
# what CI checks is what the image ships.
#
#   VERSION=v1.2.3 OUT=/out deploy/build.sh
#
# VERSION defaults to `git describe` of the checkout (else "dev"); OUT to
# ./bin/release.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
OUT=${OUT:-bin/release}
mkdir -p "$OUT"

export CGO_ENABLED=0
go build -trimpath -buildvcs=false \
  -ldflags "-s -w -X github.com/intentd/intentd/internal/run/version.Version=${VERSION}" \
  -o "$OUT/" ./cmd/intentd ./cmd/intentctl

for bin in intentd intentctl; do
  path="$OUT/$bin"
  # A dynamically linked binary names its loader in a PT_INTERP header; the
  # image is FROM scratch, where no loader exists.
  if readelf --program-headers "$path" | grep -q 'INTERP'; then
    echo "build.sh: $path is dynamically linked (it has an ELF interpreter)" >&2
    readelf --program-headers "$path" | grep -A1 INTERP >&2
    exit 1
  fi
  if command -v file >/dev/null; then
    file "$path"
  fi
  got=$("$path" --version)
  if [[ "$got" != "$bin $VERSION" ]]; then
    echo "build.sh: $path --version says \"$got\", want \"$bin $VERSION\"" >&2
    exit 1
  fi
  echo "$got: static, $(stat -c %s "$path") bytes"
done
