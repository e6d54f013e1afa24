# Environment for building the Go client in GOPATH mode; sourced by bootstrap.sh and by the tests.
# GOPATH: .cache/go holds our import path (a symlink to clients/go); /usr/share/gocode holds Debian's Go
# libraries (grpc, protobuf, genproto). No module proxy is used: GO111MODULE=off, GOFLAGS empty.
_GOCLIENT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# LLMSCHED_GO_CACHE moves the cache (a worktree whose .cache is shared with another checkout).
_GOCLIENT_CACHE="${LLMSCHED_GO_CACHE:-$_GOCLIENT_ROOT/.cache}"
export GO111MODULE=off
export GOFLAGS=
export GOPROXY=off
export GOPATH="$_GOCLIENT_CACHE/go:/usr/share/gocode"
export GOCACHE="$_GOCLIENT_CACHE/go-build"
export GOCLIENT_IMPORT=llmsched.dev/client
export GOCLIENT_SRC="$_GOCLIENT_CACHE/go/src/$GOCLIENT_IMPORT"
