#!/usr/bin/env bash
# TCO figures on the shared trace: replays ../shared/data/edge-trace-20k.jsonl at its own pace
# (about 40 s) through an edge gateway and its QUIC uplink (trace-replay), then prices the
# trace's classes with the [tco] section of CONFIG (default: the product brief's example,
# config/tco-brief.toml): per class the rate and size from the trace, the compression the uplink
# measured in this run. Usage: scripts/bench-tco.sh [CONFIG] [SPEED=1]
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-config/tco-brief.toml}
speed=${2:-1}
cargo build --release --locked --quiet -p e2e-tests --bin trace-replay
target/release/trace-replay ../shared/data/edge-trace-20k.jsonl --speed "$speed" --tco "$config" 2>/dev/null
