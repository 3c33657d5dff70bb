#!/usr/bin/env bash
# Runs every check and test from a clean checkout, installing what they need when missing:
# formatting, clippy, the advisory check, then all tests (unit, integration, cross-process) with
# real MQTT clients and servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

tools_path="$(scripts/install-test-deps.sh)"
export PATH="$tools_path:$PATH"

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The smallest gateways' edge-node, without the OTLP exporter: it builds clean, and its
# tracer refuses an endpoint (the one test that differs without the feature).
echo "== edge-node without the OTLP exporter"
cargo clippy -p edge-node --no-default-features --all-targets --locked -- -D warnings
cargo test -p shared --no-default-features --features trace --lib --locked --quiet trace::
echo "== advisories"
scripts/audit.sh
echo "== build"
# The cross-process tests run the binaries, so build them before the test binaries.
cargo build --workspace --bins --locked
echo "== aarch64 edge-node for the hardware-in-the-loop smoke tests (hil/)"
# Its own target dir outside the clone, so CI's next run finds it warm.
export CROSS_TARGET_DIR=${CROSS_TARGET_DIR:-$HOME/.cache/edge-hybrid-bridge/cross}
HIL_EDGE_BIN=$(scripts/cross-build.sh aarch64-unknown-linux-gnu hil edge-node)
export HIL_EDGE_BIN
echo "== tests (checks and build took $((SECONDS - started)) s; target dir $(du -sh target | cut -f1), $(df -h --output=avail . | tail -1 | tr -d ' ') free)"
# The test runner's summary stays the last line of the output.
cargo nextest run --workspace --locked --no-fail-fast
