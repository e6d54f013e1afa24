#!/usr/bin/env bash
# Install the pinned `openai` npm package for tests/http/test_node_sdk.py into tests/http/node/node_modules
# (from package-lock.json; idempotent). Needs Node 20+ and npm, as the Node client does.
set -euo pipefail
cd "$(dirname "$0")/../tests/http/node"
command -v npm >/dev/null || { apt-get update -q && apt-get install -y -q nodejs npm; }
if [ ! -f node_modules/.package-lock.json ] || ! cmp -s package-lock.json node_modules/.package-lock.json.src 2>/dev/null; then
  npm ci --no-audit --no-fund --silent
  cp package-lock.json node_modules/.package-lock.json.src
fi
