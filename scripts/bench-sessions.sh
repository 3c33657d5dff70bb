#!/usr/bin/env bash
# A restart of the broker's durable state: 10,000 persistent sessions holding 100,000 queued QoS 1
# messages (256 B payloads) in the session store, built through the broker core and the store the
# node runs; then the release `edge-node` binary started on it three times: spawn to ready, the
# store's open-and-restore time, RSS once ready (tests/src/bin/session-bench.rs).
# Usage: scripts/bench-sessions.sh [SESSIONS=10000] [MESSAGES=100000] [PAYLOAD=256] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet -p edge-node -p e2e-tests --bin edge-node --bin session-bench
target/release/session-bench "${1:-10000}" "${2:-100000}" "${3:-256}" "${4:-3}"
