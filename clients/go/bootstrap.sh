#!/usr/bin/env bash
# Bootstrap and build the Go client (clients/go) on a fresh machine, offline from the Go module proxy.
#
# The Go toolchain, protoc, its Go plugins and the gRPC/protobuf Go libraries all come from Debian (apt), and
# the client builds in GOPATH mode (GO111MODULE=off) with GOPATH = .cache/go (our code, via a symlink) plus
# /usr/share/gocode (Debian's Go sources). The protobuf and gRPC code is generated here, at build time, into
# clients/go/llmschedv1 (git-ignored): the generated code then always matches the plugin and runtime versions
# installed next to it, which a committed copy could not promise across machines.
#
#   bash clients/go/bootstrap.sh               install what is missing (apt, as root), generate, build, vet
#   bash clients/go/bootstrap.sh --no-install  the same without apt (fails when a package is missing)
#   bash clients/go/bootstrap.sh --gen         stop after generating
# clients/go/env.sh sets the same environment for running `go` by hand.
set -euo pipefail
INSTALL=1 GEN_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --no-install) INSTALL=0 ;;
    --gen) GEN_ONLY=1 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=clients/go/env.sh
source clients/go/env.sh

# protoc-gen-go is Debian's APIv2 plugin (google.golang.org/protobuf): the protos use proto3 `optional`, which
# the v1.3 plugin of golang-goprotobuf-dev refuses; golang/protobuf 1.5 (the APIv1 shim over APIv2) is what
# grpc 1.33 and genproto's errdetails then build against (it conflicts with, and replaces, the 1.3 packages).
# libprotobuf-dev holds the well-known .proto files (duration, timestamp) under /usr/include.
PACKAGES=(golang-go protobuf-compiler libprotobuf-dev protoc-gen-go protoc-gen-go-grpc golang-google-protobuf-dev
  golang-github-golang-protobuf-1-5-dev golang-google-grpc-dev golang-google-genproto-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if ((!INSTALL)) || [[ $(id -u) -ne 0 ]]; then
    echo "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Our import path inside GOPATH points at the checkout, so edits need no copy.
mkdir -p "$(dirname "$GOCLIENT_SRC")"
ln -sfn "$ROOT/clients/go" "$GOCLIENT_SRC"

# Generate: protos/ carry no go_package option (they are the Python package too), so M flags map each file.
OUT="$ROOT/clients/go/llmschedv1"
rm -rf "$OUT"
mkdir -p "$OUT"
GEN="$(mktemp -d)"
trap 'rm -rf "$GEN"' EXIT
mapfile -t PROTOS < <(cd protos && find llmsched -name '*.proto' | sort)
maps=()
for f in "${PROTOS[@]}"; do maps+=("M$f=$GOCLIENT_IMPORT/llmschedv1;llmschedv1"); done
go_opts=$(IFS=,; echo "${maps[*]}")
protoc -I protos -I /usr/include \
  --go_out="$GEN" --go_opt="paths=import,$go_opts" \
  --go-grpc_out="$GEN" --go-grpc_opt="paths=import,$go_opts" \
  "${PROTOS[@]}"
cp "$GEN/$GOCLIENT_IMPORT/llmschedv1/"*.go "$OUT/"
echo "generated $(ls "$OUT" | wc -l) files into clients/go/llmschedv1"
((GEN_ONLY)) && exit 0

# Named one by one: `./...`-style patterns do not follow the symlink in GOPATH.
PKGS=("$GOCLIENT_IMPORT/llmschedv1" "$GOCLIENT_IMPORT/llmsched" "$GOCLIENT_IMPORT/cmd/llmsched-go")
unformatted=$(gofmt -l clients/go/llmsched clients/go/cmd)
[[ -z "$unformatted" ]] || { echo "not gofmt-formatted (run gofmt -w): $unformatted" >&2; exit 1; }
go build "${PKGS[@]}"
go vet "${PKGS[@]}"
go test -c -o /dev/null "$GOCLIENT_IMPORT/llmsched"  # the tests compile too (they run from pytest)
echo "Go client built: $GOCLIENT_IMPORT (GOPATH=$GOPATH)"
