#!/usr/bin/env bash
# `make redis`: install Debian's redis-server when it is missing (idempotent). The cluster tests start their own
# servers on free ports with their own data directories (tests/cluster/redis_server.py), and `make run-cluster`
# one for its three replicas; neither needs the package's system service (on a host with systemd, the package
# starts one on 127.0.0.1:6379; `systemctl disable --now redis-server` stops it).
set -euo pipefail
if command -v redis-server >/dev/null; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "redis-server is missing (run as root, or: sudo apt-get install redis-server)" >&2
  exit 1
fi
echo "installing redis-server"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends redis-server
redis-server --version
