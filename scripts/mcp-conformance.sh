#!/usr/bin/env bash
# The official MCP conformance suite (npm package @modelcontextprotocol/conformance) against
# `worldsmith env serve` on the example world (examples/bundles/retail_store).
#
# Installs Node 22 (the npm package `node`) and the suite into .venv/conformance on first use (needs
# npm and the npm registry; cached after), serves the example world on a free loopback port, runs every
# server scenario (pending ones included), and exits non-zero when a scenario fails that
# scripts/mcp-conformance-baseline.yml does not list, or when one it lists passes. The listed scenarios
# do not apply to a worldsmith gateway: docs/testing.md ("MCP conformance") says why, one by one.
# `--install` only installs. MCP_CONFORMANCE_RESULTS=DIR keeps the suite's checks.json per scenario there.
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE_VERSION=0.1.16
NODE_VERSION=22
INSTALL=.venv/conformance
BIN="$INSTALL/node_modules/.bin"
installed() {
    [ -x "$BIN/conformance" ] && [ -x "$BIN/node" ] \
        && grep -q "\"version\": \"$SUITE_VERSION\"" "$INSTALL/node_modules/@modelcontextprotocol/conformance/package.json"
}
if ! installed; then
    command -v npm >/dev/null 2>&1 || { echo "mcp-conformance: needs npm (apt-get install -y npm)" >&2; exit 2; }
    npm install --prefix "$INSTALL" --no-audit --no-fund "node@$NODE_VERSION" \
        "@modelcontextprotocol/conformance@$SUITE_VERSION" >&2
fi
[ "${1:-}" = "--install" ] && exit 0
export PATH="$PWD/$BIN:$PATH" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The project's interpreter (MCP_CONFORMANCE_PYTHON to use another one with worldsmith installed).
PYTHON="${MCP_CONFORMANCE_PYTHON:-.venv/bin/python}"
PORT=$("$PYTHON" -c 'from worldsmith.localserver import free_port; print(free_port())')
RESULTS="${MCP_CONFORMANCE_RESULTS:-$(mktemp -d)}"
LOG=$(mktemp)
WORLDSMITH_SANDBOX_WORKERS="${WORLDSMITH_SANDBOX_WORKERS:-2}" "$PYTHON" -m worldsmith.cli env serve \
    examples/bundles/retail_store --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
cleanup() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    rm -f "$LOG"
    [ -n "${MCP_CONFORMANCE_RESULTS:-}" ] || rm -rf "$RESULTS"
}
trap cleanup EXIT
for _ in $(seq 600); do  # up to a minute for the gateway to answer
    "$PYTHON" -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/healthz').status_code != 200)" \
        2>/dev/null && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$LOG" >&2; echo "mcp-conformance: env serve did not start" >&2; exit 1; }
    sleep 0.1
done
status=0
conformance server --url "http://127.0.0.1:$PORT/envs/retail_store/mcp" --suite all \
    --expected-failures scripts/mcp-conformance-baseline.yml -o "$RESULTS" || status=$?
exit "$status"
