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
