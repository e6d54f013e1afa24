#!/usr/bin/env bash
# Makes the Node client ready on a fresh machine: node and npm (Debian's packages when missing), the npm
# packages of package-lock.json (only the npm registry is needed), then src/gen/ from protos/ and dist/ (tsc).
# Idempotent and quick when nothing changed: `npm ci` runs only when the lock file is newer than node_modules.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -q && apt-get install -y -q nodejs npm
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "clients/node needs Node >= 20 (node --test, AbortSignal, fetch); found $(node --version)" >&2
  exit 1
fi
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
npm run --silent build
