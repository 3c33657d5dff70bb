#!/usr/bin/env bash
# Spool commit rate at the spool's API: 1 KiB messages, group commits of BATCH records, normal and
# full durability, median of REPEATS runs each; then the normal spool drained as the uplink reads and
# acks it (rate and CPU per record). Usage: scripts/bench-spool.sh [COUNT=200000] [BATCH=1024] [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-200000}; batch=${2:-1024}; repeats=${3:-3}
cargo build --release --locked --quiet -p e2e-tests --bin spool-bench
for _ in $(seq "$repeats"); do target/release/spool-bench "$count" "$batch"; done | python3 scripts/bench_spool_summary.py
