#!/usr/bin/env bash
# Model sync: time from publish to staged on a real edge-node process (release builds), for a
# whole model and a 5 % fine-tune of it, on loopback and through the UDP relay at 50 ms RTT and
# 1 % loss each way, with the bridge on BBR and on Cubic; against one quinn stream carrying the
# same bytes over the same link with the same endpoint settings.
# Usage: scripts/bench-model-sync.sh [MIB=256] [TIMEOUT_S=300] [LINKS="loopback impaired"] [CCS="bbr cubic"]
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-256}
timeout=${2:-300}
links=${3:-loopback impaired}
ccs=${4:-bbr cubic}
cargo build --release --locked --quiet -p edge-node -p e2e-tests --bin edge-node --bin model-sync-bench
for link in $links; do
  for cc in $ccs; do
    RUST_LOG=${RUST_LOG:-warn} target/release/model-sync-bench "$mib" "$link" "$cc" "$timeout"
  done
done | python3 scripts/model_sync_summary.py
