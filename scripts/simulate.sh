#!/usr/bin/env bash
# Long searches with the whole-system simulation (tests/src/sim, docs/ARCHITECTURE.md "The
# simulation"):
#   scripts/simulate.sh SEEDS HOURS [FROM] [ACTIONS]   runs seeds FROM.. (1) until SEEDS ran or
#       HOURS passed, each ACTIONS (400) actions long, and stops at the first that breaks a
#       promise, printing its seed, the violation and the end of its trace
#   scripts/simulate.sh --seed N [ACTIONS] [LINES]     replays seed N, printing LINES (400) of its
#       trace if it fails (a seed replays identically)
# SIM_TRACE_ALL=1 prints every line of the trace to stderr as it is made (two runs to diff).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --quiet -p e2e-tests --bin simulate
bin=target/debug/simulate
if [ "${1:-}" = "--seed" ]; then
  exec "$bin" --seed "${2:?--seed N}" --actions "${3:-400}" --trace "${4:-400}"
fi
exec "$bin" --seeds "${1:-1000}" --hours "${2:-1}" --from "${3:-1}" --actions "${4:-400}"
